"""Built-in tasks: optimal returns for oracles, shortfall for memoryless policies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.envs import CartpoleNoVelocity, ConstantReward, CueMemory, make

# LQR gains for the [-1, 1] action (force / 10 N) on [x, x_dot, theta, theta_dot].
K = jnp.array([0.785, 1.383, 9.033, 2.389], jnp.float32)


def rollout(env, policy, n_envs, n_steps, seed=0):
    """Vmapped rollout summing rewards until done (no reset). Returns (returns, final states)."""

    def one(key):
        s = env.reset(key)

        def body(carry, _):
            s, ret, alive = carry
            a = policy(s)
            s2 = env.step(s, a)
            ret = ret + alive * s2.reward
            alive = alive * (1.0 - s2.done)
            return (s2, ret, alive), (s2.done, s2.info["truncated"])

        (s, ret, _), (dones, truncs) = jax.lax.scan(body, (s, jnp.float32(0), jnp.float32(1)), None, n_steps)
        return ret, s, dones, truncs

    keys = jax.random.split(jax.random.PRNGKey(seed), n_envs)
    return jax.jit(jax.vmap(one))(keys)


@pytest.mark.parametrize("n_cues,delay", [(2, 4)])
def test_cue_memory_oracle_and_memoryless(n_cues, delay):
    env = make("cue_memory", n_cues=n_cues, delay=delay)
    assert isinstance(env, CueMemory)
    n = 4000
    oracle = lambda s: s.data["cue"]  # privileged: reads the remembered cue  # noqa: E731
    ret, last, dones, truncs = rollout(env, oracle, n, delay + 2)
    np.testing.assert_array_equal(np.asarray(ret), 1.0)
    np.testing.assert_array_equal(np.asarray(last.metrics["success"]), 1.0)
    # Ends exactly at step delay + 2, terminated (not truncated).
    np.testing.assert_array_equal(np.asarray(dones)[:, -1], 1.0)
    np.testing.assert_array_equal(np.asarray(dones)[:, :-1], 0.0)
    np.testing.assert_array_equal(np.asarray(truncs), 0.0)

    # Any memoryless policy: the query obs is identical for all cues, so e.g.
    # "always answer 0" wins exactly when cue == 0; expectation 1 / n_cues.
    ret0, *_ = rollout(env, lambda s: jnp.int32(0), n, delay + 2)
    mean = float(np.mean(ret0))
    se = np.sqrt((1 / n_cues) * (1 - 1 / n_cues) / n)
    assert abs(mean - 1 / n_cues) < 4 * se
    # Exact: with these keys the memoryless return equals the frequency of cue 0.
    cues = jax.vmap(lambda k: env.reset(k).data["cue"])(jax.random.split(jax.random.PRNGKey(0), n))
    assert mean == pytest.approx(float(np.mean(np.asarray(cues) == 0)))


def test_cue_memory_observations():
    env = CueMemory(n_cues=3, delay=2)
    s = env.reset(jax.random.PRNGKey(3))
    cue = int(s.data["cue"])
    np.testing.assert_array_equal(np.asarray(s.obs), np.eye(3)[cue].tolist() + [0.0])
    obs = []
    for _ in range(3):
        s = env.step(s, jnp.int32(0))
        obs.append(np.asarray(s.obs))
        assert float(s.reward) == 0.0 and float(s.metrics["success"]) == 0.0
    np.testing.assert_array_equal(obs[0], 0.0)
    np.testing.assert_array_equal(obs[1], 0.0)
    np.testing.assert_array_equal(obs[2], [0, 0, 0, 1.0])
    assert float(s.done) == 0.0
    s = env.step(s, jnp.int32(cue))
    assert float(s.reward) == 1.0 and float(s.done) == 1.0 and float(s.info["truncated"]) == 0.0
    assert float(s.metrics["success"]) == 1.0


def test_cartpole_no_velocity_oracle_and_memoryless():
    env = make("cartpole_no_velocity", episode_length=200)
    assert env.observation_space.shape == (2,)
    oracle = lambda s: jnp.clip(jnp.dot(K, s.data), -1, 1).reshape((1,))  # noqa: E731
    ret, last, dones, truncs = rollout(env, oracle, 64, 200)
    np.testing.assert_array_equal(np.asarray(ret), 200.0)  # documented optimum
    np.testing.assert_array_equal(np.asarray(truncs)[:, -1], 1.0)  # time limit: truncated
    np.testing.assert_array_equal(np.asarray(dones)[:, :-1], 0.0)

    # The same controller with velocities zeroed (what it can see without memory) fails.
    blind = lambda s: jnp.clip(  # noqa: E731
        jnp.dot(K, s.data * jnp.array([1, 0, 1, 0], jnp.float32)), -1, 1
    ).reshape((1,))
    ret_b, last_b, _, truncs_b = rollout(env, blind, 64, 200)
    ret_b = np.asarray(ret_b)
    assert float(np.mean(ret_b)) < 150.0, np.mean(ret_b)
    assert float(np.mean(ret_b == 200.0)) < 0.2
    # Falling is a termination, not a truncation.
    fell = ret_b < 200.0
    np.testing.assert_array_equal(np.asarray(last_b.info["truncated"])[fell], 0.0)
    np.testing.assert_array_equal(np.asarray(last_b.done)[fell], 1.0)


def test_cartpole_full_observation():
    env = CartpoleNoVelocity(full_observation=True)
    s = env.reset(jax.random.PRNGKey(0))
    assert s.obs.shape == (4,) and env.observation_space.shape == (4,)
    np.testing.assert_array_equal(np.asarray(s.obs), np.asarray(s.data))


def test_constant_reward_truncates():
    env = make("constant_reward", episode_length=8)
    ret, last, dones, truncs = rollout(env, lambda s: jnp.int32(0), 4, 8)
    np.testing.assert_array_equal(np.asarray(ret), 8.0)
    np.testing.assert_array_equal(np.asarray(dones)[:, -1], 1.0)
    np.testing.assert_array_equal(np.asarray(truncs)[:, -1], 1.0)
    np.testing.assert_array_equal(np.asarray(dones)[:, :-1], 0.0)
    cont = ConstantReward(obs_size=3, continuous=True)
    assert cont.action_space.shape == (1,) and cont.observation_space.shape == (3,)
