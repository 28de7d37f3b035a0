"""Speed of the intention network at the virtual-rodent users' size, on a cheap stand-in env or the rodent task.

Usage: python bench/bench_intention.py [--env stand_in | --env rodent] [--n-envs 1024] [--rollout 20]
                                       [--iterations 4] [--skip 1] [--mlp-decoder | --lstm-decoder] [--profile]
                                       [--precision default|bfloat16] [--compiler-option NAME=VALUE ...]
       IN_TIME=1 python bench/bench_intention.py ...   (every module replayed one step at a time, as
                                                        bench/replay_precision.py's IN_TIME=1)

The network is ``make_intention_network(**INTENTION_USERS_SIZE)`` (encoder
4 x 512 over the reference -> 60-dim VariationalBottleneck latent -> decoder
4 x 512 over [latent, proprioception], critic 4 x 512; 3,459,781 parameters
with the MLP decoder). The env is a stand-in with the rodent imitation
task's sizes and almost no cost of its own (see :func:`stand_in_reset`):
observation ``{"reference": [640], "proprioception": [300]}``, 38 actions
in [-1, 1]. Training is ``train_ppo`` at the users' batch shape: 1024 envs x
rollout 20, 4 epochs x 4 minibatches, discount 0.97, learning rate 1e-4, no
evaluation. Prints one JSON line: compile seconds (the first, compiling
call, which also runs the first iteration), steady env-steps/s (log_fn
timestamps, after the first ``--skip`` iterations), peak memory
(``ru_maxrss``), the FLOPs of one iteration by the arithmetic estimate below,
this CPU's measured rate of 512-wide float32 matmuls in the same process, and
the fraction of that limit achieved. ``--profile`` also times the rollout
alone (network + env for ``T`` steps, as the trainer runs it) on the trained
state, so the iteration splits into rollout and replay + update.

FLOPs of one iteration (multiply-adds counted as 2): the rollout runs the
actor and the critic once per env step (``2 * params``); each epoch replays
every step and back-propagates (about 3 forwards), for 4 epochs: ``(1 + 3 *
n_epochs) * 2 * params * n_envs * rollout``. Activations, the optimizer and
the env are left out (small next to the products at this width).

``--env rodent``: the real task instead, ``nnx_ppo.envs.make("rodent_imitation")``
(MJX physics, 10 substeps per env step; docs/rodent.md) with its observation
flattened to the stand-in's structure by :func:`flatten_rodent_obs`:
``{"reference": [R], "proprioception": [P]}``, R = 425 (the 5-frame
``imitation_target`` window: root [5, 3], quat [5, 4], joint [5, 45], body
[5, 11, 3]), P = 153; 38 actions. The same network code and PPO settings
(3,089,093 parameters with the MLP decoder at these widths). Episodes end
at a failure (termination) or at the clip's end (truncation, at most 144
steps; ``make``'s ``TimeLimit`` of 150 never binds). ``check_env`` is not
run on it (another compile of the physics). The FLOP estimate counts the
network only, so with the physics' cost on top the fraction of the matmul
limit is lower by construction. The row gets ``"env": "rodent_imitation"``
(``"stand_in"`` otherwise).

The module's top part (the stand-in env's dynamics, the rodent observation's
flattening and the matmul rate) uses JAX only, so
``bench/peers/original_intention.py`` runs the same envs and the same
measurement on the original nnx-ppo 0.3.0 in the peers' venv.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

REFERENCE_FRAMES, FRAME_DIMS = 5, 128  # 5 future reference frames of 128 dims: R = 640
PROPRIOCEPTION = 300                   # P
ACTIONS = 38                           # A
MIN_LIMIT, MAX_LIMIT = 20, 200         # an episode's time limit, drawn at reset
FALL_RATE = 0.01                       # chance per step that the episode terminates (a "fall")

_rng = np.random.RandomState(0)
_FREQ = jnp.asarray(_rng.uniform(0.05, 0.5, FRAME_DIMS), jnp.float32)
_MIX = jnp.asarray(_rng.normal(0.0, 1.0 / np.sqrt(ACTIONS), (ACTIONS, PROPRIOCEPTION - ACTIONS)), jnp.float32)


def _reference(phase: jax.Array, t: jax.Array) -> jax.Array:
    """The next 5 reference frames, flattened: ``sin(freq * (t + k) + phase)``, [640]."""
    steps = t + jnp.arange(1.0, REFERENCE_FRAMES + 1.0)[:, None]
    return jnp.sin(_FREQ * steps + phase).reshape(-1)


def _proprioception(q: jax.Array) -> jax.Array:
    """The body's "sensors": its pose ``q`` [38] and a fixed nonlinear mix of it [262]."""
    return jnp.concatenate([q, jnp.sin(q @ _MIX)])


