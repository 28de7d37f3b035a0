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
from nnx_ppo.algorithms.rollout import Trajectory, apply_network, reset_network_state, sum_leaves
from nnx_ppo.networks.types import PPONetworkOutput, select_where

__all__ = ["Minibatch", "ReplayResult", "replay_network", "normalize_advantages", "ppo_loss"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Minibatch:
    """A slice of whole env sequences: ``trajectory`` leaves ``[T, M, ...]``,
    ``advantages`` and ``returns`` ``[T, M]`` (pytrees for dict rewards)."""

    trajectory: Trajectory
    advantages: Any
    returns: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """Replayed network outputs, leaves ``[T, M, ...]``.

    Attributes:
      output: the replayed :class:`PPONetworkOutput`.
      regularization_loss: scalar, mean over steps of the modules' terms.
      metrics: network metrics, averaged over steps.
      carry: the carry the replay computed entering each step, before any
        reset was applied (``()`` for stateless networks); compared to the
        stored carry by the consistency checker.
    """

    output: PPONetworkOutput
    regularization_loss: jax.Array
    metrics: dict[str, jax.Array]
    carry: Any


def _straight_through(stored: Any, recomputed: Any) -> Any:
    """Value of ``stored``, gradient of ``recomputed`` (float leaves); other
    leaves (integers, PRNG keys) are taken from ``stored``."""

    def leaf(s, r):
        if jnp.issubdtype(s.dtype, jnp.floating):
            return s + (r - jax.lax.stop_gradient(r))
        return s

    return jax.tree.map(leaf, stored, recomputed)


def replay_network(graphdef, params, rest, trajectory: Trajectory) -> ReplayResult:
    """Re-run the network over a ``[T, M]`` slice of a rollout.

    A network with no carry leaves is stateless in time: it runs once on the
    flattened ``[T * M]`` batch instead of scanning.
    """
    T, M = trajectory.reset.shape
    if not jax.tree.leaves(trajectory.carry):
        flat = lambda tree: jax.tree.map(lambda x: jnp.reshape(x, (T * M,) + x.shape[2:]), tree)
        carry = jax.tree.map(lambda x: x[0], trajectory.carry)  # an empty structure
        out, _ = apply_network(graphdef, params, rest, carry, flat(trajectory.obs), flat(trajectory.extras))
        unflat = lambda tree: jax.tree.map(lambda x: jnp.reshape(x, (T, M) + x.shape[1:]), tree)
        return ReplayResult(
            output=unflat(out.output),
            regularization_loss=jnp.asarray(out.regularization_loss, jnp.float32),
            metrics={k: jnp.mean(v) for k, v in out.metrics.items()},
            carry=trajectory.carry,
        )

    def step(scan_carry, inputs):
        # ``rest`` rides along so RNG streams touched by ``reset_state`` are
        # traced at this level; its updates are discarded after the replay.
        carry, rest_t = scan_carry
        obs, extras, reset, stored = inputs
        fresh, rest_t = reset_network_state(graphdef, params, rest_t, carry)
        carry_in = select_where(reset, _straight_through(stored, fresh), carry)
        out, rest_t = apply_network(graphdef, params, rest_t, carry_in, obs, extras)
        regularization = jnp.asarray(out.regularization_loss, jnp.float32)
        return (out.next_state, rest_t), (out.output, regularization, out.metrics, carry)

    start = jax.tree.map(lambda x: x[0], trajectory.carry)
    xs = (trajectory.obs, trajectory.extras, trajectory.reset, trajectory.carry)
    _, (output, regularization, metrics, carries) = jax.lax.scan(step, (start, rest), xs)
    return ReplayResult(
        output=output,
        regularization_loss=jnp.mean(regularization),
        metrics={k: jnp.mean(v) for k, v in metrics.items()},
        carry=carries,
    )


def normalize_advantages(advantages: jax.Array) -> jax.Array:
    """Standardize over the minibatch; a single element (or constant
    advantages) gives zeros rather than NaN."""
    centered = advantages - jnp.mean(advantages)
    return centered / (jnp.std(advantages) + 1e-8)


def _policy_advantages(advantages, loglikelihoods, config: PPOConfig):
    """Pair advantages with log-likelihoods.

    Returns a list of ``(advantage [T, M], loglik_new_key, loglik_old_key)``
    selectors: per-key when advantages and log-likelihoods are dicts with the
    same keys (and ``combine_advantages`` is off), otherwise one combined
    advantage (sum over reward keys) for the joint log-likelihood.
    """
    if (
        isinstance(advantages, dict)
        and isinstance(loglikelihoods, dict)
        and set(advantages) == set(loglikelihoods)
        and not config.combine_advantages
    ):
        return {k: advantages[k] for k in advantages}
    return sum_leaves(advantages)


def ppo_loss(params, graphdef, rest, batch: Minibatch, config: PPOConfig):
    """Clipped-surrogate PPO loss on one minibatch.

    ``total = policy_loss + critic_loss_weight * value_loss + regularization``
    where regularization is the sum of the modules' ``regularization_loss``
    (entropy bonus, KL, ...), averaged over steps. Returns ``(total, metrics)``.
    """
    traj = batch.trajectory
    replay = replay_network(graphdef, params, rest, traj)
    new = replay.output

    advantages = _policy_advantages(batch.advantages, new.loglikelihoods, config)
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

    value_loss = sum_leaves(jax.tree.map(value_error, new.value_estimates, traj.values, batch.returns))
    total = policy_loss + config.critic_loss_weight * value_loss + replay.regularization_loss
    metrics = {
        "loss/total": total,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "loss/regularization": replay.regularization_loss,
        "policy/approx_kl": approx_kl,
        "policy/clip_fraction": clip_fraction,
        **{f"network/{k}": v for k, v in replay.metrics.items()},
    }
    return total, metrics
