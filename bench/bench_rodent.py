"""Compile time and speed of the rodent tasks under MJX (issue 36, point 1).

Usage:
    python bench/bench_rodent.py [--task rodent_imitation] [--n-envs 16 64 256] [--steps 20]
                                 [--train] [--cache [DIR]] [--label TEXT] [--set KEY=VALUE ...]
                                 [--profile CALLS]

For each env count, on the env ``nnx_ppo.envs.make(--task)`` returns (the
Playground adapter under its time limit, as training runs it): the seconds
to lower and to compile ``jax.jit(jax.vmap(env.reset))`` and
``jax.jit(jax.vmap(env.step))``, then their steady rates (``--steps`` calls
after a warm-up call; env steps/s, physics steps/s = env steps/s x
substeps). ``--train`` also times ``train_ppo`` for two iterations of a
small MLP on the first env count (rollout 16, 2 epochs x 2 minibatches, no
evaluation): the first iteration's wall time (compiling included) and the
second's. ``--cache`` turns on JAX's persistent compilation cache (default
folder ``~/.cache/nnx_ppo/jax``) first: run twice to see a warm start.
``--set`` overrides the task config (``--set iterations=8 solver=newton``).
``--baselines N`` adds the return and episode length of uniform random and
of zero actions over N episodes (the floor a learning check is read against).
``--profile N`` traces N step calls and N reset calls and charges the
device's time to MJX's parts (solver, position stage with collision and
constraints, velocity, actuation, acceleration, integration) and the
task's own code (``bench/profile_iteration.py``'s analysis).

Prints one JSON row per measurement and appends it to
bench/results/rodent.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

RESULTS = pathlib.Path(__file__).parent / "results" / "rodent.jsonl"


def _emit(row: dict, out: pathlib.Path) -> None:
    print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def _compile(fn, *args) -> tuple[object, float, float]:
    """``(compiled, lower_s, compile_s)`` of ``jax.jit(fn)`` at ``args``."""
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    return compiled, t1 - t0, time.perf_counter() - t1


def _rate(call, state, n: int, calls: int) -> tuple[object, float]:
    """``(last output, items per second)`` of ``calls`` calls chained on ``state`` (after one warm-up).
    Every call is waited for, so that timings never include queued work."""
    state = jax.block_until_ready(call(state))
    t0 = time.perf_counter()
    for _ in range(calls):
        state = jax.block_until_ready(call(state))
    return state, n * calls / (time.perf_counter() - t0)


def _reset_rate(reset, keys, n: int, calls: int) -> float:
    """Resets per second over ``calls`` calls (after one warm-up); blocks on the last output."""
    jax.block_until_ready(reset(keys))
    t0 = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(reset(keys))
    return n * calls / (time.perf_counter() - t0)


# MJX's own name scopes (mujoco/mjx/_src/forward.py), most specific first; the rest is the task's own code
# (observation, reward, termination, the reset's pose) and the adapter's.
PHYSICS_PARTS = (
    ("physics/solver", "step/solve"),
    ("physics/position: kinematics, collision, constraints", "step/fwd_position"),
    ("physics/velocity", "step/fwd_velocity"),
    ("physics/actuation", "step/fwd_actuation"),
    ("physics/acceleration", "step/fwd_acceleration"),
    ("physics/integration", "step/euler"),
    ("physics/other", "step"),
)


def profile_calls(compiled, call, state, calls: int) -> dict:
    """Where ``calls`` calls of a compiled function spend the device's time,
    by MJX's name scopes (:data:`PHYSICS_PARTS`; the analysis of
    ``bench/profile_iteration.py``): ms per call, GFLOP and GB per part."""
    import tempfile

    from profile_iteration import analyze

    folder = tempfile.mkdtemp(prefix="nnx_ppo_rodent_trace_")
    jax.profiler.start_trace(folder)
    for _ in range(calls):
        state = jax.block_until_ready(call(state))
    jax.profiler.stop_trace()
    trace = next(pathlib.Path(folder).rglob("*.xplane.pb"))
    fields, _ = analyze(str(trace), compiled.as_text(), calls, top=6, parts=PHYSICS_PARTS, module_prefix="jit_")
    fields["parts"] = {("task and adapter" if k.startswith("other") else k): v for k, v in fields["parts"].items()}
    return fields


def bench_env(env, n: int, steps: int, base: dict, out: pathlib.Path, profile: int = 0) -> None:
    """Rows for reset and step of ``env`` at ``n`` envs (and with ``profile``,
    where that many calls of each spend their time)."""
    keys = jax.random.split(jax.random.key(0), n)
    reset, lo, co = _compile(jax.vmap(env.reset), keys)
    reset_rate = _reset_rate(reset, keys, n, steps)
    _emit({**base, "what": "reset", "n_envs": n, "lower_s": round(lo, 2), "compile_s": round(co, 2),
           "resets_per_s": round(reset_rate, 1)}, out)
    state = jax.block_until_ready(reset(keys))
    action = jnp.zeros((n, *env.action_space.shape), jnp.float32)
    step, lo, co = _compile(jax.vmap(env.step), state, action)
    _, rate = _rate(lambda s: step(s, action), state, n, steps)
    substeps = env.unwrapped.env.n_substeps
    _emit({**base, "what": "step", "n_envs": n, "lower_s": round(lo, 2), "compile_s": round(co, 2),
           "env_steps_per_s": round(rate, 1), "physics_steps_per_s": round(rate * substeps, 1),
           "substeps": substeps}, out)
    if profile:
        _emit({**base, "what": "step_profile", "n_envs": n, "substeps": substeps,
               **profile_calls(step, lambda s: step(s, action), state, profile)}, out)
        _emit({**base, "what": "reset_profile", "n_envs": n,
               **profile_calls(reset, lambda k: (reset(k), k)[1], keys, profile)}, out)


def bench_train(task: str, n: int, overrides: dict, base: dict, out: pathlib.Path) -> None:
    """A row for two ``train_ppo`` iterations of a small MLP at ``n`` envs."""
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.envs import make

    rollout = 16
    env = make(task, random_initial_steps=True, **overrides)
    config = TrainConfig(ppo=PPOConfig(n_envs=n, rollout_length=rollout, total_steps=2 * n * rollout, n_epochs=2,
                                       n_minibatches=2), eval=EvalConfig(enabled=False))
    times = []
    t0 = time.perf_counter()
    result = train_ppo(env, "mlp", config, log_fn=lambda metrics, steps: times.append(time.perf_counter()))
    first = times[0] - t0
    second = times[1] - times[0] if len(times) > 1 else None
    _emit({**base, "what": "train_iteration", "n_envs": n, "rollout": rollout, "first_iteration_s": round(first, 1),
           "compile_s": round(float(result.compile_seconds), 1) if result.compile_seconds is not None else None,
           "second_iteration_s": None if second is None else round(second, 2),
           "env_steps_per_s": None if second is None else round(n * rollout / second, 1)}, out)


def bench_baselines(env, n: int, base: dict, out: pathlib.Path) -> None:
    """Rows for two policies that learn nothing, on ``n`` fresh episodes of
    the evaluation env (``make(task)``, its time limit included): uniform
    random actions in [-1, 1] and zero actions (what an untrained network's
    deterministic mean, near 0, does). Each row: the mean, std, min and max
    of the episode return and length (an episode ends at its first done)."""
    limit = getattr(env, "max_steps", 1000)  # make() wraps the task in its TimeLimit
    shape = env.action_space.shape

    def episodes(key, random):
        def one(key):
            k_reset, k_act = jax.random.split(key)
            state = env.reset(k_reset)

            def step(carry, k):
                state, ret, length, alive = carry
                action = (jax.random.uniform(k, shape, minval=-1.0, maxval=1.0) if random
                          else jnp.zeros(shape, jnp.float32))
                state = env.step(state, action)
                ret = ret + alive * state.reward
                length = length + alive
                alive = alive * (1.0 - state.done)
                return (state, ret, length, alive), None

            init = (state, jnp.float32(0), jnp.float32(0), jnp.float32(1))
            (_, ret, length, _), _ = jax.lax.scan(step, init, jax.random.split(k_act, limit))
            return ret, length

        return jax.vmap(one)(jax.random.split(key, n))

    for name, random in (("random_actions", True), ("zero_actions", False)):
        t0 = time.perf_counter()
        ret, length = jax.jit(lambda k, random=random: episodes(k, random))(jax.random.key(1))
        ret, length = np.asarray(ret), np.asarray(length)
        _emit({**base, "what": f"baseline_{name}", "episodes": n, "return_mean": round(float(ret.mean()), 2),
               "return_std": round(float(ret.std()), 2), "return_min": round(float(ret.min()), 2),
               "return_max": round(float(ret.max()), 2), "length_mean": round(float(length.mean()), 2),
               "length_std": round(float(length.std()), 2), "length_min": int(length.min()),
               "length_max": int(length.max()), "wall_s": round(time.perf_counter() - t0, 1)}, out)


def _parse_sets(items: list[str]) -> dict:
    overrides = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="rodent_imitation", choices=["rodent_imitation", "rodent_run"])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--no-env", action="store_true", help="skip the reset/step rows")
    parser.add_argument("--baselines", type=int, default=0, metavar="EPISODES",
                        help="also the return and length of random and zero actions over this many episodes")
    parser.add_argument("--cache", nargs="?", const="", default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--set", nargs="*", default=[], dest="sets")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--profile", type=int, default=0, metavar="CALLS",
                        help="also trace this many step and reset calls: device time by MJX's parts")
    args = parser.parse_args(argv)
    overrides = _parse_sets(args.sets)
    if args.cache is not None:
        from nnx_ppo.algorithms.ppo import enable_compilation_cache

        enable_compilation_cache(args.cache or None)
    from nnx_ppo.envs import make

    base = {"task": args.task, "label": args.label, "sets": overrides, "cache": args.cache is not None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "load1": round(os.getloadavg()[0], 2),
            "jax": jax.__version__, "cpus": os.cpu_count()}
    t0 = time.perf_counter()
    env = make(args.task, **overrides)
    base["make_s"] = round(time.perf_counter() - t0, 2)
    if not args.no_env:
        for n in args.n_envs:
            bench_env(env, n, args.steps, base, args.out, args.profile)
    if args.train:
        bench_train(args.task, args.n_envs[0], overrides, base, args.out)
    if args.baselines:
        bench_baselines(env, args.baselines, base, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
