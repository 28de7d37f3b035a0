#!/usr/bin/env bash
# One script for a machine with an accelerator (a GPU or a TPU); each part fits in a 10-minute call:
#  1. replay exactness of the MLP and LSTM Pendulum networks under the default
#     matmul precision (TF32 on recent NVIDIA GPUs), under "highest" and with
#     PPOConfig.precision="bfloat16";
#  2. steady throughput of the Pendulum MLP and LSTM work at 256 and 4096 envs;
#  3. 8 seeds in one program against one after another;
#  4. the intention network at the rodent users' size (3.46M parameters) on its
#     stand-in env: MLP decoder at 1024 and 4096 envs x 20, LSTM decoder at 1024;
#  5. the rodent task (needs nnx_ppo[playground,rodent]): the env step at 1024
#     and 4096 envs, and the users' network training on it at 1024 envs x 20;
#  6. where one iteration's time goes (bench/profile_iteration.py), for the intention
#     network's configurations $CONFIGS (default: MLP and LSTM decoder at 1024 and 4096 envs); each
#     profile's per-operation table and HLO (about 0.8 MB) in $OUT/profiles/, for
#     `profile_iteration.py ops TABLE HLO PART` on any machine afterwards;
#  7. the same configurations side by side with the original nnx-ppo 0.3.0
#     (bench/peers/original_intention.py; PYTHONPATH for it in $ORIG_PYTHONPATH), one
#     process at a time, ours then the original's, for each configuration; with $COMPILER_OPTIONS
#     ('|'-separated NAME=VALUE, default none; e.g. "xla_tpu_scoped_vmem_limit_kib=4096|xla_tpu_scoped_vmem_limit_kib=8192",
#     bench/README.md, "Sixteenth sitting"), ours also under each option (TrainConfig.compiler_options, the run's
#     programs: bench_intention.py --compiler-option) before the original's; DEFAULT_TOO=0 leaves out ours under
#     XLA's defaults (so that three configurations with one option fit a call);
#  8. ours again with PPOConfig.precision="bfloat16", each configuration;
#  9. the rodent's physics at 4096 envs: the step rate under each physics setting of $PHYSICS (default: sim_dt=0.005
#     and sim_dt=0.01, 4 and 2 substeps per action, 63.2k and 111.7k env-steps/s in the fourteenth sitting; the other
#     settings' rows, substeps, solver and line-search iterations, the body's floor contacts, are in
#     results/rodent.jsonl), then where a step's and a reset's device time goes (bench_rodent.py --profile). About
#     2.5 minutes a setting (75-80 s of it the compile) and 5 for the profile.
#     Whether the body still tracks under a setting is a CPU check (bench/README, "Fourth" to "Thirteenth sitting");
# 10. the users' rodent preset (make_users_intention_network, 1024 envs x 20) trained through the CLI
#     for $RODENT_SECONDS (default 420) and stopped with Ctrl-C (SIGINT: the run saves and ends),
#     its metrics.jsonl copied to $OUT. The run directory ($RODENT_RUN, default runs/rodent-users-chip)
#     stays on the machine while it is held, and the next call's part 10 resumes it (nnx-ppo resume),
#     so a sitting's calls make one curve. It cannot be carried to the next sitting whole: its newest
#     checkpoint alone is about 60 MB (parameters and Adam state of 3.5M parameters, 1024 MJX env
#     states), next to the 35 MB of wheels a bare machine needs, and a call carries 64 MiB in all.
#     So it goes in pieces (bench/run_pieces.sh): RODENT_PIECES=0 packs the run after the call's training
#     and brings back its first 4 pieces of 15 MiB in $OUT/rodent-run/; RODENT_PIECES=4 RODENT_SECONDS=0
#     the next 4, and so on. In a later sitting, carry the pieces in .run-pieces/ (ignored by git; name
#     each file in `carry`, as many as fit beside the wheels: part 10 gathers them in /tmp across calls
#     and trains only once the run is whole, then resumes it).
# 11. one layer of the LSTM decoder's recurrence alone (bench/recurrence_bound.py): the rate of its
#     step-after-step products at the replay's minibatch and the rollout's batch, and what one iteration
#     of the LSTM decoder at 1024 and 4096 envs would need if its layers ran their steps one after another
#     (not a floor: on a TPU v5e the library's replay is faster; bench/README.md, "Ninth sitting"), and the
#     decoder's 4 layers stacked, to see whether they run faster together than one layer alone.
# 12. where the first call's compile time goes on the host (bench/compile_profile.py: a jax.profiler trace of
#     a 2-iteration run, its events by self time: XLA's compiler passes, JAX's tracing and lowering), ours
#     (bench_intention.py) then the original's (peers/original_intention.py), for each of $CONFIGS; rows in
#     $OUT/compile_profile.jsonl.
# 13. the LSTM decoder's training program at 1024 envs compiled in parts and under other compiler settings: its first
#     call with the replay rolled (replay_unroll=1), then rolled and without the truncation bootstrap and the replay
#     guard (profile_iteration.py --set; the rollout alone is part 12's or bench_intention.py --profile's), then the
#     whole run under each setting of $COMPILE_SETTINGS ('|'-separated environment variables for JAX or the TPU
#     runtime; bench_intention.py's rows name them in "compiler_settings"). A process takes about 110 s (build 13 s,
#     compile 75 s), so each has 240 s. A setting under which XLA compiles the rollout's and the replay's steps
#     differently is stopped by the replay guard (a {"failed": ...} row; bench/README.md, "Twelfth sitting").
# Prints JSON lines and appends them to $OUT/device_check.jsonl (or /tmp); copy them into
# bench/results/ and bench/README.md ("Accelerators"). What the scripts print on stderr goes to
# $OUT/device_check.stderr, so that a {"failed": ...} row comes back with its reason.
# Usage: bash bench/device_check.sh [PYTHON] [PARTS]   (default .venv/bin/python, parts "1 2 3 4 5 6 7 8 9 11 12 13";
# part 10 only when named)
# On a bare TPU machine: source bench/tpu_setup.sh first (it installs what is needed and sets
# PYTHONPATH and ORIG_PYTHONPATH), then: bash bench/device_check.sh python3 "6"
set -euo pipefail
cd "$(dirname "$0")"
PY=${1:-../.venv/bin/python}
PARTS=" ${2:-1 2 3 4 5 6 7 8 9 11 12 13} "
CONFIGS=${CONFIGS:-mlp:1024 mlp:4096 lstm:1024 lstm:4096}
COMPILE_SETTINGS=${COMPILE_SETTINGS:-"JAX_MEMORY_FITTING_LEVEL=O0|LIBTPU_INIT_ARGS=--xla_tpu_enable_latency_hiding_scheduler=false|LIBTPU_INIT_ARGS=--xla_latency_hiding_scheduler_rerun=0"}
PHYSICS=${PHYSICS:-"sim_dt=0.005|sim_dt=0.01"}
COMPILER_OPTIONS=${COMPILER_OPTIONS:-}
DEFAULT_TOO=${DEFAULT_TOO:-1}
ROWS="${OUT:-/tmp}/device_check.jsonl"
ERRS="${OUT:-/tmp}/device_check.stderr"  # the scripts' warnings and errors, to tell why a part failed
mkdir -p "${OUT:-/tmp}"
part() { [[ "$PARTS" == *" $1 "* ]]; }
rows() { grep --line-buffered '^{' | tee -a "$ROWS"; }
export PYTHONPATH="$PWD/..${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import jax; print('devices:', jax.devices())"
part 1 && for arch in mlp lstm; do
  for precision in default highest bfloat16; do
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
part 6 && for config in $CONFIGS; do
  timeout 240 "$PY" profile_iteration.py --decoder "${config%:*}" --n-envs "${config#*:}" --skip 2 --iterations 3 \
    --out "${OUT:-/tmp}/profiles" 2>>"$ERRS" | rows || echo "{\"failed\": \"profile $config\"}"
