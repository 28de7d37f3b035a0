"""Generalized advantage estimation with terminations and truncations kept apart."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["compute_gae", "next_values", "trajectory_gae"]


def next_values(values, last_value, truncated, final_values, bootstrap_on_truncation=True):
    """The value each transition bootstraps from, ``[T, B]``.

    ``values[t + 1]`` (``last_value`` after the last step), except where a time
    limit truncated the episode: there the value of the true final
    observation, ``final_values[t]``.
    """
    following = jnp.concatenate([values[1:], last_value[None]], axis=0)
    if not bootstrap_on_truncation:
        return following
    return jnp.where(truncated > 0, final_values, following)


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    last_value: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    final_values: jax.Array,
    discounting_factor: float,
    gae_lambda: float,
    bootstrap_on_truncation: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """GAE over a rollout.

    Args:
      rewards: ``[T, B]``.
      values: ``[T, B]``, the value estimates of the rollout's observations.
      last_value: ``[B]``, value of the observation after the last step.
      terminated: ``[T, B]``, 1 where the episode really ended (no bootstrap).
      truncated: ``[T, B]``, 1 where a time limit ended it.
      final_values: ``[T, B]``, value of the true final observation (used
        where truncated).
      bootstrap_on_truncation: if False a truncation cuts the return like a
        termination.

    Returns:
      ``(advantages, returns)``, both ``[T, B]``; ``returns = advantages + values``.

    ``delta_t = r_t + gamma * (1 - cut_t) * V_next_t - V_t`` and
    ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}``, where
    ``done_t`` is termination or truncation (the advantage never crosses an
    episode boundary) and ``cut_t`` is termination (plus truncation when not
    bootstrapping).
    """
    done = jnp.maximum(terminated, truncated)
    cut = terminated if bootstrap_on_truncation else done
    bootstrap = next_values(values, last_value, truncated, final_values, bootstrap_on_truncation)
    deltas = rewards + discounting_factor * (1.0 - cut) * bootstrap - values

    def backward(advantage, inputs):
        delta, d = inputs
        advantage = delta + discounting_factor * gae_lambda * (1.0 - d) * advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, done), reverse=True)
    return advantages, advantages + values


def trajectory_gae(trajectory, values, last_values, config):
    """Per-reward-key GAE of a rollout (or a minibatch of its env sequences).

    Args:
      trajectory: a :class:`~nnx_ppo.algorithms.rollout.Trajectory` with
        ``[T, B]`` rewards, terminations, truncations and final values.
      values: ``[T, B]`` value estimates (a pytree like the rewards).
      last_values: ``[B]`` values of the observations after the last step.
      config: the :class:`~nnx_ppo.algorithms.config.PPOConfig` (gamma,
        lambda, bootstrapping).

    Returns ``(advantages, returns)``, pytrees of ``[T, B]`` leaves like the rewards.
    """

    def one_key(rewards, values, last, final):
        return compute_gae(
            rewards, values, last, trajectory.terminated, trajectory.truncated, final,
            config.discounting_factor, config.gae_lambda, config.bootstrap_on_truncation,
        )

    pairs = jax.tree.map(one_key, trajectory.rewards, values, last_values, trajectory.final_values)
    is_pair = lambda x: isinstance(x, tuple)
    return (jax.tree.map(lambda p: p[0], pairs, is_leaf=is_pair), jax.tree.map(lambda p: p[1], pairs, is_leaf=is_pair))
