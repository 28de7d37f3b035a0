"""Loss replay and the PPO loss.

The replay re-runs a minibatch of whole env sequences ``[T, M]`` from the
carry stored at the rollout's start, feeding back each step's stored
``rollout_extras`` and resetting carries exactly where the rollout did. Where
the rollout reset a carry, the replay takes the *stored* post-reset carry as
its value (so a ``reset_state`` that draws fresh keys from a class-level
``nnx.Rngs`` is reproduced exactly) while gradients flow through a
recomputed ``reset_state`` (so a trainable initial state still learns).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.gae import trajectory_gae
from nnx_ppo.algorithms.rollout import Trajectory, sum_leaves
from nnx_ppo.networks.types import PPONetworkOutput

__all__ = ["Minibatch", "split_minibatches", "largest_difference", "replay_error", "normalize_advantages", "ppo_loss"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Minibatch:
    """A slice of whole env sequences: ``trajectory`` leaves ``[T, M, ...]``,
    ``advantages`` and ``returns`` ``[T, M]`` (pytrees for dict rewards),
    ``last_values`` ``[1, M]``: the rollout's values of the observations after
    its last step (kept ``[1, ...]`` so that every leaf splits along axis 1)."""

    trajectory: Trajectory
    advantages: Any
    returns: Any
    last_values: Any = None


def split_minibatches(key: jax.Array, data: Any, n_minibatches: int, n_blocks: int = 1) -> Any:
    """Permute the env axis and split it into groups of whole env sequences.

    ``data`` (a :class:`Minibatch` or any pytree) leaves ``[T, B, ...]``
    become ``[n_minibatches, T, B // n_minibatches, ...]``; scan over the
    leading axis for one epoch. With ``n_blocks > 1`` the env
    axis is cut into ``n_blocks`` contiguous blocks, envs are permuted within
    each block, and every minibatch takes ``B / (n_blocks * n_minibatches)``
    envs from each block, in block order (so under sharding over ``n_blocks``
    devices no env sequence moves between devices).
    """
    B = jax.tree.leaves(data)[0].shape[1]
    if n_blocks == 1:
        perm = jax.random.permutation(key, B)

        def split(x):
            x = jnp.take(x, perm, axis=1)
            x = jnp.reshape(x, (x.shape[0], n_minibatches, B // n_minibatches) + x.shape[2:])
            return jnp.swapaxes(x, 0, 1)

        return jax.tree.map(split, data)

    K = B // n_blocks
    perms = jax.vmap(lambda k: jax.random.permutation(k, K))(jax.random.split(key, n_blocks))  # [G, K]

    def split_blocks(x):
        T, rest = x.shape[0], x.shape[2:]
        x = jnp.reshape(x, (T, n_blocks, K) + rest)
        x = jax.vmap(lambda block, perm: jnp.take(block, perm, axis=1), in_axes=(1, 0), out_axes=1)(x, perms)
        x = jnp.reshape(x, (T, n_blocks, n_minibatches, K // n_minibatches) + rest)
        x = jnp.moveaxis(x, 2, 0)  # [n_minibatches, T, G, K / n_minibatches, ...]
        return jnp.reshape(x, (n_minibatches, T, B // n_minibatches) + rest)

    return jax.tree.map(split_blocks, data)


def largest_difference(a: Any, b: Any) -> jax.Array:
    """The largest ``|a - b|`` over all leaves of two trees of the same structure."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]))


def normalize_advantages(advantages: jax.Array) -> jax.Array:
    """Standardize over the minibatch; a single element (or constant
    advantages) gives zeros rather than NaN."""
    centered = advantages - jnp.mean(advantages)
    return centered / (jnp.std(advantages) + 1e-8)


def _policy_advantages(advantages, loglikelihoods, config: PPOConfig):
    """The advantages the surrogate uses, ``[T, M]`` leaves.

    A dict (one advantage per action key) when advantages and
    log-likelihoods are dicts with the same keys and ``combine_advantages`` is
    off; otherwise one array, the sum over reward keys, for the joint
    log-likelihood of all actions.
    """
    if (
        isinstance(advantages, dict)
        and isinstance(loglikelihoods, dict)
        and set(advantages) == set(loglikelihoods)
        and not config.combine_advantages
    ):
        return {k: advantages[k] for k in advantages}
    return sum_leaves(advantages)


def replay_error(replayed: PPONetworkOutput, trajectory: Any) -> jax.Array:
    """The replay measurement (logged as ``replay/max_error``, checked
    against ``PPOConfig.replay_tolerance``): the largest absolute difference
    between the replayed log-likelihoods and values and those the rollout
    recorded in ``trajectory`` (no gradient)."""
    return jax.lax.stop_gradient(jnp.maximum(
        largest_difference(replayed.loglikelihoods, trajectory.loglikelihoods),
        largest_difference(replayed.value_estimates, trajectory.values)))


def ppo_loss(params, network: NetworkFn, batch: Minibatch, config: PPOConfig):
    """Clipped-surrogate PPO loss on one minibatch (differentiable in ``params``).

    The minibatch's ``[T, M]`` env sequences are replayed by ``network`` with
    ``params`` (:meth:`NetworkFn.replay`: from the stored start carry, with the
    stored extras and resets; updates to other variables are discarded).

    ``total = policy_loss + critic_loss_weight * value_loss +
    regularization_weight * regularization`` where regularization is the sum of the modules' ``regularization_loss``
    (entropy bonus, KL, ...), averaged over steps. With
    ``config.recompute_advantages`` the advantages and value targets are
    recomputed by GAE from the replayed (current) values of this minibatch
    instead of the rollout's. Returns ``(total, metrics)``.
    """
    traj = batch.trajectory
    replay = network.with_state(params=params).replay(traj)
    new = replay.output

    advantages, returns = batch.advantages, batch.returns
    if config.recompute_advantages:
        last_values = jax.tree.map(lambda v: v[0], batch.last_values)
        advantages, returns = jax.lax.stop_gradient(trajectory_gae(traj, new.value_estimates, last_values, config))
    advantages = _policy_advantages(advantages, new.loglikelihoods, config)
    if isinstance(advantages, dict):
        new_ll, old_ll = new.loglikelihoods, traj.loglikelihoods
    else:
        new_ll, old_ll = sum_leaves(new.loglikelihoods), sum_leaves(traj.loglikelihoods)
    if config.normalize_advantages:
        advantages = jax.tree.map(normalize_advantages, advantages)

    def surrogate(adv, ll_new, ll_old):
        log_ratio = ll_new - ll_old
        ratio = jnp.exp(log_ratio)
        clipped = jnp.clip(ratio, 1.0 - config.clip_range, 1.0 + config.clip_range)
        loss = -jnp.mean(jnp.minimum(ratio * adv, clipped * adv))
        approx_kl = jnp.mean((ratio - 1.0) - log_ratio)
        clip_fraction = jnp.mean((jnp.abs(ratio - 1.0) > config.clip_range).astype(jnp.float32))
        return loss, approx_kl, clip_fraction

    parts = jax.tree.map(surrogate, advantages, new_ll, old_ll)
    parts = jax.tree.leaves(parts, is_leaf=lambda x: isinstance(x, tuple))
    policy_loss = sum(p[0] for p in parts)
    approx_kl = sum(p[1] for p in parts) / len(parts)
    clip_fraction = sum(p[2] for p in parts) / len(parts)

    def value_error(v_new, v_old, ret):
        error = (v_new - ret) ** 2
        if config.value_clip_range is not None:
            v_clipped = v_old + jnp.clip(v_new - v_old, -config.value_clip_range, config.value_clip_range)
            error = jnp.maximum(error, (v_clipped - ret) ** 2)
        return 0.5 * jnp.mean(error)

    value_loss = sum_leaves(jax.tree.map(value_error, new.value_estimates, traj.values, returns))
    regularization = config.regularization_weight * replay.regularization_loss
    total = policy_loss + config.critic_loss_weight * value_loss + regularization
    metrics = {
        "replay/max_error": replay_error(new, traj),
        "loss/total": total,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "loss/regularization": replay.regularization_loss,
        "policy/approx_kl": approx_kl,
        "policy/clip_fraction": clip_fraction,
    }
    return total, metrics