def stand_in_reset(key: jax.Array) -> tuple[dict, dict]:
    """One env's first observation and state (``data``): a random pose, a
    random phase of the reference clip, and a time limit drawn from
    [MIN_LIMIT, MAX_LIMIT] (so episodes have random lengths)."""
    key, k_q, k_phase, k_limit = jax.random.split(key, 4)
    q = jax.random.uniform(k_q, (ACTIONS,), minval=-0.5, maxval=0.5)
    phase = jax.random.uniform(k_phase, (FRAME_DIMS,), maxval=2 * jnp.pi)
    limit = jax.random.randint(k_limit, (), MIN_LIMIT, MAX_LIMIT + 1).astype(jnp.float32)
    t = jnp.float32(0.0)
    data = {"key": key, "q": q, "phase": phase, "t": t, "limit": limit}
    return {"reference": _reference(phase, t), "proprioception": _proprioception(q)}, data


def stand_in_step(data: dict, action: jax.Array) -> tuple[dict, jax.Array, jax.Array, jax.Array, dict]:
    """One env step: the pose moves toward the action; the reward is
    ``-mean((action - target)^2)`` with the target the next reference frame's
    first 38 dims; the episode terminates with probability FALL_RATE per step
    ("a fall") and is truncated at its time limit. Returns ``(obs, reward,
    done, truncated, data)``, float32 scalars for the three flags/rewards."""
    key, k_fall = jax.random.split(data["key"])
    t = data["t"] + 1.0
    target = _reference(data["phase"], data["t"])[:ACTIONS]
    action = jnp.clip(action, -1.0, 1.0)
    reward = -jnp.mean((action - target) ** 2)
    q = 0.8 * data["q"] + 0.2 * action
    fell = jax.random.uniform(k_fall) < FALL_RATE
    timeout = t >= data["limit"]
    done = jnp.logical_or(fell, timeout).astype(jnp.float32)
    truncated = jnp.logical_and(timeout, jnp.logical_not(fell)).astype(jnp.float32)
    data = {**data, "key": key, "q": q, "t": t}
    obs = {"reference": _reference(data["phase"], t), "proprioception": _proprioception(q)}
    return obs, reward.astype(jnp.float32), done, truncated, data


RODENT_TASK = "rodent_imitation"


def flatten_rodent_obs(obs: dict) -> dict:
    """One env's rodent observation ``{"imitation_target": {...},
    "proprioception": {...}}`` in the stand-in's structure ``{"reference":
    [R], "proprioception": [P]}``: each entry's leaves flattened and
    concatenated in ``jax.tree`` order (sorted keys)."""

    def flat(tree):
        return jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)])

    return {"reference": flat(obs["imitation_target"]), "proprioception": flat(obs["proprioception"])}


def iteration_flops(params: int, n_envs: int, rollout: int, n_epochs: int = 4) -> float:
    """FLOPs of one PPO iteration by the estimate in the module docstring."""
    return (1 + 3 * n_epochs) * 2.0 * params * n_envs * rollout


def matmul_rate(rows: int = 5120, width: int = 512, chain: int = 4, calls: int = 10) -> float:
    """Measured float32 FLOP/s of ``chain`` chained ``[rows, width] @ [width,
    width]`` products in one compiled program (rows: one minibatch of 256
    envs x 20 steps); the best of ``calls`` timed calls after compiling."""
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (rows, width), jnp.float32)
    w = jax.random.normal(kw, (chain, width, width), jnp.float32) / width ** 0.5

    @jax.jit
    def f(x, w):
        for i in range(chain):
            x = x @ w[i]
        return x

    jax.block_until_ready(f(x, w))
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(f(x, w))
        best = min(best, time.perf_counter() - start)
    return 2.0 * rows * width * width * chain / best


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def steady_rate(times: list[tuple[float, int]], skip: int) -> tuple[float, int]:
    """Env-steps/s between the log_fn timestamps after ``skip`` and after the
    last iteration; and how many iterations that spans."""
    (ta, sa), (tb, sb) = times[skip - 1], times[-1]
    return (sb - sa) / (tb - ta), len(times) - skip


COMPILER_SETTINGS = ("JAX_OPTIMIZATION_LEVEL", "JAX_EXEC_TIME_OPTIMIZATION_EFFORT", "JAX_MEMORY_FITTING_LEVEL",
                     "JAX_MEMORY_FITTING_EFFORT", "LIBTPU_INIT_ARGS", "XLA_FLAGS")
"""Environment variables that change how XLA compiles (device_check.sh part 13 sets them)."""


