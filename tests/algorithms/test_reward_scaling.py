"""Reward scaling by the running std of the discounted return, against a plain Python loop."""

import numpy as np

from nnx_ppo.algorithms.ppo import initial_return_statistics, scale_rewards, update_return_statistics


def python_returns(rewards, done, gamma, start):
    T, B = rewards.shape
    out, g = np.zeros((T, B)), np.array(start, float)
    for t in range(T):
        for b in range(B):
            g[b] = gamma * g[b] + rewards[t, b]
            out[t, b] = g[b]
            if done[t, b]:
                g[b] = 0.0
    return out, g


def test_running_statistics_match_all_discounted_returns_so_far():
    rng = np.random.default_rng(0)
    gamma, B = 0.9, 5
    stats = initial_return_statistics(B)
    seen, g = [], np.zeros(B)
    for _ in range(3):  # three rollouts; episodes cross rollout boundaries
        rewards = rng.normal(2.0, 1.0, (7, B)).astype(np.float32)
        done = rng.random((7, B)) < 0.2
        returns, g = python_returns(rewards, done, gamma, g)
        seen.append(returns.ravel())
        stats = update_return_statistics(stats, rewards, done, gamma)
        np.testing.assert_allclose(stats.discounted_return, g, rtol=1e-5)
    everything = np.concatenate(seen)
    np.testing.assert_allclose(stats.mean, everything.mean(), rtol=1e-3)
    np.testing.assert_allclose(stats.var, everything.var(), rtol=1e-3)
    scaled = scale_rewards({"a": np.ones(3, np.float32)}, stats)
    np.testing.assert_allclose(scaled["a"], 1.0 / np.sqrt(everything.var()), rtol=1e-3)
