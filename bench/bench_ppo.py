"""Throughput (and learning) of nnx-ppo on the peers' benchmark work.

Usage: python bench/bench_ppo.py ENV ARCH N_ENVS ROLLOUT TOTAL_STEPS [REWARD_SCALE] [ITERS_PER_CALL] [MAKE_KWARGS]

ENV is an nnx_ppo.envs spec ("gymnax:Pendulum-v1", "playground:CartpoleBalance");
ARCH is "mlp" (64-64 actor and critic; for Playground envs 4x64 actor and
2x256 critic, as in the peer script) or "lstm" (Dense(64) -> LSTM(64) for
actor and critic). 4 epochs x 4 minibatches, Adam 3e-4, gamma 0.99,
lambda 0.95, evaluation 4 times per run (64 envs; 32 for Playground). Prints one JSON line:
compile time, steady-state env-steps/s (after the first iterations,
evaluation included, as the peer scripts measure it) and evaluation returns.
MAKE_KWARGS is a JSON object for ``make`` (e.g. '{"impl": "warp"}' for
Playground's MuJoCo Warp backend).
"""

import json
import sys
import time

from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.factories import make_mlp_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.normalizer import Normalizer
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import NormalTanhSampler


def lstm_actor_critic(obs_size, action_size, rngs):
    def trunk():
        return [Dense(obs_size, 64, rngs, activation=nnx.swish), LSTM(64, 64, rngs)]

    return Sequential([
        Normalizer(obs_size),
        PPOAdapter(
            action=Sequential(
                [*trunk(), Dense(64, 2 * action_size, rngs), NormalTanhSampler(rngs, entropy_weight=1e-2)]
            ),
            value=Sequential([*trunk(), Dense(64, 1, rngs)]),
        ),
    ])


def build_network(name, arch, env, rngs):
    """The peers' network for ``arch`` on env spec ``name``: "mlp" is 64-64
    actor and critic (4x64 actor, 2x256 critic for Playground envs, the
    original's README example); "lstm" is Dense(64) -> LSTM(64) for both."""
    obs_size = env.observation_space.shape[0]
    action_size = env.action_space.shape[0]
    if arch == "mlp" and name.startswith("playground:"):
        return make_mlp_actor_critic(obs_size, action_size, (64,) * 4, (256,) * 2, rngs, entropy_weight=1e-2)
    if arch == "mlp":
        return make_mlp_actor_critic(obs_size, action_size, (64, 64), (64, 64), rngs, entropy_weight=1e-2)
    return lstm_actor_critic(obs_size, action_size, rngs)


def main(argv):
    name, arch, n_envs, rollout, total = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    reward_scale = float(argv[5]) if len(argv) > 5 else 1.0
    iters_per_call = int(argv[6]) if len(argv) > 6 else 1
    make_kwargs = json.loads(argv[7]) if len(argv) > 7 else {}
    eval_env = make(name, **make_kwargs)
    env = RewardScale(eval_env, reward_scale) if reward_scale != 1.0 else eval_env
    playground = name.startswith("playground:")
    net = build_network(name, arch, eval_env, nnx.Rngs(0))
    max_len = 200 if name.endswith("Pendulum-v1") else 1000
    config = TrainConfig(
        ppo=PPOConfig(n_envs=n_envs, rollout_length=rollout, total_steps=total, learning_rate=3e-4),
        eval=EvalConfig(every_steps=total // 4, n_envs=32 if playground else 64, max_episode_length=max_len),
        iterations_per_call=iters_per_call,
    )
    times, evals = [], []

    def log_fn(metrics, steps):
        if "eval/episode_return" in metrics:
            evals.append((steps, round(metrics["eval/episode_return"], 1)))
        else:
            times.append((time.perf_counter(), steps))

    t0 = time.perf_counter()
    result = train_ppo(env, net, config, log_fn=log_fn, eval_env=eval_env)
    wall = time.perf_counter() - t0
    (ta, sa), (tb, sb) = times[2 * iters_per_call], times[-1]
    print(json.dumps({
        "lib": "nnx_ppo", "env": name, "make_kwargs": make_kwargs, "arch": arch, "reward_scale": reward_scale,
        "n_envs": n_envs,
        "rollout": rollout, "iterations_per_call": iters_per_call, "wall_s": round(wall, 2),
        "compile_s": round(result.compile_seconds, 2), "steady_sps": round((sb - sa) / (tb - ta)), "evals": evals,
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
