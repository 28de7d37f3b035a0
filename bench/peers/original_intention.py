"""bench/bench_intention.py's work on the original nnx-ppo 0.3.0 (PyPI), for a side-by-side speed figure.

Runs in the peers' venv (../shared/peers/setup.sh creates /tmp/peers-venv):

    /tmp/peers-venv/bin/python bench/peers/original_intention.py [--env stand_in | --env rodent]
        [--n-envs 1024] [--rollout 20] [--iterations 4] [--skip 1] [--mlp-decoder | --lstm-decoder] [--profile]
    /tmp/peers-venv/bin/python bench/peers/original_intention.py --env rodent --learn 1000000 --size cpu \
        --n-envs 64 --seed S --out runs/original_rodent/seedS     (the learning side by side: learn())

The same stand-in env (its dynamics are imported from bench_intention.py,
which uses JAX only at import), wrapped in the original's env protocol
(``reset(key)`` / ``step(state, action)`` returning a state with ``obs``,
``reward``, ``done``, ``info``, ``metrics``), and the same intention network
built from the original's own modules: Normalizer -> PPOAdapter(action =
Filter -> Concat(intention = Flattener, 4 x 512 swish MLP, Dense(120),
VariationalBottleneck(60, kl 1e-3); proprioception = Flattener) -> 4 x 512
swish MLP (or 4 stacked LSTM(512)) -> Dense(76) -> NormalTanhSampler(1e-3,
min_std 1e-2); value = Flattener -> 4 x 512 swish MLP -> Dense(1)). The
parameter count is printed and equals this project's (3,459,781 with the MLP
decoder). Differences that remain are the libraries' own: the original's
sampler and bottleneck draw from ``nnx.Rngs`` streams, its loss replay and
GAE are its own; initializers differ (no effect on speed). PPO: 4 epochs x 4
minibatches, discount 0.97, learning rate 1e-4, gradient clipping 0.5 and
critic weight 0.5 (this project's defaults, set here so both do the same
optimizer work), no evaluation (the original evaluates at step 0 otherwise).

Prints one JSON line with the fields of bench_intention.py's; ``compile_s``
here is the wall time from ``train_ppo``'s start to the first iteration's
log (the original reports no compile time), the same span as
bench_intention.py's ``first_iteration_s``.

``--env rodent``: this project's rodent imitation task
(``nnx_ppo/envs/rodent/tasks.py``, ``RodentImitation``, a MuJoCo
Playground ``MjxEnv``: the original takes it in its own protocol as it is).
In this venv ``nnx_ppo`` is the original package, which has no
``nnx_ppo.envs``; :func:`import_rodent_imitation` puts two empty package
modules, ``nnx_ppo.envs`` and ``nnx_ppo.envs.rodent``, whose ``__path__``
is this checkout's folders, into ``sys.modules``, so the rodent modules
(which import only each other, JAX, MuJoCo/MJX and Playground) load from
this checkout without this project's package ``__init__`` files. It needs
``dm-control`` in this venv (only its ``rodent.xml`` is read): ``pip
install "dm-control==1.0.52"``. The same body, the same clips (the same
cache file) and the same config as ``make("rodent_imitation")``, and the
same observation flattening (``bench_intention.flatten_rodent_obs``) in a
thin wrapper (:class:`RodentImitationOriginal`): R = 425, P = 153, 38
actions, 3,089,093 parameters with the MLP decoder, as in
bench_intention.py. Episode ends: the task's own, ``done`` at a failure or
at the clip's end with ``info["truncated"] = 1`` there (the original's
rollout reads that flag). No episode wrapper: this project's ``make`` adds
a ``TimeLimit`` of 150 steps, which never binds (an episode lasts at most
144 steps), while the original's ``EpisodeWrapper`` would start each
episode's counter at a random step in [0, 75) and so cut episodes shorter
than this project's; without it both see the same episode ends. What the
two still do differently with them is each library's own: at a truncation
this project runs the network once more on the final observation for the
bootstrap value, the original sets that step's advantage to 0; the
original resets all envs (a vmapped ``reset``) on every step and selects,
this project resets only on steps where some env ended. ``state.data`` of
this project's adapter also carries the Playground state's own (dict)
observation next to the flattened one; the original's state is the
Playground state with the flattened observation in place of the dict.

The original compiles its training step twice on the rodent (not on the
stand-in): the initial env states (an eager ``vmap`` of ``reset``) are
partly committed to the CPU device (derived from ``mjx.put_model``'s
arrays) and the network's parameters are not, so the first call's
argument shardings differ from those of every later call (all committed
jit outputs): the second iteration's time (``iteration_s[0]``) includes a
second full compile (JAX_LOG_COMPILES=1 shows it; seen with 4 envs:
86 s, then 91 s). Measure the rodent with ``--iterations 5 --skip 2`` so
the steady rate starts after it (on both sides, for the same span).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_intention import (  # noqa: E402  (JAX only: no project import)
    ACTIONS,
    FRAME_DIMS,
    PROPRIOCEPTION,
    REFERENCE_FRAMES,
    flatten_rodent_obs,
    print_row,
    profile_rollout,
    speed_row,
    stand_in_reset,
    stand_in_step,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StandInState:
    """The env state the original's trainer reads (``obs``, ``reward``, ``done``, ``info``, ``metrics``)."""

    obs: Any
    reward: Any
    done: Any
    info: dict
    metrics: dict
    data: Any

    def replace(self, **changes) -> "StandInState":
        return dataclasses.replace(self, **changes)


