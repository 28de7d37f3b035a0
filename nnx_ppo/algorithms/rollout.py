"""Rollout: run the network and the vmapped env for ``T`` steps.

The network is used through its functional view
(:class:`~nnx_ppo.algorithms.functional.NetworkFn`). Shapes: ``B = n_envs``,
``T = rollout_length``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.networks.replay import select_where
from nnx_ppo.networks.types import PPONetworkOutput

__all__ = [
    "Trajectory",
    "RolloutState",
    "RolloutStats",
    "Rollout",
    "collect_rollout",
    "reset_ended",
    "sum_leaves",
    "all_finite",
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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutStats:
    """What the trainer reads from a rollout (scalars, summed over its ``T x B`` steps).

    Attributes:
      completed_episodes: episodes that ended.
      completed_return_sum: sum of their (undiscounted) returns.
      completed_length_sum: sum of their lengths.
      finite_reward: every reward was finite.
      finite_obs: every observation (after steps and after resets) was finite.
      nonfinite_rewards: env steps whose (summed) reward was NaN or inf.
      nonfinite_observations: NaN or inf numbers in the observations the
        envs returned (after steps, and after resets where an episode ended).
      nonfinite_actions: NaN or inf numbers in the actions the network took.
    """

    completed_episodes: jax.Array
    completed_return_sum: jax.Array
    completed_length_sum: jax.Array
    finite_reward: jax.Array
    finite_obs: jax.Array
    nonfinite_rewards: jax.Array
    nonfinite_observations: jax.Array
    nonfinite_actions: jax.Array

    @classmethod
    def total(cls, per_step: "RolloutStats") -> "RolloutStats":
        """Sum (flags: all) over a leading step axis."""
        return cls(
            completed_episodes=jnp.sum(per_step.completed_episodes),
            completed_return_sum=jnp.sum(per_step.completed_return_sum),
            completed_length_sum=jnp.sum(per_step.completed_length_sum),
            finite_reward=jnp.all(per_step.finite_reward),
            finite_obs=jnp.all(per_step.finite_obs),
            nonfinite_rewards=jnp.sum(per_step.nonfinite_rewards),
            nonfinite_observations=jnp.sum(per_step.nonfinite_observations),
            nonfinite_actions=jnp.sum(per_step.nonfinite_actions),
        )

    def metrics(self) -> dict[str, jax.Array]:
        """``train/...`` metrics of the completed episodes (count, mean
        return, mean length; means are 0 when no episode ended) and the
        ``health/nonfinite_...`` counts."""
        episodes = jnp.maximum(self.completed_episodes, 1.0)
        return {
            "train/completed_episodes": self.completed_episodes,
            "train/episode_return": self.completed_return_sum / episodes,
            "train/episode_length": self.completed_length_sum / episodes,
            "health/nonfinite_rewards": self.nonfinite_rewards,
            "health/nonfinite_observations": self.nonfinite_observations,
            "health/nonfinite_actions": self.nonfinite_actions,
        }


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout:
    """What :func:`collect_rollout` returns.

    Attributes:
      trajectory: the :class:`Trajectory`, leaves ``[T, B, ...]``.
      state: the :class:`RolloutState` the next rollout starts from.
      last_values: ``[B]`` values of the observations after the last step (for GAE).
      network: the network view after the rollout (its RNG streams advanced).
      stats: the :class:`RolloutStats` the trainer reads.
      metrics: only logged: ``env/...`` (the env's metrics) and
        ``network/...`` (the modules' metrics), averaged over steps.
    """

    trajectory: Trajectory
    state: RolloutState
    last_values: Any
    network: NetworkFn
    stats: RolloutStats
    metrics: dict[str, jax.Array]


def sum_leaves(tree: Any) -> jax.Array:
    """Sum of the leaves of a pytree of equally shaped arrays (e.g. dict rewards)."""
    leaves = jax.tree.leaves(tree)
    total = leaves[0]
    for leaf in leaves[1:]:
        total = total + leaf
    return total


def count_nonfinite(tree: Any, where: jax.Array | None = None) -> jax.Array:
    """float32 ``[]``: the NaN and inf numbers in the float leaves of ``tree``
    (leaves ``[B, ...]``; with ``where`` ``[B]``, only in those rows)."""
    counts = []
    for x in jax.tree.leaves(tree):
        if jnp.issubdtype(x.dtype, jnp.inexact):
            bad = ~jnp.isfinite(x)
            if where is not None:
                bad = bad & where.reshape(where.shape + (1,) * (x.ndim - where.ndim))
            counts.append(jnp.sum(bad, dtype=jnp.float32))
    return sum(counts, jnp.zeros((), jnp.float32))


def all_finite(tree: Any) -> jax.Array:
    """True when no float leaf of ``tree`` holds NaN or inf."""
    flags = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def reset_ended(env, done: jax.Array, stepped: Any, key: jax.Array) -> Any:
    """Env states ``[B, ...]`` with the ended envs (``done``) reset; the
    reset runs only on steps where some env ended.

    Leaves without the env axis (MuJoCo Warp keeps batch-wide contact
    counters ``[1]`` and empty contact buffers ``[0, ...]`` outside vmap's
    batch axis) are not per env: they are taken from the stepped states.
    """
    n = done.shape[0]
    per_env = lambda x: jnp.ndim(x) > 0 and x.shape[0] == n and jnp.size(x) > 0

    def select(fresh):
        return jax.tree.map(lambda f, s: select_where(done, f, s) if per_env(s) else s, fresh, stepped)

    fresh = lambda: jax.vmap(env.reset)(jax.random.split(key, n))
    return jax.lax.cond(jnp.any(done), lambda: select(fresh()), lambda: stepped)


def _truncation_values(network: NetworkFn, carry: Any, final_obs: Any, truncated: jax.Array,
                       zero_values: Any, enabled: bool) -> Any:
    """Values ``[B]`` of the true final observations where a time limit
    truncated the episode (zeros elsewhere, and when ``enabled`` is off).
    Only steps where some env was truncated pay for the forward pass."""
    if not enabled:
        return zero_values
    return jax.lax.cond(
        jnp.any(truncated > 0),
        lambda n, c, o: n.apply(c, o)[0].output.value_estimates,
        lambda *_: zero_values,
        network, carry, final_obs,
    )


def _episode_step(state: "RolloutState", reward: jax.Array, done: jax.Array, stepped_obs: Any,
                  next_obs: Any, actions: Any) -> tuple[RolloutStats, jax.Array, jax.Array]:
    """One step of episode bookkeeping: this step's :class:`RolloutStats`
    and the running returns and lengths ``[B]`` (zeroed where episodes ended)."""
    ep_return = state.episode_return + reward
    ep_length = state.episode_length + 1
    donef = done.astype(jnp.float32)
    # next_obs is stepped_obs where no episode ended: the two counts cover every observation once
    nonfinite_obs = count_nonfinite(stepped_obs) + count_nonfinite(next_obs, where=done)
    stats = RolloutStats(
        completed_episodes=jnp.sum(donef),
        completed_return_sum=jnp.sum(ep_return * donef),
        completed_length_sum=jnp.sum(ep_length.astype(jnp.float32) * donef),
        finite_reward=jnp.all(jnp.isfinite(reward)),
        finite_obs=nonfinite_obs == 0,
        nonfinite_rewards=jnp.sum(~jnp.isfinite(reward), dtype=jnp.float32),
        nonfinite_observations=nonfinite_obs,
        nonfinite_actions=count_nonfinite(actions),
    )
    return stats, jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length)


def collect_rollout(
    env,
    network: NetworkFn,
    state: RolloutState,
    key: jax.Array,
    rollout_length: int,
    bootstrap_on_truncation: bool,
    observe: Callable[[Any], Any] | None = None,
) -> Rollout:
    """Step the network and the envs ``rollout_length`` times.

    Ended episodes are reset (env and network carry) inside the scan; where a
    time limit truncated an episode (and ``bootstrap_on_truncation``), the
    value of the true final observation is recorded for GAE. ``observe``
    maps an env state to what the network sees (default: ``state.obs``; e.g.
    distillation adds a teacher's privileged view). See :class:`Rollout` for
    what is returned.
    """
    observe = observe or (lambda env_state: env_state.obs)

    def step(carry, step_key):
        net, rs = carry
        obs = observe(rs.env_state)
        with jax.named_scope("policy"):
            out, net = net.apply(rs.carry, obs)
        net_out: PPONetworkOutput = out.output
        with jax.named_scope("env_step"):
            stepped = jax.vmap(env.step)(rs.env_state, net_out.actions)
        done = stepped.done > 0
        truncated = stepped.info["truncated"].astype(jnp.float32) * done
        with jax.named_scope("truncation_bootstrap"):
            final_values = _truncation_values(net, out.next_state, observe(stepped), truncated,
                                              jax.tree.map(jnp.zeros_like, net_out.value_estimates),
                                              bootstrap_on_truncation)
        with jax.named_scope("env_reset"):
            env_state = reset_ended(env, done, stepped, jax.random.split(step_key)[0])
        fresh_carry, net = net.reset(out.next_state)
        step_stats, ep_return, ep_length = _episode_step(rs, sum_leaves(stepped.reward), done, stepped.obs,
                                                         env_state.obs, net_out.actions)
        next_rs = RolloutState(env_state=env_state, carry=select_where(done, fresh_carry, out.next_state),
                               episode_return=ep_return, episode_length=ep_length, fresh=done)
        record = dict(
            obs=obs,
            carry=rs.carry,
            done=done,
            extras=out.rollout_extras,
            actions=net_out.actions,
            loglikelihoods=net_out.loglikelihoods,
            values=net_out.value_estimates,
            rewards=stepped.reward,
            terminated=done.astype(jnp.float32) * (1.0 - truncated),
            truncated=truncated,
            final_values=final_values,
        )
        env_metrics = {f"env/{k}": jnp.mean(v) for k, v in stepped.metrics.items()}
        return (net, next_rs), (record, step_stats, env_metrics, out.metrics)

    keys = jax.random.split(key, rollout_length)
    (network, next_state), (rec, step_stats, env_metrics, net_metrics) = jax.lax.scan(step, (network, state), keys)
    done = rec.pop("done")
    reset = jnp.concatenate([state.fresh[None], done[:-1]], axis=0)
    with jax.named_scope("last_values"):
        last_out, _ = network.apply(next_state.carry, observe(next_state.env_state))
    metrics = {k: jnp.mean(v) for k, v in env_metrics.items()}
    metrics.update({f"network/{k}": jnp.mean(v) for k, v in net_metrics.items()})
    return Rollout(
        trajectory=Trajectory(reset=reset, **rec),
        state=next_state,
        last_values=last_out.output.value_estimates,
        network=network,
        stats=RolloutStats.total(step_stats),
        metrics=metrics,
    )