done
part 7 && for config in $CONFIGS; do
  decoder="--${config%:*}-decoder --n-envs ${config#*:} --iterations 8 --skip 3"
  [ "$DEFAULT_TOO" = 0 ] || timeout 150 "$PY" bench_intention.py $decoder --no-check 2>>"$ERRS" | rows \
    || echo "{\"failed\": \"ours $config\"}"
  IFS='|' read -ra options <<< "$COMPILER_OPTIONS"; for option in "${options[@]}"; do
    timeout 150 "$PY" bench_intention.py $decoder --no-check --compiler-option "$option" 2>>"$ERRS" | rows \
      || echo "{\"failed\": \"ours $config $option\"}"
  done
  PYTHONPATH="${ORIG_PYTHONPATH:?source bench/tpu_setup.sh, or set ORIG_PYTHONPATH to the original nnx-ppo}" \
    timeout 150 "$PY" peers/original_intention.py $decoder 2>>"$ERRS" | rows || echo "{\"failed\": \"original $config\"}"
done
part 8 && for config in $CONFIGS; do
  timeout 150 "$PY" bench_intention.py --${config%:*}-decoder --n-envs ${config#*:} --iterations 8 --skip 3 --no-check \
    --precision bfloat16 2>>"$ERRS" | rows || echo "{\"failed\": \"ours bfloat16 $config\"}"
done
part 10 && { run=${RODENT_RUN:-../runs/rodent-users-chip}  # ignored by git: a warm machine keeps it between calls
  pending=  # a run from an earlier sitting whose pieces have not all come yet
  if [ ! -e "$run" ] && ls ../.run-pieces/run.tar.part-* >/dev/null 2>&1; then
    bash run_pieces.sh gather ../.run-pieces /tmp/rodent-run-in "$run"; [ -e "$run" ] || pending=1; fi
  if [ -z "$pending" ] && [ "${RODENT_SECONDS:-420}" -gt 0 ]; then
    if [ -f "$run/config.json" ]; then what=(resume "$run"); else
      what=(train rodent_imitation --network nnx_ppo.networks.factories:make_users_intention_network --run-dir "$run"); fi
    timeout -s INT -k 120 "${RODENT_SECONDS:-420}" "$PY" -m nnx_ppo.cli "${what[@]}" || true
    cp "$run/metrics.jsonl" "${OUT:-/tmp}/rodent_users_metrics.jsonl" 2>/dev/null \
      || echo '{"failed": "rodent users preset"}'; fi
  if [ -n "${RODENT_PIECES:-}" ]; then  # the run goes back in pieces, 4 a call: RODENT_PIECES=0, then 4, ...
    [ "$RODENT_PIECES" -eq 0 ] && bash run_pieces.sh pack "$run" /tmp/rodent-run-out
    bash run_pieces.sh take /tmp/rodent-run-out "${OUT:-/tmp}/rodent-run" "$RODENT_PIECES" 4; fi; }
part 9 && { IFS='|' read -ra settings <<< "$PHYSICS"; for setting in "${settings[@]}"; do
  timeout 240 "$PY" bench_rodent.py --n-envs 4096 --steps 10 --label device_check --set $setting \
    --out "${OUT:-/tmp}/rodent.jsonl" 2>>"$ERRS" | rows || echo "{\"failed\": \"rodent $setting\"}"
done; }
part 9 && { timeout 300 "$PY" bench_rodent.py --n-envs 4096 --steps 10 --profile 3 --label device_check \
  --out "${OUT:-/tmp}/rodent.jsonl" 2>>"$ERRS" | rows || echo '{"failed": "rodent profile"}'; }
# 5630 and 22519: the LSTM decoder's iteration_gflop at 1024 and 4096 envs (bench_intention.py's rows; XLA's count)
part 11 && { timeout 480 "$PY" recurrence_bound.py --n-envs 1024 4096 --iteration-gflop 5630 22519 --stacked 2>>"$ERRS" \
  | rows \
  || echo '{"failed": "recurrence bound"}'; }
part 12 && for config in $CONFIGS; do
  decoder="--${config%:*}-decoder --n-envs ${config#*:} --iterations 2 --skip 1"
  timeout 240 "$PY" compile_profile.py --out "${OUT:-/tmp}/compile_profile.jsonl" -- bench_intention.py $decoder \
    --no-check >/dev/null 2>>"$ERRS" || echo "{\"failed\": \"compile profile, ours, $config\"}"
  PYTHONPATH="${ORIG_PYTHONPATH:?source bench/tpu_setup.sh, or set ORIG_PYTHONPATH to the original nnx-ppo}" \
    timeout 240 "$PY" compile_profile.py --out "${OUT:-/tmp}/compile_profile.jsonl" -- peers/original_intention.py \
    $decoder >/dev/null 2>>"$ERRS" || echo "{\"failed\": \"compile profile, original, $config\"}"
done
part 13 && { split="profile_iteration.py --decoder lstm --n-envs 1024 --skip 1 --iterations 1 --set replay_unroll=1"
  timeout 240 "$PY" $split 2>>"$ERRS" | rows || echo '{"failed": "compile split, rolled"}'
  timeout 240 "$PY" $split --set bootstrap_on_truncation=false --set replay_tolerance=null 2>>"$ERRS" | rows \
    || echo '{"failed": "compile split, rolled, no bootstrap or guard"}'
  IFS='|' read -ra settings <<< "$COMPILE_SETTINGS"; for setting in "${settings[@]}"; do
    env $setting timeout 240 "$PY" bench_intention.py --lstm-decoder --no-check --iterations 5 --skip 2 2>>"$ERRS" \
      | rows || echo "{\"failed\": \"compile setting $setting\"}"
  done; }
:
