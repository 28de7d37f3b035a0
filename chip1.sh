source bench/tpu_setup.sh >/dev/null 2>&1; export PYTHONPATH=$PYTHONPATH:$PWD
cd bench
python3 -c "import jax; print(jax.devices())"
timeout 170 python3 bench_intention.py --lstm-decoder --n-envs 4096 --iterations 8 --skip 3 --no-check --precision bfloat16 2>&1 | grep '^{' | tee $OUT/bf16.jsonl
for s in "solver=newton iterations=1 ls_iterations=4" "iterations=2 ls_iterations=2" "solver=newton iterations=1 ls_iterations=2" "solver=newton iterations=2 ls_iterations=4"; do
  timeout 100 python3 bench_rodent.py --n-envs 4096 --steps 10 --label s8-physics --set $s --out $OUT/rodent.jsonl 2>&1 | grep '^{' | cut -c1-400
done