def speed_row(lib: str, args, params: int, build_s: float, compile_s: float, t0: float,
              times: list[tuple[float, int]], wall: float) -> dict:
    """The fields both libraries' rows share: sizes, build and compile time,
    the steady rate (:func:`steady_rate` of the log_fn ``times``), each
    iteration's seconds after the first (``iteration_s``: a second compile
    shows there), peak memory, the iteration's FLOPs against the
    measured matmul rate, and the compiler settings of the environment
    (:data:`COMPILER_SETTINGS`) that are set."""
    per_iteration = args.n_envs * args.rollout
    sps, measured = steady_rate(times, args.skip)
    flops = iteration_flops(params, args.n_envs, args.rollout)
    rate = matmul_rate()
    return {
        "lib": lib, "env": RODENT_TASK if args.env == "rodent" else "stand_in",
        "decoder": args.decoder, "n_envs": args.n_envs, "rollout": args.rollout,
        "parameters": int(params), "build_s": round(build_s, 2), "compile_s": round(compile_s, 2),
        "first_iteration_s": round(times[0][0] - t0, 2),
        "wall_s": round(wall, 2), "steady_sps": round(sps), "iterations_measured": measured,
        "iteration_s": [round(b[0] - a[0], 2) for a, b in zip(times, times[1:])],
        "s_per_iteration": round(per_iteration / sps, 2), "peak_rss_mib": round(peak_rss_mib()),
        "iteration_gflop": round(flops / 1e9), "matmul_gflops": round(rate / 1e9, 1),
        "fraction_of_matmul_limit": round(flops * sps / per_iteration / rate, 3),
        "compiler_settings": {k: os.environ[k] for k in COMPILER_SETTINGS if k in os.environ},
    }


def profile_rollout(row: dict, rollout, state, args, times: list[tuple[float, int]]) -> None:
    """``--profile``: time ``rollout(state, key) -> state`` (one rollout of
    the trained state, as the trainer runs it): its compile, then the best of
    3 calls, and its share of a steady iteration (from the log_fn ``times``), into ``row``. A failure is
    recorded in ``row["profile_error"]``; the training row stands."""
    try:
        key = jax.random.key(1)
        start = time.perf_counter()
        state = jax.block_until_ready(rollout(state, key))
        row["rollout_compile_s"] = round(time.perf_counter() - start, 2)
        seconds = []
        for _ in range(3):
            key, sub = jax.random.split(key)
            start = time.perf_counter()
            state = jax.block_until_ready(rollout(state, sub))
            seconds.append(time.perf_counter() - start)
        row["rollout_s"] = round(min(seconds), 2)
        iteration_seconds = args.n_envs * args.rollout / steady_rate(times, args.skip)[0]
        row["rollout_share"] = round(min(seconds) / iteration_seconds, 3)
        row["peak_rss_mib"] = round(peak_rss_mib())
    except Exception as error:  # noqa: BLE001  (the training row still prints)
        row["profile_error"] = repr(error)[:300]