class RodentStandInOriginal:
    """The stand-in env in the original's protocol (MuJoCo Playground's shape of API)."""

    observation_size = {"reference": REFERENCE_FRAMES * FRAME_DIMS, "proprioception": PROPRIOCEPTION}
    action_size = ACTIONS

    def reset(self, key):
        obs, data = stand_in_reset(key)
        zero = jnp.float32(0.0)
        return StandInState(obs=obs, reward=zero, done=zero, info={"truncated": zero}, metrics={}, data=data)

    def step(self, state, action):
        obs, reward, done, truncated, data = stand_in_step(state.data, action)
        return state.replace(obs=obs, reward=reward, done=done, info={"truncated": truncated}, data=data)


REPO = Path(__file__).resolve().parents[2]


def import_rodent_imitation():
    """This checkout's ``RodentImitation`` class, loaded under the original
    ``nnx_ppo`` package by way of two stub package modules (module docstring)."""
    import importlib.util
    import types

    import nnx_ppo

    if "nnx_ppo.envs" not in sys.modules:
        if importlib.util.find_spec("nnx_ppo.envs") is not None:
            raise RuntimeError(f"this nnx_ppo ({nnx_ppo.__file__}) has its own nnx_ppo.envs: not the original's venv?")
        for name, folder in (("nnx_ppo.envs", REPO / "nnx_ppo" / "envs"),
                             ("nnx_ppo.envs.rodent", REPO / "nnx_ppo" / "envs" / "rodent")):
            stub = types.ModuleType(name)
            stub.__path__ = [str(folder)]
            stub.__package__ = name
            sys.modules[name] = stub
    from nnx_ppo.envs.rodent.tasks import RodentImitation

    return RodentImitation


class RodentImitationOriginal:
    """This project's rodent imitation task (a Playground ``MjxEnv``: the
    original's protocol already), its observation flattened by
    ``flatten_rodent_obs``. The task never reads ``state.obs`` in ``step``."""

    def __init__(self):
        self.env = import_rodent_imitation()()
        shapes = jax.eval_shape(self.reset, jax.random.key(0)).obs
        self.observation_size = {k: int(v.shape[0]) for k, v in shapes.items()}
        self.action_size = int(self.env.action_size)

    def reset(self, key):
        state = self.env.reset(key)
        return state.replace(obs=flatten_rodent_obs(state.obs))

    def step(self, state, action):
        state = self.env.step(state, action)
        return state.replace(obs=flatten_rodent_obs(state.obs))


# make_intention_network's two sizes (nnx_ppo.networks.factories INTENTION_USERS_SIZE and INTENTION_CPU_SIZE):
# encoder widths, latent size, decoder widths, critic widths
SIZES = {"users": ((512,) * 4, 60, (512,) * 4, (512,) * 4), "cpu": ((64, 64), 16, (64, 64), (64, 64))}


def build_network(decoder: str, rngs, R: int = REFERENCE_FRAMES * FRAME_DIMS, P: int = PROPRIOCEPTION,
                  A: int = ACTIONS, size: str = "users"):
    """The intention network at ``size`` (:data:`SIZES`), from the original's
    modules, for ``R`` reference and ``P`` proprioception dims and ``A`` actions."""
    from flax import nnx

    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Concat, Sequential
    from nnx_ppo.networks.factories import make_mlp_layers
    from nnx_ppo.networks.feedforward import Dense
    from nnx_ppo.networks.normalizer import Normalizer
    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.sampling_layers import NormalTanhSampler
    from nnx_ppo.networks.utils import Filter, Flattener
    from nnx_ppo.networks.variational import VariationalBottleneck

    encoder_sizes, L, decoder_sizes, critic_sizes = SIZES[size]
    act = nnx.swish
    encoder = Sequential([
        Flattener(),
        *make_mlp_layers([R, *encoder_sizes], rngs, act),
        Dense(encoder_sizes[-1], 2 * L, rngs),
        VariationalBottleneck(L, rngs, kl_weight=1e-3),
    ])
    if decoder == "mlp":
        decoder_layers = make_mlp_layers([L + P, *decoder_sizes], rngs, act)
    else:
        decoder_layers = [LSTM(n_in, n_out, rngs) for n_in, n_out in zip((L + P, *decoder_sizes), decoder_sizes)]
    action = Sequential([
        Filter({"intention": "reference", "proprioception": "proprioception"}),
        Concat(intention=encoder, proprioception=Flattener()),
        *decoder_layers,
        Dense(decoder_sizes[-1], 2 * A, rngs),
        NormalTanhSampler(rngs, entropy_weight=1e-3, min_std=1e-2),
    ])
    value = Sequential([Flattener(), *make_mlp_layers([R + P, *critic_sizes], rngs, act),
                        Dense(critic_sizes[-1], 1, rngs)])
    return Sequential([Normalizer({"reference": R, "proprioception": P}), PPOAdapter(action=action, value=value)])


