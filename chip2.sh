source bench/tpu_setup.sh >/dev/null 2>&1; export PYTHONPATH=$PYTHONPATH:$PWD
cd bench
for s in "solver=newton iterations=2 ls_iterations=4" "solver=newton iterations=2 ls_iterations=2" "iterations=2 ls_iterations=2"; do
  timeout 170 python3 bench_rodent.py --n-envs 4096 --steps 10 --label s8-physics --set $s --out $OUT/rodent.jsonl 2>&1 | grep '^{' | cut -c1-300
done
