"""Tiny pure-JAX envs for the algorithm tests (independent of nnx_ppo.envs)."""

import jax
import jax.numpy as jnp

from nnx_ppo.envs.types import EnvState


class Target:
    """Match a random target: obs is a random vector, reward ``-|a - obs[:A]|``.

    Episodes end at random (terminated, probability ``p_end`` per step) or at
    ``max_steps`` (truncated), so resets happen inside short rollouts.
    ``discrete=True`` gives 3 actions with reward 1 for the right one.
    """

    def __init__(self, obs_size=3, action_size=2, max_steps=7, p_end=0.1, discrete=False):
        self.obs_size, self.action_size = obs_size, action_size
        self.max_steps, self.p_end, self.discrete = max_steps, p_end, discrete

    def _obs(self, key):
        return jax.random.uniform(key, (self.obs_size,), minval=-1.0, maxval=1.0)

    def reset(self, key):
        key, sub = jax.random.split(key)
        zero = jnp.zeros((), jnp.float32)
        return EnvState(obs=self._obs(sub), reward=zero, done=zero, metrics={},
                        info={"truncated": zero, "steps": jnp.zeros((), jnp.int32)}, data=key)

    def step(self, state, action):
        key, k_obs, k_end = jax.random.split(state.data, 3)
        if self.discrete:
            target = jnp.argmax(state.obs[:3])
            reward = (action == target).astype(jnp.float32)
        else:
            reward = -jnp.sum(jnp.abs(action - state.obs[: self.action_size]))
        steps = state.info["steps"] + 1
        terminated = jax.random.uniform(k_end) < self.p_end
        truncated = (steps >= self.max_steps) & ~terminated
        done = (terminated | truncated).astype(jnp.float32)
        return EnvState(obs=self._obs(k_obs), reward=reward, done=done, metrics={},
                        info={"truncated": truncated.astype(jnp.float32), "steps": steps}, data=key)


class Constant:
    """Reward 1 every step, never terminates, truncated after ``max_steps``;
    the observation is constant so it cannot reveal the time left."""

    def __init__(self, max_steps=8):
        self.max_steps = max_steps

    def reset(self, key):
        zero = jnp.zeros((), jnp.float32)
        return EnvState(obs=jnp.ones((2,)), reward=zero, done=zero, metrics={},
                        info={"truncated": zero, "steps": jnp.zeros((), jnp.int32)})

    def step(self, state, action):
        steps = state.info["steps"] + 1
        truncated = (steps >= self.max_steps).astype(jnp.float32)
        return EnvState(obs=state.obs, reward=jnp.ones((), jnp.float32), done=truncated, metrics={},
                        info={"truncated": truncated, "steps": steps})
