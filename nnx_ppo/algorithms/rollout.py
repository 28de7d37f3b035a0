"""Rollout: run the network and the vmapped env for ``T`` steps.

The network is used functionally: ``graphdef`` (static), ``params`` (the
``nnx.Param`` state) and ``rest`` (every other variable: normalizer
statistics, RNG streams). Shapes: ``B = n_envs``, ``T = rollout_length``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.replay import select_where
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModuleOutput

__all__ = [
    "Trajectory",
    "RolloutState",
    "apply_network",
    "reset_network_state",
    "collect_rollout",
    "sum_leaves",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutState:
    """What carries over from one rollout to the next.

    Attributes:
      env_state: batched env state, leaves ``[B, ...]``.
      carry: network carry, leaves ``[B, ...]`` (post-reset: ready for the next step).
      episode_return: running return of the current episodes, ``[B]``.
      episode_length: running length of the current episodes, ``[B]`` int32.
      fresh: ``[B]`` bool, ``carry`` was just (re)initialized: the episode
        starts at the next step (True initially and after an episode ended
        on a rollout's last step).
    """

    env_state: Any
    carry: Any
    episode_return: jax.Array
    episode_length: jax.Array
    fresh: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One rollout, every leaf ``[T, B, ...]``.

    Attributes:
      obs: observations the network acted on.
      carry: network carry entering each step (after any reset).
      reset: ``[T, B]`` bool, the carry entering step ``t`` is a freshly
        initialized one (the episode ended at step ``t - 1``, or, at ``t = 0``,
        before the rollout began).
      extras: the ``rollout_extras`` the network emitted.
      actions, loglikelihoods, values: the network's outputs.
      rewards: rewards (a pytree when the env's are).
      terminated: ``[T, B]`` float, the episode ended for real.
      truncated: ``[T, B]`` float, a time limit ended the episode.
      final_values: value of the true final observation where truncated
        (zeros elsewhere and when bootstrapping is off).
    """

    obs: Any
    carry: Any
    reset: jax.Array
    extras: Any
    actions: Any
    loglikelihoods: Any
    values: Any
    rewards: Any
    terminated: jax.Array
    truncated: jax.Array
    final_values: Any


def apply_network(graphdef, params, rest, carry, obs, extras=None) -> tuple[StatefulModuleOutput, Any]:
    """Run the network once on a ``[B, ...]`` batch; returns its output and the
    updated non-parameter state (sampler RNG streams advance)."""
    net = nnx.merge(graphdef, params, rest)
    out = net(carry, obs, extras)
    _, _, rest = nnx.split(net, nnx.Param, ...)
    return out, rest


def reset_network_state(graphdef, params, rest, carry) -> tuple[Any, Any]:
    """``network.reset_state(carry)`` for the whole batch, functionally."""
    net = nnx.merge(graphdef, params, rest)
    fresh = net.reset_state(carry)
    _, _, rest = nnx.split(net, nnx.Param, ...)
    return fresh, rest


def sum_leaves(tree: Any) -> jax.Array:
    """Sum of the leaves of a pytree of equally shaped arrays (e.g. dict rewards)."""
    leaves = jax.tree.leaves(tree)
    total = leaves[0]
    for leaf in leaves[1:]:
        total = total + leaf
    return total


def _all_finite(tree: Any) -> jax.Array:
    """True when no float leaf of ``tree`` holds NaN or inf."""
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def _vmapped_reset(env, key, n):
    return jax.vmap(env.reset)(jax.random.split(key, n))


def collect_rollout(
    env,
    graphdef,
    params,
    rest,
    state: RolloutState,
    key: jax.Array,
    rollout_length: int,
    bootstrap_on_truncation: bool,
) -> tuple[Trajectory, RolloutState, Any, Any, dict[str, jax.Array]]:
    """Step the network and the envs ``rollout_length`` times.

    Ended episodes are reset (env and network carry) inside the scan. Returns
    ``(trajectory [T, B], next RolloutState, last_values [B], rest, stats)``
    where ``last_values`` is the value of the final observations (for GAE) and
    ``stats`` holds completed-episode sums and finiteness flags.
    """

    def step(carry, step_key):
        rest, rs = carry
        obs = rs.env_state.obs
        out, rest = apply_network(graphdef, params, rest, rs.carry, obs)
        net_out: PPONetworkOutput = out.output
        stepped = jax.vmap(env.step)(rs.env_state, net_out.actions)
        done = stepped.done > 0
        truncated = stepped.info["truncated"].astype(jnp.float32) * done
        terminated = done.astype(jnp.float32) * (1.0 - truncated)

        zero_values = jax.tree.map(jnp.zeros_like, net_out.value_estimates)
        if bootstrap_on_truncation:
            # Only steps where some env was truncated pay for this forward pass.
            final_values = jax.lax.cond(
                jnp.any(truncated > 0),
                lambda p, r, c, o: apply_network(graphdef, p, r, c, o)[0].output.value_estimates,
                lambda *_: zero_values,
                params, rest, out.next_state, stepped.obs,
            )
        else:
            final_values = zero_values

        reset_key, _ = jax.random.split(step_key)
        n = done.shape[0]
        env_state = jax.lax.cond(
            jnp.any(done),
            lambda: select_where(done, _vmapped_reset(env, reset_key, n), stepped),
            lambda: stepped,
        )
        fresh_carry, rest = reset_network_state(graphdef, params, rest, out.next_state)
        next_carry = select_where(done, fresh_carry, out.next_state)

        reward = sum_leaves(stepped.reward)
        ep_return = rs.episode_return + reward
        ep_length = rs.episode_length + 1
        donef = done.astype(jnp.float32)
        step_stats = {
            "completed_episodes": jnp.sum(donef),
            "completed_return_sum": jnp.sum(ep_return * donef),
            "completed_length_sum": jnp.sum(ep_length.astype(jnp.float32) * donef),
            "finite_reward": jnp.all(jnp.isfinite(reward)),
            "finite_obs": _all_finite(stepped.obs) & _all_finite(env_state.obs),
        }
        env_metrics = {f"env/{k}": jnp.mean(v) for k, v in stepped.metrics.items()}
        next_rs = RolloutState(
            env_state=env_state,
            carry=next_carry,
            episode_return=jnp.where(done, 0.0, ep_return),
            episode_length=jnp.where(done, 0, ep_length),
            fresh=done,
        )
        record = dict(
            obs=obs,
            carry=rs.carry,
            done=done,
            extras=out.rollout_extras,
            actions=net_out.actions,
            loglikelihoods=net_out.loglikelihoods,
            values=net_out.value_estimates,
            rewards=stepped.reward,
            terminated=terminated,
            truncated=truncated,
            final_values=final_values,
        )
        return (rest, next_rs), (record, step_stats, env_metrics, out.metrics)

    keys = jax.random.split(key, rollout_length)
    (rest, next_state), (rec, step_stats, env_metrics, net_metrics) = jax.lax.scan(step, (rest, state), keys)
    done = rec.pop("done")
    reset = jnp.concatenate([state.fresh[None], done[:-1]], axis=0)
    trajectory = Trajectory(reset=reset, **rec)

    last_out, _ = apply_network(graphdef, params, rest, next_state.carry, next_state.env_state.obs)
    stats = {
        "completed_episodes": jnp.sum(step_stats["completed_episodes"]),
        "completed_return_sum": jnp.sum(step_stats["completed_return_sum"]),
        "completed_length_sum": jnp.sum(step_stats["completed_length_sum"]),
        "finite_reward": jnp.all(step_stats["finite_reward"]),
        "finite_obs": jnp.all(step_stats["finite_obs"]),
    }
    stats.update({k: jnp.mean(v) for k, v in env_metrics.items()})
    stats.update({f"network/{k}": jnp.mean(v) for k, v in net_metrics.items()})
    return trajectory, next_state, last_out.output.value_estimates, rest, stats
