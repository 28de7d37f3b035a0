"""Full-length learning checks; prints one JSON line per task.

Usage: python bench/learning.py [cartpole|pendulum|memory ...]   (default: all)

- cartpole: gymnax CartPole-v1, MLP, evaluation return (target >= 475 of 500).
- pendulum: gymnax Pendulum-v1, MLP 64-64, rewards scaled by 0.1 for training,
  evaluation return (target >= -250).
- memory: cue_memory with 4 cues and a delay of 8, LSTM vs MLP success rate
  (target LSTM >= 0.9, MLP <= 0.6; chance is 0.25).
- balance: Playground CartpoleBalance, MLP (4x64 actor, 2x256 critic), 1M
  steps with de-synchronized training episodes.
"""

import json
import sys
import time

from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale
from nnx_ppo.networks.factories import make_actor_critic_for_env, make_mlp_actor_critic


def run(name, env, net, ppo, eval_len, eval_env=None):
    config = TrainConfig(ppo=ppo, eval=EvalConfig(every_steps=ppo.total_steps // 4, n_envs=32,
                                                  max_episode_length=eval_len), iterations_per_call=10)
    t0 = time.perf_counter()
    result = train_ppo(env, net, config, eval_env=eval_env)
    evals = [(steps, round(m["eval/episode_return"], 3)) for steps, m in result.eval_history]
    row = {"task": name, "final_eval_return": evals[-1][1], "evals": evals,
           "wall_s": round(time.perf_counter() - t0, 1), "compile_s": round(result.compile_seconds, 1)}
    print(json.dumps(row), flush=True)
    return row


def cartpole():
    env = make("gymnax:CartPole-v1")
    run("cartpole", env, make_actor_critic_for_env(env, "mlp", nnx.Rngs(0)),
        PPOConfig(n_envs=64, rollout_length=32, total_steps=500_000, learning_rate=1e-3), 500)


def pendulum():
    env = make("gymnax:Pendulum-v1")
    net = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0))
    run("pendulum", RewardScale(env, 0.1), net,
        PPOConfig(n_envs=256, rollout_length=32, total_steps=2_000_000, learning_rate=1e-3,
                  discounting_factor=0.95), 200, eval_env=env)


def memory():
    env = make("cue_memory", n_cues=4, delay=8)
    for kind, sizes in (("lstm", {"hidden_size": 32, "encoder_sizes": (32,)}),
                        ("mlp", {"actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)})):
        net = make_actor_critic_for_env(env, kind, nnx.Rngs(0), **sizes)
        run(f"memory-{kind}", env, net,
            PPOConfig(n_envs=64, rollout_length=24, total_steps=300_000, learning_rate=1e-3), 12)


def balance():
    env = make("playground:CartpoleBalance", random_initial_steps=True)
    eval_env = make("playground:CartpoleBalance")
    net = make_mlp_actor_critic(5, 1, (64,) * 4, (256,) * 2, nnx.Rngs(0), entropy_weight=1e-2)
    run("balance", env, net, PPOConfig(n_envs=256, rollout_length=30, total_steps=1_000_000), 1000, eval_env=eval_env)


if __name__ == "__main__":
    tasks = sys.argv[1:] or ["cartpole", "pendulum", "memory", "balance"]
    for task in tasks:
        globals()[task]()
