"""Distillation: an LSTM that sees only positions learns to act like a
teacher that sees the full state (a hand-set linear regulator of the
cart-pole), then the command line evaluates the student.

    python examples/distillation.py                # about a minute on a laptop CPU
"""

import sys

import jax.numpy as jnp
from flax import nnx

from nnx_ppo import cli
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.distillation import DistillationConfig, train_distillation
from nnx_ppo.network_spec import NetworkSpec
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Sequential
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.sampling_layers import NormalTanhSampler

TINY = "--tiny" in sys.argv
STEPS = 512 if TINY else 16_384

# The teacher: action mean = K . [x, x_dot, theta, theta_dot], on the full physical state.
rngs = nnx.Rngs(0)
head = Dense(4, 2, rngs)
head.kernel[...] = jnp.array([[0.785, 0.0], [1.383, 0.0], [9.033, 0.0], [2.389, 0.0]])
teacher = PPOAdapter(action=Sequential(head, NormalTanhSampler(rngs)), value=Dense(4, 1, rngs))

# The student: an LSTM on cartpole_no_velocity, which observes [x, theta] only.
student = NetworkSpec.sized("cartpole_no_velocity", "lstm", 16 if TINY else 32, seed=1)
config = TrainConfig(
    ppo=PPOConfig(n_envs=8 if TINY else 32, rollout_length=32, total_steps=STEPS, n_minibatches=2,
                  learning_rate=3e-3),
    eval=EvalConfig(every_steps=STEPS // 2, n_envs=16, max_episode_length=200),
)
result = train_distillation("cartpole_no_velocity", teacher, student, config,
                            teacher_obs=lambda env_state: env_state.data,      # the teacher's view
                            distillation=DistillationConfig(teacher_mixing=0.5, teacher_mixing_steps=STEPS // 2),
                            run_dir="runs/student")
print("distillation loss", result.metrics["loss/distillation"],
      "student return", result.eval_history[-1][1]["eval/episode_return"])

# The student alone, as any run: nnx-ppo eval runs/student --episodes 64
assert cli.main(["eval", "runs/student", "--episodes", "64"]) == 0
