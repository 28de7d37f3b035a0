#!/usr/bin/env bash
# One script for a machine with an accelerator (a GPU); parts 1-4 take under 5 minutes, part 5 up to 10 more:
#  1. replay exactness of the MLP and LSTM Pendulum networks under the default
#     matmul precision (TF32 on recent NVIDIA GPUs) and under "highest";
#  2. steady throughput of the Pendulum MLP and LSTM work at 256 and 4096 envs;
#  3. 8 seeds in one program against one after another;
#  4. the intention network at the rodent users' size (3.46M parameters) on its
#     stand-in env: MLP decoder at 1024 and 4096 envs x 20, LSTM decoder at 1024;
#  5. the rodent task (needs nnx_ppo[playground,rodent]): the env step at 1024
#     and 4096 envs, and the users' network training on it at 1024 envs x 20.
# Prints JSON lines; copy them into bench/README.md ("Accelerators").
# Usage: bash bench/device_check.sh [PYTHON] [PARTS]   (default .venv/bin/python, all parts "1 2 3 4 5";
#        a machine lent for a few minutes at a time can run "1 2 3" and then "4 5")
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-../.venv/bin/python}
PARTS=" ${2:-1 2 3 4 5} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
export PYTHONPATH="$PWD/..${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import jax; print('devices:', jax.devices())"
part 1 && for arch in mlp lstm; do
  for precision in default highest; do
    timeout 120 "$PY" replay_precision.py "$arch" 256 "$precision" || echo "{\"failed\": \"replay $arch $precision\"}"
  done
done
part 2 && for n_envs in 256 4096; do
  timeout 120 "$PY" bench_ppo.py gymnax:Pendulum-v1 mlp "$n_envs" 32 $((n_envs * 32 * 40)) 0.1 4 \
    || echo "{\"failed\": \"mlp $n_envs\"}"
  timeout 120 "$PY" bench_ppo.py gymnax:Pendulum-v1 lstm "$n_envs" 32 $((n_envs * 32 * 20)) 0.1 4 \
    || echo "{\"failed\": \"lstm $n_envs\"}"
done
part 3 && { timeout 180 "$PY" bench_seeds.py mlp 8 12 || echo '{"failed": "seeds"}'; }
part 4 && for n_envs in 1024 4096; do
  timeout 120 "$PY" bench_intention.py --n-envs "$n_envs" --iterations 4 --mlp-decoder --no-check \
    || echo "{\"failed\": \"intention mlp $n_envs\"}"
done
part 4 && { timeout 120 "$PY" bench_intention.py --n-envs 1024 --iterations 4 --lstm-decoder --no-check \
  || echo '{"failed": "intention lstm 1024"}'; }
part 5 && { timeout 300 "$PY" bench_rodent.py --n-envs 1024 4096 --steps 10 --label device_check --out "${OUT:-/tmp}/rodent.jsonl" \
  || echo '{"failed": "rodent step"}'; }
part 5 && { timeout 300 "$PY" bench_intention.py --env rodent --n-envs 1024 --iterations 4 --skip 2 \
  || echo '{"failed": "intention on the rodent 1024"}'; }
:
