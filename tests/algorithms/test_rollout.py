"""Rollout details that the end-to-end tests do not isolate."""

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.algorithms.rollout import reset_ended
from nnx_ppo.envs.types import EnvState, as_f32


class _Counter:
    """Resets to obs 0 with per-env data; no step (the test builds the stepped states)."""

    def reset(self, key):
        return EnvState(obs=jnp.zeros(2), reward=as_f32(0.0), done=as_f32(0.0), info={"truncated": as_f32(0.0)},
                        data={"t": jnp.zeros((), jnp.int32)})


def test_reset_keeps_leaves_without_the_env_axis():
    """MuJoCo Warp batches keep some fields outside vmap's env axis (a
    batch-wide contact counter ``[1]``, empty buffers ``[0, ...]``): resets
    leave them as stepped and reset every per-env leaf of the ended envs."""
    B = 3
    stepped = EnvState(obs=jnp.ones((B, 2)), reward=jnp.ones(B), done=jnp.array([0.0, 1.0, 0.0]),
                       info={"truncated": jnp.zeros(B)},
                       data={"t": jnp.array([5, 7, 9], jnp.int32), "ncollision": jnp.array([4], jnp.int32),
                             "contacts": jnp.zeros((0, 3))})
    done = stepped.done > 0
    out = jax.jit(lambda s: reset_ended(_Batchless(), done, s, jax.random.key(0)))(stepped)
    np.testing.assert_array_equal(out.data["t"], [5, 0, 9])
    np.testing.assert_array_equal(out.obs, [[1, 1], [0, 0], [1, 1]])
    np.testing.assert_array_equal(out.data["ncollision"], [4])
    assert out.data["contacts"].shape == (0, 3)


class _Batchless(_Counter):
    """Its vmapped reset puts the counter and the buffer on the env axis, as
    ``jax.vmap`` does, while the stepped states (built by hand) keep them off it."""

    def reset(self, key):
        state = super().reset(key)
        return state.replace(data={**state.data, "ncollision": jnp.zeros((1,), jnp.int32),
                                   "contacts": jnp.zeros((0, 3))})
