"""From a trained run to a policy that runs without this library: load the
best policy, step it with episode resets, export it with ``jax.export``
and check the exported step gives the same actions.

    python examples/export_policy.py               # about a minute on a laptop CPU
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import nnx_ppo
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.policy import load_exported

TINY = "--tiny" in sys.argv
STEPS = 1024 if TINY else 200_000

config = TrainConfig(ppo=PPOConfig(n_envs=8 if TINY else 64, rollout_length=32, n_minibatches=2, total_steps=STEPS),
                     eval=EvalConfig(every_steps=STEPS // 4, n_envs=16, max_episode_length=500))
train_ppo("gymnax:CartPole-v1", "mlp", config, run_dir="runs/cartpole")

policy = nnx_ppo.load_policy("runs/cartpole", step="best")   # deterministic, compiled
env = nnx_ppo.make("gymnax:CartPole-v1")
n = 4
obs = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), n)).obs
policy.export("cartpole_policy", obs)             # step.jax, initial_carry.jax, params.npz, policy.json
exported = load_exported("cartpole_policy")       # needs JAX and NumPy only

state = jax.vmap(env.reset)(jax.random.split(jax.random.key(1), n))
carry, exported_carry = policy.initial_carry(n), exported.initial_carry()
done, returns = np.zeros(n, bool), np.zeros(n)
for t in range(200):
    action, carry = policy(carry, state.obs, done)
    exported_action, exported_carry = exported.step(exported_carry, state.obs, done)
    assert np.array_equal(np.asarray(action), np.asarray(exported_action))
    state = jax.vmap(env.step)(state, action)
    returns += np.asarray(state.reward)
    done = np.asarray(state.done) > 0              # these envs start a new episode; the policies reset
    fresh = jax.vmap(env.reset)(jax.random.split(jax.random.key(t + 2), n))   # their carry at the next call
    state = jax.tree.map(lambda a, b, d=done: jnp.where(d.reshape(d.shape + (1,) * (a.ndim - 1)), a, b),
                         fresh, state)
print("reward over 200 steps per env:", returns)
