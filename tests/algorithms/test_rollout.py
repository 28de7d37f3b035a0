"""Rollout details that the end-to-end tests do not isolate."""

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.algorithms.ppo import reset_ended
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



class _NaNAtStep2:
    """obs [1, 1]; at each episode's step 2 the reward and the first obs
    number are NaN (episodes of 4 steps, then a reset)."""

    def reset(self, key):
        return EnvState(obs=jnp.ones(2), reward=as_f32(0.0), done=as_f32(0.0), metrics={},
                        info={"truncated": as_f32(0.0), "t": jnp.zeros((), jnp.int32)})

    def step(self, state, action):
        t = state.info["t"] + 1
        nan = jnp.where(t == 2, jnp.nan, 0.0)
        done = (t == 4).astype(jnp.float32)
        return EnvState(obs=jnp.ones(2).at[0].add(nan), reward=1.0 + nan, done=done, metrics={},
                        info={"truncated": done, "t": t})


def test_nonfinite_counts():
    """health/nonfinite_*: per rollout, the env steps with a NaN reward, the
    NaN numbers in the observations and in the actions, and (in the update)
    in the gradients; all 0 in a healthy run (checked through train_ppo)."""
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.functional import NetworkFn
    from nnx_ppo.algorithms.ppo import collect_rollout, new_training_state
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from tests.algorithms.toy_envs import Target

    net = make_mlp_actor_critic(2, 2, rngs=nnx.Rngs(0), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    config = TrainConfig(ppo=PPOConfig(n_envs=3, rollout_length=8, n_minibatches=1, total_steps=48),
                         eval=EvalConfig(enabled=False))
    env = _NaNAtStep2()
    state = new_training_state(env, net, config)
    rollout = jax.jit(collect_rollout, static_argnums=(0, 4, 5))(  # compiled, as training runs it
        env, NetworkFn.of(net, deterministic=False), state.rollout, jax.random.key(0), 8, True)
    metrics = rollout.stats.metrics()
    assert float(metrics["health/nonfinite_rewards"]) == 2 * 3  # steps 2 and 6 of 8, 3 envs
    assert float(metrics["health/nonfinite_observations"]) == 2 * 3
    assert float(metrics["health/nonfinite_actions"]) == 2 * 3 * 2  # the NaN obs of steps 3 and 7 act: 2 numbers each

    rows = []
    train_ppo(Target(obs_size=2), make_mlp_actor_critic(2, 2, rngs=nnx.Rngs(0), actor_hidden_sizes=(8,),
                                                         critic_hidden_sizes=(8,)),
              config, log_fn=lambda m, s: rows.append(m))
    keys = {"health/nonfinite_rewards", "health/nonfinite_observations", "health/nonfinite_actions",
            "health/nonfinite_gradients"}
    assert rows and all(keys <= set(r) and all(r[k] == 0 for k in keys) for r in rows)
