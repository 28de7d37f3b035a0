source bench/tpu_setup.sh >/dev/null 2>&1; export PYTHONPATH=$PYTHONPATH:$PWD
run=/tmp/it2; rm -rf $run
timeout -s INT -k 60 520 python3 -m nnx_ppo.cli train rodent_imitation --seed 0 --run-dir $run \
  --train-env-kwargs '{"iterations": 2, "ls_iterations": 2}' 2>&1 | grep -v Warning | tail -25
cp $run/metrics.jsonl $OUT/it2_seed0_metrics.jsonl