def learn(args) -> None:
    """``--learn STEPS``: the rodent CPU preset's training on the original
    (``nnx-ppo train rodent_imitation``'s settings in nnx_ppo/presets.py:
    ``--n-envs 64 --rollout 20 --size cpu``, 4 epochs x 4 minibatches,
    discount 0.95, Adam 3e-4, gradient clipping 0.5, critic weight 0.5; an
    evaluation of 32 deterministic episodes of at most 150 steps every 100k
    env steps) on :class:`RodentImitationOriginal`. Writes one row per
    evaluation to ``OUT/metrics.jsonl`` (``env_steps``, ``wall_s``,
    ``eval/episode_return``, ``eval/episode_length``: the original's mean
    episode reward and lifespan, which leaves out an episode's last step),
    which bench/rodent_learning.py draws beside this library's runs."""
    from flax import nnx

    from nnx_ppo.algorithms import ppo  # the original package, in the peers' venv
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig

    env = RodentImitationOriginal()
    sizes = env.observation_size
    net = build_network(args.decoder, nnx.Rngs(args.seed), sizes["reference"], sizes["proprioception"],
                        env.action_size, size=args.size)
    config = TrainConfig(
        ppo=PPOConfig(n_envs=args.n_envs, rollout_length=args.rollout, total_steps=args.learn, n_epochs=4,
                      n_minibatches=4, discounting_factor=0.95, learning_rate=3e-4, gradient_clipping=0.5,
                      critic_loss_weight=0.5),
        eval=EvalConfig(enabled=True, every_steps=100_000, n_envs=32, max_episode_length=150,
                        logging_percentiles=None),
        seed=args.seed,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(args.out / "metrics.jsonl", "w") as rows:
        def log_fn(metrics, steps):
            if "eval/episode_reward/mean" in metrics:
                rows.write(json.dumps({"env_steps": int(steps), "wall_s": round(time.perf_counter() - t0, 1),
                                       "eval/episode_return": float(metrics["eval/episode_reward/mean"]),
                                       "eval/episode_length": float(metrics["eval/lifespan/mean"])}) + "\n")
                rows.flush()

        ppo.train_ppo(env, net, config, log_fn=log_fn)


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
    parser.add_argument("--learn", type=int, default=None, metavar="STEPS",
                        help="train the rodent for STEPS env steps with evaluations instead (see learn())")
    parser.add_argument("--size", choices=tuple(SIZES), default="users", help="the network's size")
    parser.add_argument("--seed", type=int, default=0, help="with --learn: the run's seed")
    parser.add_argument("--out", type=Path, default=Path("runs/original_rodent"), help="with --learn: a folder")
    parser.set_defaults(decoder="mlp")
    args = parser.parse_args(argv)
    if args.learn is not None:
        return learn(args)

    from flax import nnx

    from nnx_ppo.algorithms import ppo, rollout  # the original package, in the peers' venv
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig

    env = RodentImitationOriginal() if args.env == "rodent" else RodentStandInOriginal()
    sizes = env.observation_size
    t_build = time.perf_counter()
    net = build_network(args.decoder, nnx.Rngs(0), sizes["reference"], sizes["proprioception"], env.action_size)
    build_s = time.perf_counter() - t_build
    params = sum(x.size for x in jax.tree.leaves(nnx.state(net, nnx.Param)))
    per_iteration = args.n_envs * args.rollout
    config = TrainConfig(
        ppo=PPOConfig(n_envs=args.n_envs, rollout_length=args.rollout, total_steps=args.iterations * per_iteration,
                      n_epochs=4, n_minibatches=4, discounting_factor=0.97, learning_rate=1e-4,
                      gradient_clipping=0.5, critic_loss_weight=0.5),
        eval=EvalConfig(enabled=False),
        seed=0,
    )
    times: list[tuple[float, int]] = []

    def log_fn(metrics, steps):
        times.append((time.perf_counter(), steps))

    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = ppo.train_ppo(env, net, config, log_fn=log_fn)
    wall = time.perf_counter() - t0
    # The original reports no compile time of its own: its first iteration's (compile included).
    row = speed_row("nnx-ppo-0.3.0", args, params, build_s, times[0][0] - t0, t0, times, wall)
    if args.profile:
        state = result.training_state
        unroll = nnx.jit(rollout.unroll_env, static_argnums=(0, 4))

        def one_rollout(carry, key):
            net_state, env_states = carry
            out = unroll(env, env_states, state.networks, net_state, args.rollout, key)
            return out[0], out[1]

        profile_rollout(row, one_rollout, (state.network_states, state.env_states), args, times)
    print_row(row, load_start)


if __name__ == "__main__":
    main(sys.argv[1:])
