"""One run of the original nnx-ppo 0.3.0 (PyPI) on a learning_curves.py task.

Runs in the peers' venv (../shared/peers/setup.sh); prints one JSON line with
the evaluations as [env_steps, return, wall seconds since the start].
Usage: python original_run.py TASK_JSON SEED
"""
import json
import sys
import time
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2].parent / "shared" / "peers"
sys.path.insert(0, str(PEERS))

from flax import nnx  # noqa: E402

from nnx_ppo.algorithms import ppo  # noqa: E402  (the original package, in the peers' venv)
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig  # noqa: E402
from nnx_ppo.networks.factories import make_mlp_actor_critic  # noqa: E402

task, seed = json.loads(sys.argv[1]), int(sys.argv[2])
kind, name = task["env"].split(":", 1)
rngs = nnx.Rngs(seed)
if kind == "gymnax":
    from gymnax_env import GymnaxEnv

    eval_env = GymnaxEnv(name, action_scale=2.0 if name.startswith("Pendulum") else 1.0)
    env = eval_env
else:  # playground, as in the original's README: its episode wrapper for training
    from mujoco_playground import registry

    from nnx_ppo.wrappers import episode_wrapper

    eval_env = registry.load(name, config_overrides={"impl": "jax"})
    env = episode_wrapper.EpisodeWrapper(eval_env, task["eval_len"])
if task["reward_scale"] != 1.0:
    from nnx_ppo.wrappers.reward_scaling_wrapper import RewardScalingWrapper

    env = RewardScalingWrapper(env, task["reward_scale"])
OBS_SIZE, A = eval_env.observation_size, eval_env.action_size
if task["arch"] == "mlp" and kind == "playground":
    nets = make_mlp_actor_critic(OBS_SIZE, A, actor_hidden_sizes=[64] * 4, critic_hidden_sizes=[256] * 2, rngs=rngs,
                                 normalize_obs=True)
elif task["arch"] == "mlp":
    nets = make_mlp_actor_critic(OBS_SIZE, A, actor_hidden_sizes=[64, 64], critic_hidden_sizes=[64, 64], rngs=rngs,
                                 normalize_obs=True)
else:  # Dense(64) -> LSTM(64) for actor and critic
    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.feedforward import Dense
    from nnx_ppo.networks.normalizer import Normalizer
    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.sampling_layers import NormalTanhSampler

    def trunk():
        return [Dense(OBS_SIZE, 64, rngs, activation=nnx.swish), LSTM(64, 64, rngs)]

    nets = Sequential([Normalizer(OBS_SIZE), PPOAdapter(
        action=Sequential([*trunk(), Dense(64, 2 * A, rngs), NormalTanhSampler(rngs, entropy_weight=1e-2)]),
        value=Sequential([*trunk(), Dense(64, 1, rngs)]))])

evals = []
t0 = time.perf_counter()


def log_fn(metrics, steps):
    if "eval/episode_reward/mean" in metrics:
        evals.append([int(steps), float(metrics["eval/episode_reward/mean"]), time.perf_counter() - t0])


cfg = TrainConfig(
    ppo=PPOConfig(n_envs=task["n_envs"], rollout_length=task["rollout"], total_steps=task["total"], n_epochs=4,
                  n_minibatches=4, learning_rate=3e-4),
    eval=EvalConfig(enabled=True, every_steps=task["eval_every"], n_envs=task["eval_envs"],
                    max_episode_length=task["eval_len"]),
    seed=seed,
)
ppo.train_ppo(env, nets, cfg, log_fn=log_fn, eval_env=eval_env)
print(json.dumps({"evals": evals, "wall_s": time.perf_counter() - t0}))