def print_row(row: dict, load_start: float) -> None:
    """``row`` with the 1-minute load at the start and end and the time, as one JSON line."""
    row["load_1min"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    row["utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(row), flush=True)


def make_env():
    """The stand-in env in this library's API (``RLEnv``, ``EnvState``)."""
    from nnx_ppo.envs import Box, EnvState, RLEnv

    class RodentStandIn(RLEnv):
        """The rodent imitation task's sizes at almost no cost: see stand_in_reset/stand_in_step."""

        observation_space = {"reference": Box((REFERENCE_FRAMES * FRAME_DIMS,)),
                             "proprioception": Box((PROPRIOCEPTION,))}
        action_space = Box((ACTIONS,), -1.0, 1.0)

        def reset(self, key):
            obs, data = stand_in_reset(key)
            zero = jnp.float32(0.0)
            return EnvState(obs=obs, reward=zero, done=zero, info={"truncated": zero}, data=data)

        def step(self, state, action):
            obs, reward, done, truncated, data = stand_in_step(state.data, action)
            return state.replace(obs=obs, reward=reward, done=done, info={"truncated": truncated}, data=data)

    return RodentStandIn()


def make_rodent_env():
    """``make("rodent_imitation")`` (the Playground adapter and its ``TimeLimit``)
    with the observation flattened by :func:`flatten_rodent_obs`."""
    from nnx_ppo.envs import Box, Wrapper, flat_size, make

    class FlatRodentObs(Wrapper):
        """The observation as ``{"reference": [R], "proprioception": [P]}``. The
        inner envs keep their own state in ``data``: they never read it."""

        def __init__(self, env):
            super().__init__(env)
            space = env.observation_space
            self._space = {"reference": Box((flat_size(space["imitation_target"]),)),
                           "proprioception": Box((flat_size(space["proprioception"]),))}

        @property
        def observation_space(self):
            return self._space

        def reset(self, key):
            state = self.env.reset(key)
            return state.replace(obs=flatten_rodent_obs(state.obs))

        def step(self, state, action):
            state = self.env.step(state, action)
            return state.replace(obs=flatten_rodent_obs(state.obs))

    env = FlatRodentObs(make(RODENT_TASK))
    shapes = jax.eval_shape(env.reset, jax.random.key(0)).obs  # traces reset only
    assert {k: v.shape for k, v in shapes.items()} == {k: b.shape for k, b in env.observation_space.items()}
    return env


def name_value(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (``--compiler-option``) as ``(NAME, VALUE)``."""
    name, equals, value = text.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=("stand_in", "rodent"), default="stand_in",
                        help="the stand-in (default) or the rodent imitation task")
    parser.add_argument("--n-envs", type=int, default=1024)
    parser.add_argument("--rollout", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=4, help="iterations in all (the first compiles)")
    parser.add_argument("--skip", type=int, default=1, help="iterations left out of the steady rate")
    decoder = parser.add_mutually_exclusive_group()
    decoder.add_argument("--mlp-decoder", dest="decoder", action="store_const", const="mlp")
    decoder.add_argument("--lstm-decoder", dest="decoder", action="store_const", const="lstm")
    parser.add_argument("--profile", action="store_true", help="also time the rollout alone")
    parser.add_argument("--no-check", action="store_true", help="skip check_env (never run with --env rodent)")
    parser.add_argument("--precision", choices=("default", "bfloat16"), default="default",
                        help="PPOConfig.precision (bfloat16 matrix inputs, float32 sums)")
    parser.add_argument("--replay-unroll", type=int, default=None,
                        help="PPOConfig.replay_unroll (default: the whole rollout on an accelerator, 1 on a CPU)")
    parser.add_argument("--compiler-option", action="append", default=[], metavar="NAME=VALUE", type=name_value,
                        help="TrainConfig.compiler_options for the run's programs (repeatable), e.g. "
                             "xla_tpu_scoped_vmem_limit_kib=8192")
    parser.set_defaults(decoder="mlp")
    args = parser.parse_args(argv)
    in_time = os.environ.get("IN_TIME") == "1"
    if in_time:  # replay_precision.py's experiment: every module replayed one step at a time
        from replay_precision import replay_every_module_in_time

        replay_every_module_in_time()

    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.functional import NetworkFn
    from nnx_ppo.algorithms.ppo import collect_rollout
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.networks.factories import INTENTION_USERS_SIZE, count_parameters, make_intention_network
    from nnx_ppo.testing import check_env

    env = make_rodent_env() if args.env == "rodent" else make_env()
    if args.env == "stand_in" and not args.no_check:
        report = check_env(env, n_envs=8, n_steps=64)
        assert report.truncated.sum() > 0 and (report.done > report.truncated).sum() > 0, "no truncation or fall"
    t_build = time.perf_counter()
    net = make_intention_network(env, nnx.Rngs(0), decoder=args.decoder, **INTENTION_USERS_SIZE)
    build_s = time.perf_counter() - t_build
    params = count_parameters(net)
    per_iteration = args.n_envs * args.rollout
    config = TrainConfig(
        ppo=PPOConfig(n_envs=args.n_envs, rollout_length=args.rollout, total_steps=args.iterations * per_iteration,
                      n_epochs=4, n_minibatches=4, discounting_factor=0.97, learning_rate=1e-4,
                      precision=args.precision, replay_unroll=args.replay_unroll),
        eval=EvalConfig(enabled=False),
        compiler_options=dict(args.compiler_option) or None,
    )
    times: list[tuple[float, int]] = []
    replay_errors: list[float] = []

    def log_fn(metrics, steps):
        times.append((time.perf_counter(), steps))
        if "replay/max_error" in metrics:
            replay_errors.append(float(metrics["replay/max_error"]))

    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = train_ppo(env, net, config, log_fn=log_fn)
    wall = time.perf_counter() - t0
    row = speed_row("nnx_ppo", args, params, build_s, result.compile_seconds, t0, times, wall)
    row["replay_max_error"] = max(replay_errors) if replay_errors else None
    row["precision"] = args.precision
    row["replay_unroll"] = config.ppo.scan_unroll(jax.default_backend())
    row["compiler_options"] = config.compiler_options
    row["in_time"] = in_time
    if args.profile:
        fn = NetworkFn.of(net, deterministic=False)

        @jax.jit
        def rollout_only(params, rest, state, key):
            return collect_rollout(env, NetworkFn(fn.graphdef, params, rest), state, key, args.rollout, True).state

        profile_rollout(row, lambda state, key: rollout_only(fn.params, fn.rest, state, key), result.state.rollout,
                        args, times)
    print_row(row, load_start)


if __name__ == "__main__":
    main(sys.argv[1:])
