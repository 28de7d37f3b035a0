"""Reward scaling by a running standard deviation of the discounted return.

With ``PPOConfig.normalize_rewards`` the trainer divides every reward it
feeds to GAE by ``sqrt(var(G) + eps)``, where ``G_t = gamma * G_{t-1} + r_t``
is each env's discounted return so far (reset when its episode ends) and the
variance is a running one over every step trained on. Value targets then have
a scale near one whatever the env's reward scale, so the critic's gradient no
longer dominates the global-norm clip. Logged returns stay in the env's units.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from nnx_ppo.networks.normalizer import merge_moments

__all__ = ["ReturnStatistics", "initial_return_statistics", "update_return_statistics", "scale_rewards"]

_EPS = 1e-8


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReturnStatistics:
    """Running statistics of the discounted return.

    Attributes:
      discounted_return: ``[B]`` each env's discounted return so far in its episode.
      count: number of ``G`` values folded in (starts at a tiny positive value).
      mean: running mean of ``G`` (scalar).
      var: running variance of ``G`` (scalar; 1 before any data).
    """

    discounted_return: jax.Array
    count: jax.Array
    mean: jax.Array
    var: jax.Array


def initial_return_statistics(n_envs: int) -> ReturnStatistics:
    """Statistics before any step: ``G = 0`` for every env, variance 1."""
    return ReturnStatistics(
        discounted_return=jnp.zeros((n_envs,), jnp.float32),
        count=jnp.asarray(1e-4, jnp.float32),
        mean=jnp.zeros((), jnp.float32),
        var=jnp.ones((), jnp.float32),
    )


def update_return_statistics(stats: ReturnStatistics, rewards: jax.Array, done: jax.Array,
                             discounting_factor: float) -> ReturnStatistics:
    """Fold a rollout into the statistics.

    Args:
      stats: the statistics before the rollout.
      rewards: ``[T, B]`` rewards (summed over reward keys).
      done: ``[T, B]``, the episode ended at step ``t`` (terminated or truncated).
      discounting_factor: gamma.

    Returns the statistics after it: every ``G_t`` of the ``T * B`` steps
    merged into the running mean and variance (parallel-variance formula).
    """

    def step(g, inputs):
        r, d = inputs
        g = discounting_factor * g + r
        return g * (1.0 - d), g

    last, returns = jax.lax.scan(step, stats.discounted_return, (rewards, done.astype(jnp.float32)))
    n = jnp.asarray(returns.size, jnp.float32)
    batch_mean, batch_var = jnp.mean(returns), jnp.var(returns)
    total, mean, m2 = merge_moments(stats.count, stats.mean, stats.var * stats.count, n, batch_mean, batch_var * n)
    return ReturnStatistics(discounted_return=last, count=total, mean=mean, var=m2 / total)


def scale_rewards(rewards, stats: ReturnStatistics):
    """``rewards / sqrt(var + eps)`` (every leaf of a reward pytree alike)."""
    scale = jax.lax.rsqrt(stats.var + _EPS)
    return jax.tree.map(lambda r: r * scale, rewards)
