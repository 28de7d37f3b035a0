"""GAE against a plain Python loop, with terminations, truncations and
episode boundaries in the middle of the rollout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms.ppo import compute_gae


def python_gae(rewards, values, last_value, terminated, truncated, final_values, gamma, lam, bootstrap=True):
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            done = terminated[t, b] or truncated[t, b]
            nxt = values[t + 1, b] if t + 1 < T else last_value[b]
            if truncated[t, b] and bootstrap:
                nxt = final_values[t, b]
            if terminated[t, b] or (truncated[t, b] and not bootstrap):
                nxt = 0.0
            delta = rewards[t, b] + gamma * nxt - values[t, b]
            if done:
                running = 0.0
            running = delta + gamma * lam * running
            adv[t, b] = running
    return adv, adv + values


@pytest.mark.parametrize("bootstrap", [True, False])
def test_gae_matches_python_loop(bootstrap):
    rng = np.random.default_rng(0)
    T, B = 13, 5
    rewards = rng.normal(size=(T, B)).astype(np.float32)
    values = rng.normal(size=(T, B)).astype(np.float32)
    last = rng.normal(size=(B,)).astype(np.float32)
    final = rng.normal(size=(T, B)).astype(np.float32)
    terminated = (rng.random((T, B)) < 0.15).astype(np.float32)
    truncated = ((rng.random((T, B)) < 0.15) & (terminated == 0)).astype(np.float32)
    terminated[-1, 0], truncated[-1, 1] = 1.0, 1.0  # boundaries at the rollout's end too
    assert terminated.sum() > 0 and truncated.sum() > 0
    adv, ret = compute_gae(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(last), jnp.asarray(terminated),
        jnp.asarray(truncated), jnp.asarray(final), 0.97, 0.9, bootstrap,
    )
    expected_adv, expected_ret = python_gae(rewards, values, last, terminated, truncated, final, 0.97, 0.9, bootstrap)
    np.testing.assert_allclose(np.asarray(adv), expected_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), expected_ret, rtol=1e-5, atol=1e-5)


def test_gae_is_jittable_and_lambda_one_gives_discounted_returns():
    T = 6
    rewards = jnp.ones((T, 1))
    values = jnp.zeros((T, 1))
    zeros = jnp.zeros((T, 1))
    adv, ret = jax.jit(compute_gae, static_argnums=(6, 7, 8))(
        rewards, values, jnp.zeros((1,)), zeros, zeros, zeros, 0.5, 1.0, True
    )
    expected = [sum(0.5**k for k in range(T - t)) for t in range(T)]
    np.testing.assert_allclose(np.asarray(ret[:, 0]), expected, rtol=1e-6)
