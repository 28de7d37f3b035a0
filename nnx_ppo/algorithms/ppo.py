"""PPO's compiled iteration, read top to bottom in the order its data flows.

One iteration is a pure ``iteration(state) -> (state, IterationOutput)``
(:func:`make_iteration`), traced once; the sections of this module follow it:

1. the training state: what an iteration starts from and returns
   (:class:`TrainingState`; :func:`new_training_state` builds PPO's first);
2. the rollout: the network and the vmapped env for ``T`` steps
   (:func:`collect_rollout`, a :class:`Trajectory` ``[T, B]``);
3. the rewards GAE sees: scaled, optionally by a running return deviation
   (:class:`ReturnStatistics`);
4. GAE: advantages and value targets, terminations and truncations kept
   apart (:func:`compute_gae`);
5. the loss: minibatches of whole env sequences replayed from their stored
   carries, and the clipped surrogate (:func:`ppo_loss`);
6. the update: ``n_epochs x n_minibatches`` optimizer steps (:func:`make_optimizer`,
   :func:`update_epochs`);
7. the iteration: the above in order, with the :class:`Health` the driver
   checks (:func:`train_iteration`);
8. many iterations in one compiled program (:func:`compile_iterations`,
   :func:`make_train_fn`);
9. what a config needs in memory, estimated from shapes and checked before
   the first state is built (:func:`check_footprint`: one line refusing a
   config too large for the device, a warning when ``total_steps`` is
   rounded up more than 10x to whole iterations).

Shapes: ``B = n_envs``, ``T = rollout_length``, ``M`` the envs of one
minibatch. Besides this module the iteration reads the network's functional
view (:mod:`nnx_ppo.algorithms.functional`), the module contract it runs
(:mod:`nnx_ppo.networks.types`) and the config
(:mod:`nnx_ppo.algorithms.config`). The trainer runs it
(:func:`nnx_ppo.algorithms.trainer.train_ppo`: driver loop, evaluation,
checkpoints, resume, devices); distillation
(:mod:`nnx_ppo.algorithms.distillation`) reuses its rollout, loss replay and
update.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
import os
import pathlib
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental.layout import Layout, with_layout_constraint
from jax.sharding import NamedSharding, PartitionSpec

from nnx_ppo import _original_paths
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, check_seed_batching
from nnx_ppo.algorithms.distributed import SEED_AXIS
from nnx_ppo.algorithms.functional import (
    NetworkFn,
    ReplayMismatchError,
    check_network_matches_env,
    copy_tree,
    observing_calls,
)
from nnx_ppo.envs.registry import as_env
from nnx_ppo.networks.feedforward import compute_precision
from nnx_ppo.networks.normalizer import merge_moments
from nnx_ppo.networks.types import PPONetworkOutput, select_where

__all__ = [
    "NonFiniteError",
    "TrainingState", "new_training_state", "Trajectory", "RolloutStats", "collect_rollout", "ReturnStatistics",
    "compute_gae", "trajectory_gae", "split_minibatches", "ppo_loss", "make_optimizer", "update_epochs", "Health",
    "IterationOutput", "train_iteration", "with_hyperparameters", "compile_iterations", "stack_trees", "seed_slice",
    "enable_compilation_cache",
]


# -------------------------------------------------------------------------------------------------- the training state
# What an iteration starts from and returns (a pytree, donated to each compiled call), and PPO's first one.

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingState:
    """Everything that changes during training (a pytree; donated each call).

    Attributes:
      params: the network's ``nnx.Param`` state.
      rest: every other network variable (normalizer statistics, RNG streams).
      opt_state: optax state.
      rollout: env states, network carries and running episode statistics.
      key: the training PRNG key (env resets, minibatch shuffling).
      iteration: completed iterations (int32 scalar).
      return_stats: running discounted-return statistics (used with
        ``PPOConfig.normalize_rewards``).
      member: a population member's own hyperparameters, score and parent
        (a :class:`~nnx_ppo.algorithms._hyperparameters.MemberState`); None
        outside a population (one run, a seed batch: the config's numbers).
    """

    params: Any
    rest: Any
    opt_state: Any
    rollout: RolloutState
    key: jax.Array
    iteration: jax.Array
    return_stats: ReturnStatistics
    member: Any = None

    def next(self, *, network: Any, opt_state: Any, rollout: RolloutState, key: jax.Array,
             return_stats: ReturnStatistics | None = None) -> "TrainingState":
        """The state after one more iteration: ``network``'s (a
        :class:`~nnx_ppo.algorithms.functional.NetworkFn`) parameters and
        other variables, the new optimizer and rollout states and key, the
        iteration count plus one (``return_stats`` unchanged when None)."""
        return dataclasses.replace(
            self, params=network.params, rest=network.rest, opt_state=opt_state, rollout=rollout, key=key,
            iteration=self.iteration + 1,
            return_stats=self.return_stats if return_stats is None else return_stats,
        )


def new_training_state(env, network, config: TrainConfig) -> TrainingState:
    """Initial training state: resets ``config.ppo.n_envs`` envs (and
    de-synchronizes their time limits where the env asks for it, see
    :meth:`nnx_ppo.envs.TimeLimit.desynchronize`), initializes the network
    carry and the optimizer, in one program compiled with
    ``config.compiler_options``. Works on copies: ``network`` is not
    modified, and training never donates its arrays."""
    ppo = config.ppo
    env = as_env(env)
    check_network_matches_env(env, network, ppo)
    check_footprint(env, network, ppo, warn=False)  # (before anything of n_envs' size is allocated)
    check_backend_options(config.compiler_options)
    net = copy_tree(NetworkFn.of(network))
    program = _initial_program(env, net.graphdef, ppo, config.compiler_options)
    return program(jax.random.key(config.seed), net.params, net.rest)


def _initial_program(env, graphdef, ppo: PPOConfig, compiler_options: dict[str, Any] | None):
    """The jitted ``initial(key, params, rest) -> TrainingState`` of
    :func:`new_training_state`: the envs' first states, the network's
    initial carry ``[n_envs, ...]`` (it may draw from the network's Rngs:
    the state holds them advanced), the optimizer's and the return
    statistics' initial states, all in one program (each eager step or
    extra program costs a compile, up to seconds on an accelerator),
    compiled with the run's ``compiler_options``. Built for each call: the
    env is read as it is now."""

    def initial(key, params, rest):
        key, reset_key, sync_key = jax.random.split(key, 3)
        env_state = jax.vmap(env.reset)(jax.random.split(reset_key, ppo.n_envs))
        if hasattr(env, "desynchronize"):
            env_state = jax.vmap(env.desynchronize)(env_state, jax.random.split(sync_key, ppo.n_envs))
        carry, net = NetworkFn(graphdef, params, rest).initialize(ppo.n_envs)
        rollout = RolloutState(
            env_state=env_state,
            carry=carry,
            episode_return=jnp.zeros((ppo.n_envs,), jnp.float32),
            episode_length=jnp.zeros((ppo.n_envs,), jnp.int32),
            fresh=jnp.ones((ppo.n_envs,), bool),
        )
        return TrainingState(
            params=net.params,
            rest=net.rest,
            opt_state=make_optimizer(ppo).init(net.params),
            rollout=rollout,
            key=key,
            iteration=jnp.zeros((), jnp.int32),
            return_stats=initial_return_statistics(ppo.n_envs),
        )

    return jax.jit(initial, compiler_options=compiler_options)


# --------------------------------------------------------------------------------------------------------- the rollout
# The network (through its functional view) and the vmapped env for T steps; ended episodes, and the network's
# carries, are reset inside the scan.

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
      start_carry: network carry entering step 0, leaves ``[1, B, ...]``.
      carry: network carry entering each step (after any reset), leaves
        ``[T, B, ...]``. A leaf that every reset of the rollout sets to one
        value (it depends on the parameters only: an LSTM's zero or learned
        initial state, see :meth:`~nnx_ppo.algorithms.functional.NetworkFn.fixed_resets`)
        is kept once, ``[1, B, ...]``: that value (the replay needs the carry
        only where ``reset`` and at step 0). :meth:`stored_carry` expands it.
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
    start_carry: Any
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

    def stored_carry(self) -> Any:
        """The carry entering each step as the replay reads it, leaves ``[T, M, ...]``
        (``replay_sequence``'s ``stored_carry``): the rollout's at step 0 and
        wherever ``reset``; a leaf kept once holds its reset value at the other steps."""
        T = self.reset.shape[0]

        def leaf(start, kept):
            if T == 1:
                return start
            if kept.shape[0] == T:
                return kept
            return jnp.concatenate([start, jnp.broadcast_to(kept, (T - 1,) + kept.shape[1:])])

        return jax.tree.map(leaf, self.start_carry, self.carry)


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
        return jax.tree.map(lambda x: jnp.all(x) if x.dtype == jnp.bool_ else jnp.sum(x), per_step)

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
      trajectory: the :class:`Trajectory`, leaves ``[T, B, ...]`` (``[1, B, ...]`` where it says so).
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
    return functools.reduce(operator.add, jax.tree.leaves(tree))


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
    every_carry: bool = False,
) -> Rollout:
    """Step the network and the envs ``rollout_length`` times.

    Ended episodes are reset (env and network carry) inside the scan; where a
    time limit truncated an episode (and ``bootstrap_on_truncation``), the
    value of the true final observation is recorded for GAE. ``observe``
    maps an env state to what the network sees (default: ``state.obs``; e.g.
    distillation adds a teacher's privileged view). See :class:`Rollout` for
    what is returned.

    The carry leaves that every reset sets to one value (:meth:`NetworkFn.fixed_resets`)
    are computed once, before the scan, used by every reset and kept once in
    the trajectory; the others are recorded at every step. ``every_carry``
    records every leaf at every step (the replay diagnosis compares them step
    by step).
    """
    observe = observe or (lambda env_state: env_state.obs)
    treedef = jax.tree.structure(state.carry)
    fixed = network.fixed_resets(state.carry)
    fixed_values = jax.tree.leaves(network.reset(state.carry)[0])  # the view the reset advanced is not kept
    recorded = [every_carry or not f for f in fixed]

    def with_fixed(carry):
        """``carry`` with the fixed leaves computed before the scan."""
        return treedef.unflatten([v if f else x for f, v, x in zip(fixed, fixed_values, jax.tree.leaves(carry))])

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
        fresh_carry = with_fixed(fresh_carry)
        step_stats, ep_return, ep_length = _episode_step(rs, sum_leaves(stepped.reward), done, stepped.obs,
                                                         env_state.obs, net_out.actions)
        next_rs = RolloutState(env_state=env_state, carry=select_where(done, fresh_carry, out.next_state),
                               episode_return=ep_return, episode_length=ep_length, fresh=done)
        record = dict(
            obs=obs,
            carry=[x for x, r in zip(jax.tree.leaves(rs.carry), recorded) if r],
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
    per_step = iter(rec.pop("carry"))
    carry = treedef.unflatten([next(per_step) if r else v[None] for r, v in zip(recorded, fixed_values)])
    with jax.named_scope("last_values"):
        last_out, _ = network.apply(next_state.carry, observe(next_state.env_state))
    metrics = {k: jnp.mean(v) for k, v in env_metrics.items()}
    metrics.update({f"network/{k}": jnp.mean(v) for k, v in net_metrics.items()})
    return Rollout(
        trajectory=Trajectory(reset=reset, start_carry=jax.tree.map(lambda x: x[None], state.carry), carry=carry,
                              **rec),
        state=next_state,
        last_values=last_out.output.value_estimates,
        network=network,
        stats=RolloutStats.total(step_stats),
        metrics=metrics,
    )


# ------------------------------------------------------------------------------------------------ the rewards GAE sees
# Times PPOConfig.reward_scale and, with PPOConfig.normalize_rewards, divided by a running deviation of the
# discounted return; logged returns stay in the env's units.

_EPS = 1e-8


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ReturnStatistics:
    """Running statistics of the discounted return ``G_t = gamma * G_{t-1} +
    r_t`` of each env (reset when its episode ends).

    With ``PPOConfig.normalize_rewards`` every reward GAE sees is divided by
    ``sqrt(var(G) + eps)``, the variance a running one over every step
    trained on: value targets then have a scale near one whatever the env's
    reward scale, so the critic's gradient no longer dominates the
    global-norm clip.

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


def _learner_rewards(traj, stats: ReturnStatistics, config: PPOConfig):
    """The rewards GAE sees: times ``config.reward_scale``, then, with
    ``config.normalize_rewards``, divided by the running return deviation
    (the rollout folded into the return statistics first); returns the
    trajectory with them and the statistics."""
    if isinstance(config.reward_scale, jax.Array) or config.reward_scale != 1:  # (traced: a member's own)
        traj = dataclasses.replace(traj, rewards=jax.tree.map(lambda r: r * config.reward_scale, traj.rewards))
    if not config.normalize_rewards:
        return traj, stats
    done = jnp.maximum(traj.terminated, traj.truncated)
    stats = update_return_statistics(stats, sum_leaves(traj.rewards), done, config.discounting_factor)
    return dataclasses.replace(traj, rewards=scale_rewards(traj.rewards, stats)), stats


# ----------------------------------------------------------------------------------------------------------------- GAE
# Generalized advantage estimation, terminations and truncations kept apart.

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
    # V_next_t: values[t + 1] (last_value after the last step); where truncated, the true final observation's
    bootstrap = jnp.concatenate([values[1:], last_value[None]], axis=0)
    if bootstrap_on_truncation:
        bootstrap = jnp.where(truncated > 0, final_values, bootstrap)
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
      trajectory: a :class:`Trajectory` with
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
    return jax.tree.transpose(jax.tree.structure(trajectory.rewards), None, pairs)


# ------------------------------------------------------------------------------------------------------------ the loss
# One epoch's minibatches of whole env sequences [T, M], each replayed from the carry stored at the rollout's
# start (NetworkFn.replay: the stored extras fed back, carries reset where the rollout reset them), and the
# clipped surrogate on the replayed outputs.

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


def minibatch_indices(key: jax.Array, n_envs: int, n_minibatches: int, n_blocks: int = 1) -> jax.Array:
    """One epoch's random partition of the env axis into minibatches of whole env sequences.

    Returns int32 ``[n_minibatches, n_blocks, n_envs // (n_blocks * n_minibatches)]``:
    minibatch ``k`` takes, from each block ``g`` (a contiguous ``n_envs /
    n_blocks`` of the envs), the envs ``index[k, g]`` counted within the
    block. With one block it is a random permutation of the envs cut into
    ``n_minibatches`` parts; with ``n_blocks > 1`` the envs are permuted
    within each block and every minibatch takes an equal share of each (so
    under sharding over ``n_blocks`` devices no env sequence moves between
    devices). :func:`split_minibatches` gathers them.
    """
    per_block = n_envs // n_blocks
    if n_blocks == 1:
        perms = jax.random.permutation(key, n_envs)[None]
    else:
        perms = jax.vmap(lambda k: jax.random.permutation(k, per_block))(jax.random.split(key, n_blocks))
    return jnp.swapaxes(jnp.reshape(perms, (n_blocks, n_minibatches, per_block // n_minibatches)), 0, 1)


def _take_minibatch(data: Any, index: jax.Array) -> Any:
    """The minibatch ``index`` (``[n_blocks, M / n_blocks]``, one entry of
    :func:`minibatch_indices`) of ``data`` (a :class:`Minibatch` or any pytree
    of ``[T, B, ...]`` leaves, or ``[1, B, ...]``): leaves ``[T, M, ...]``
    (``[1, M, ...]``), block by block, in the row-major layout the replay
    reads (time, then env major; see :func:`split_minibatches`)."""
    return jax.tree.map(_row_major, _gather(data, index))


def _gather(data: Any, index: jax.Array) -> Any:
    """:func:`_take_minibatch` in the layout the compiler prefers."""
    n_blocks, per_minibatch = index.shape

    def take(x):
        if n_blocks == 1:
            return x.at[:, index[0]].get(mode="promise_in_bounds")
        T, B = x.shape[:2]
        blocks = jnp.reshape(x, (T, n_blocks, B // n_blocks) + x.shape[2:])
        taken = jax.vmap(lambda block, i: block.at[:, i].get(mode="promise_in_bounds"), in_axes=(1, 0),
                         out_axes=1)(blocks, index)
        return jnp.reshape(taken, (T, n_blocks * per_minibatch) + x.shape[2:])

    return jax.tree.map(take, data)


def split_minibatches(key: jax.Array, data: Any, n_minibatches: int, n_blocks: int = 1) -> Any:
    """One epoch's minibatches: ``data`` (a :class:`Minibatch` or any pytree)
    leaves ``[T, B, ...]`` become ``[n_minibatches, T, B // n_minibatches,
    ...]`` (the partition of :func:`minibatch_indices`; a ``[1, B, ...]``
    leaf likewise); scan over the leading axis for one epoch.

    They are laid out row-major in memory (minibatch, then time, then env
    major) whatever layout the gather would prefer, so that the replay reads
    each step's rows contiguously; left to itself, a TPU's compiler gave the
    gathered data an env-major layout (``bench/README.md``, "Where an
    iteration's time goes on the chip")."""
    B = jax.tree.leaves(data)[0].shape[1]
    indices = minibatch_indices(key, B, n_minibatches, n_blocks)
    batches = jax.vmap(lambda index: _gather(data, index))(indices)
    return jax.tree.map(_row_major, batches)


def _row_major(x: jax.Array) -> jax.Array:
    """``x`` laid out row-major in memory (minibatch, then time, then env
    major), whatever layout the gather that made it prefers; PRNG keys as they are."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return x
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


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


# graphdefs whose one-step regularization_loss was found scalar (checked once per network structure)
_SCALAR_REGULARIZATION: set = set()


def check_scalar_regularization(network: NetworkFn, trajectory: Any) -> None:
    """Raise a ``ValueError`` naming the module (path and class) whose
    ``regularization_loss`` is not a scalar; the loss adds it to a scalar.

    Checked on one step of ``trajectory`` (its first: carry, obs and extras;
    leaves ``[T, M, ...]``) with ``jax.eval_shape`` when the loss is traced,
    once per network structure: nothing runs, and the compiled program is
    unchanged. A module that returns a per-env loss ``[B]`` must average it
    itself (the modules' losses are summed as they are).
    """
    try:
        if network.graphdef in _SCALAR_REGULARIZATION:
            return
    except TypeError:  # an unhashable graphdef: check every time
        pass
    first = jax.tree.map(lambda x: x[0], (trajectory.start_carry, trajectory.obs, trajectory.extras))
    shapes = []

    def one_step(params, rest, step_inputs):
        module = nnx.merge(network.graphdef, params, rest)
        shapes.append(jnp.shape(module(*step_inputs).regularization_loss))

    try:
        jax.eval_shape(one_step, network.params, network.rest, first)
    except Exception:  # noqa: BLE001 -- not this check's to report: the replay below runs the same step and names it
        return
    if shapes[0] == ():
        try:
            _SCALAR_REGULARIZATION.add(network.graphdef)
        except TypeError:
            pass
        return
    raise ValueError(_non_scalar_regularization_message(network, first, shapes[0]))


def _non_scalar_regularization_message(network: NetworkFn, first: Any, shape: tuple) -> str:
    """The message naming the innermost module whose regularization_loss is
    not a scalar, found by tracing one step with every module's ``__call__``
    observed (:func:`~nnx_ppo.algorithms.functional.observing_calls`; only
    here, to name it)."""
    finished = []  # ((path, module), shape), in the order the calls return: inner modules first

    def record(path, module, call):
        out = call()
        finished.append(((path, module), jnp.shape(getattr(out, "regularization_loss", 0.0))))
        return out

    def one_step(params, rest, step_inputs):
        module = nnx.merge(network.graphdef, params, rest)
        with observing_calls(module, "__call__", record):
            module(*step_inputs)

    try:
        jax.eval_shape(one_step, network.params, network.rest, first)
    except Exception:  # noqa: BLE001 -- the message then names the network only
        finished.clear()
    culprit = next(((owner, s) for owner, s in finished if s != ()), None)
    if culprit is None:
        where, shape_seen = "the network", shape
    else:
        (path, module), shape_seen = culprit
        name = "/".join(str(k) for k in path) or "(the network itself)"
        where = f"module {name} ({type(module).__module__}.{type(module).__qualname__})"
    return (
        f"{where} returns a regularization_loss of shape {tuple(shape_seen)}; regularization_loss must be a "
        "scalar (the loss sums the modules' terms as they are): average a per-env term over the batch in the "
        "module, e.g. jnp.mean(...)"
    )


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
    instead of the rollout's. Returns ``(total, metrics)``. A module whose
    ``regularization_loss`` is not a scalar is a ``ValueError`` naming it
    (:func:`check_scalar_regularization`, when the loss is traced).
    """
    traj = batch.trajectory
    check_scalar_regularization(network.with_state(params=params), traj)
    replay = network.with_state(params=params).replay(traj, config.scan_unroll(jax.default_backend()))
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


# ---------------------------------------------------------------------------------------------------------- the update
# The optimizer, and n_epochs passes of n_minibatches gradient steps of any loss (PPO's; distillation's own).

def learning_rate_schedule(config: PPOConfig) -> Any:
    """The learning rate :func:`make_optimizer` gives optax: ``config.learning_rate``
    (a number or a schedule), or with ``learning_rate_decay`` the linear decay
    from it to 0 over the run's :attr:`~PPOConfig.total_updates`."""
    if config.learning_rate_decay:
        return optax.linear_schedule(config.learning_rate, 0.0, config.total_updates)
    return config.learning_rate


def _learning_rate_now(config: PPOConfig, opt_state: Any) -> jax.Array | None:
    """The rate the next update of ``opt_state`` takes (a schedule is read at
    its update count); None for an optimizer state without that count."""
    schedule = learning_rate_schedule(config)
    if not callable(schedule):
        return jnp.asarray(schedule, jnp.float32)
    is_count = lambda x: isinstance(x, optax.ScaleByScheduleState)
    counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=is_count) if is_count(s)]
    return jnp.asarray(schedule(counts[0]), jnp.float32) if counts else None


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Adam (AdamW with ``weight_decay``), optional global-norm clipping and
    linear learning-rate decay to zero over ``total_steps``.

    A ``config.learning_rate`` schedule (a callable, e.g. from
    ``optax.schedules``) is passed to optax as it is: it is called with the
    optimizer's update count, which advances once per minibatch update, so a
    training run makes ``n_iterations * n_epochs * n_minibatches`` updates
    (the count is part of the optimizer state: a resumed run continues it,
    and each seed of :func:`~nnx_ppo.algorithms.population.train_seeds` has its
    own)."""
    lr = learning_rate_schedule(config)
    adam = optax.adamw(lr, weight_decay=config.weight_decay) if config.weight_decay else optax.adam(lr)
    if config.gradient_clipping is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.gradient_clipping), adam)


def update_epochs(network: NetworkFn, optimizer: optax.GradientTransformation, opt_state: Any,
                  data: Any, key: jax.Array, config: PPOConfig,
                  loss_fn: Callable | None = None) -> tuple[NetworkFn, Any, dict]:
    """``n_epochs`` passes of ``n_minibatches`` gradient steps (nested scans).

    ``data`` leaves are ``[T, B, ...]`` (a :class:`Minibatch`
    for PPO); each epoch permutes the env axis into ``n_minibatches`` parts
    (:func:`minibatch_indices`), and each gradient step gathers its part's
    whole env sequences, ``[T, B / n_minibatches, ...]``, when it comes (the
    minibatches of :func:`split_minibatches`, one at a time). ``loss_fn(params,
    network, minibatch) -> (loss, metrics)`` defaults to :func:`ppo_loss`
    with ``config`` (distillation passes its own). Returns the network with
    new ``params``, the optimizer state and the mean metrics (``replay/...``
    metrics: those of the first minibatch, before any update;
    ``train/learning_rate``: the mean rate of the updates made). With
    ``config.target_kl`` the updates stop early once a minibatch's
    ``policy/approx_kl`` exceeds ``1.5 * target_kl``.
    """
    if loss_fn is None:
        loss_fn = lambda params, net, batch: ppo_loss(params, net, batch, config)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    B = jax.tree.leaves(data)[0].shape[1]

    def minibatch_step(carry, index):
        params, opt_state, stopped = carry
        with jax.named_scope("minibatch_gather"):
            batch = _take_minibatch(data, index)
        with jax.named_scope("loss"):
            (_, metrics), grads = grad_fn(params, network, batch)
        rate = _learning_rate_now(config, opt_state)  # (logged only: the update below computes its own)
        if rate is not None:
            metrics["train/learning_rate"] = rate
        with jax.named_scope("optimizer"):
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            metrics["optimizer/grad_norm"] = optax.tree.norm(grads)
            metrics["health/nonfinite_gradients"] = count_nonfinite(grads)
        if config.target_kl is None or "policy/approx_kl" not in metrics:
            return (new_params, new_opt_state, stopped), metrics
        # Early stop: this minibatch's policy already moved too far; skip its update and the rest.
        stopped = stopped | (metrics["policy/approx_kl"] > 1.5 * config.target_kl)
        keep = lambda new, old: jnp.where(stopped, old, new)
        metrics["optimizer/updates_skipped"] = stopped.astype(jnp.float32)
        return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state), stopped), metrics

    def epoch(carry, epoch_key):
        indices = minibatch_indices(epoch_key, B, config.n_minibatches, config.shuffle_blocks)
        return jax.lax.scan(minibatch_step, carry, indices)

    keys = jax.random.split(key, config.n_epochs)
    (params, opt_state, _), metrics = jax.lax.scan(epoch, (network.params, opt_state, jnp.asarray(False)), keys)
    # replay/*: measured on the first minibatch, before any update (must be ~0).
    rates = metrics.pop("train/learning_rate", None)
    skipped = metrics.get("optimizer/updates_skipped")
    metrics = {k: v[0, 0] if k.startswith("replay/") else jnp.sum(v) if k.startswith("health/") else jnp.mean(v)
               for k, v in metrics.items()}
    if rates is not None:
        metrics["train/learning_rate"] = _mean_rate(rates, skipped)
    return network.with_state(params=params), opt_state, metrics


def _mean_rate(rates: jax.Array, skipped: jax.Array | None) -> jax.Array:
    """The mean learning rate of the updates made (``[n_epochs, n_minibatches]``
    rates; with ``target_kl``, those not ``skipped``; the first's when none was made)."""
    if skipped is None:
        return jnp.mean(rates)
    made = 1.0 - skipped
    return jnp.where(jnp.sum(made) > 0, jnp.sum(rates * made) / jnp.maximum(jnp.sum(made), 1.0), rates[0, 0])


# ------------------------------------------------------------------------------------------------------- the iteration
# The sections above in order (train_iteration), and what the driver reads of each iteration (Health).

class NonFiniteError(FloatingPointError):
    """Raised when rewards, observations or the loss stop being finite."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Health:
    """Flags the driver checks after every iteration (scalars, with a seed
    axis ``[S]`` when seeds are batched). Built by :meth:`measure`.

    Attributes:
      finite_obs, finite_reward, finite_loss: no NaN/inf in them.
      replay_error: the largest |log ratio| or value difference between the
        replay and the rollout on the first minibatch, before any update.
      replay_ok: ``replay_error`` is within the tolerance (or not checked).
    """

    finite_obs: jax.Array
    finite_reward: jax.Array
    finite_loss: jax.Array
    replay_error: jax.Array
    replay_ok: jax.Array

    @classmethod
    def measure(cls, stats: Any, loss: jax.Array, replay_error: jax.Array,
                replay_tolerance: float | None) -> "Health":
        """The health of one iteration (traceable): ``stats`` is the rollout's
        :class:`RolloutStats`, ``loss`` the mean total loss, ``replay_error``
        the replay measurement, checked against ``replay_tolerance`` (None:
        not checked)."""
        return cls(finite_obs=stats.finite_obs, finite_reward=stats.finite_reward, finite_loss=jnp.isfinite(loss),
                   replay_error=replay_error,
                   replay_ok=jnp.asarray(True) if replay_tolerance is None else replay_error <= replay_tolerance)

    @property
    def ok(self) -> jax.Array:
        """Every flag holds (per seed with a seed axis; traceable)."""
        return self.finite_obs & self.finite_reward & self.finite_loss & self.replay_ok

    def error(self, iteration: int, index: int | None = None) -> NonFiniteError | ReplayMismatchError | None:
        """The error for the first failing flag at ``iteration`` (host
        values), or None when healthy. With a seed axis, ``index`` picks one
        seed's flags; without it, every seed counts and the message lists
        the failing seed indices."""
        pick = (lambda x: np.asarray(x)) if index is None else (lambda x: np.asarray(x)[index])
        for flag, what, hint in (
            (self.finite_obs, "observations", "check the environment"),
            (self.finite_reward, "rewards", "check the environment"),
            (self.finite_loss, "the loss", "check the learning rate and the network"),
        ):
            flag = pick(flag)
            if not flag.all():
                where = f" (seed indices {np.flatnonzero(~flag).tolist()})" if flag.ndim else ""
                return NonFiniteError(
                    f"non-finite values (NaN or inf) in {what} at iteration {iteration}{where}; {hint}")
        if not pick(self.replay_ok).all():
            error = float(np.max(pick(self.replay_error)))
            return ReplayMismatchError(
                f"at iteration {iteration} the loss replay did not reproduce the rollout before the first update "
                f"(max |log ratio| or value difference {error:.2e}, above PPOConfig.replay_tolerance): usually a "
                "module breaks the rules of docs/custom_modules.md (it draws from a class-level nnx.Rngs, writes a "
                "variable in __call__, or its replay_sequence reads stored_carry where the rollout did not reset "
                "it); nnx_ppo.check_replay_consistency(network, env) reports where the replay departs.")
        return None

    def check(self, iteration: int) -> None:
        """Raise :meth:`error` if there is one."""
        error = self.error(iteration)
        if error is not None:
            raise error


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class IterationOutput:
    """What one compiled iteration reports: ``health`` (read by the driver)
    and ``metrics`` (scalars, only logged)."""

    health: Health
    metrics: dict[str, jax.Array]


def _explained_variance(values, returns):
    values, returns = sum_leaves(values), sum_leaves(returns)
    return 1.0 - jnp.var(returns - values) / (jnp.var(returns) + 1e-8)


def train_iteration(env, graphdef, optimizer: optax.GradientTransformation, config: PPOConfig,
                    state: TrainingState) -> tuple[TrainingState, IterationOutput]:
    """One PPO iteration (pure; traced inside :func:`make_train_fn`).

    1. rollout ``[T, B]`` from the carried env states and network carries;
    2. GAE advantages and value targets ``[T, B]`` (rewards scaled as ``_learner_rewards`` says);
    3. ``n_epochs x n_minibatches`` replays of whole env sequences and updates;
    4. ``update_statistics`` with the rollout's ``[T, B, ...]`` extras.

    Returns the next state and the iteration's :class:`IterationOutput`.
    """
    key, rollout_key, epoch_key = jax.random.split(state.key, 3)
    network = NetworkFn(graphdef, state.params, state.rest)
    with jax.named_scope("rollout"):
        rollout = collect_rollout(env, network, state.rollout, rollout_key, config.rollout_length,
                                  config.bootstrap_on_truncation)
    traj, stats = rollout.trajectory, rollout.stats
    with jax.named_scope("advantages"):
        reward_mean = jnp.mean(sum_leaves(traj.rewards))  # in the env's units
        traj, return_stats = _learner_rewards(traj, state.return_stats, config)
        advantages, returns = trajectory_gae(traj, traj.values, rollout.last_values, config)
    data = Minibatch(trajectory=traj, advantages=advantages, returns=returns,
                     last_values=jax.tree.map(lambda v: v[None], rollout.last_values))
    with jax.named_scope("update"):
        network, opt_state, loss_metrics = update_epochs(rollout.network, optimizer, state.opt_state, data,
                                                         epoch_key, config)
    with jax.named_scope("statistics"):
        network = network.update_statistics(traj.extras)

    metrics = {
        **loss_metrics,
        **rollout.metrics,
        "value/explained_variance": _explained_variance(traj.values, returns),
        "train/reward_mean": reward_mean,
        **stats.metrics(),
    }
    if config.normalize_rewards:
        metrics["train/return_std"] = jnp.sqrt(return_stats.var)
    health = Health.measure(stats, loss_metrics["loss/total"], loss_metrics["replay/max_error"],
                            config.replay_tolerance)
    next_state = state.next(network=network, opt_state=opt_state, rollout=rollout.state, key=key,
                            return_stats=return_stats)
    return next_state, IterationOutput(health=health, metrics=metrics)


def with_hyperparameters(ppo: PPOConfig, values: dict[str, Any] | None) -> PPOConfig:
    """``ppo`` with the numbers in ``values`` (a population member's
    :data:`~nnx_ppo.algorithms._hyperparameters.PER_MEMBER` numbers, from its
    state: traced scalars inside the compiled iteration) in place of its
    own; ``ppo`` itself when ``values`` is None (a single run or a seed
    batch, whose numbers are constants). The copy is not validated again:
    its numbers were validated as each member's config."""
    if values is None:
        return ppo
    member = copy.copy(ppo)
    for name, value in values.items():
        object.__setattr__(member, name, value)
    return member


def make_iteration(env, graphdef, config: PPOConfig) -> Callable:
    """``fn(state) -> (state, IterationOutput)``: :func:`train_iteration` with
    its optimizer, for the state's own hyperparameters when it carries them
    (a member of a population, see :func:`with_hyperparameters`)."""

    def iteration(state: TrainingState):
        ppo = config if state.member is None else with_hyperparameters(config, state.member.hyperparameters)
        with compute_precision(config.precision):
            return train_iteration(env, graphdef, make_optimizer(ppo), ppo, state)

    return iteration


# ----------------------------------------------------------------------------- many iterations in one compiled program
# Up to max_iterations iterations of any trainer's iteration (PPO's, distillation's) in one XLA call, a seed
# batch's [S, ...] included; a persistent cache keeps compiled programs on disk.

def keep_last_healthy(iteration: Callable) -> Callable:
    """``iteration`` that returns its input state unchanged when the
    iteration's health fails (non-finite values, replay mismatch), so a
    failed seed of a batch stays at its last healthy state (with its key,
    so every later iteration repeats the same failure and is discarded too).
    The output (health and metrics) is the failed iteration's."""

    def guarded(state):
        next_state, output = iteration(state)
        ok = output.health.ok
        return jax.tree.map(lambda new, old: jnp.where(ok, new, old), next_state, state), output

    return guarded


def over_seeds(iteration: Callable, seed_batching: str = "vmap", shardings: Any = None) -> Callable:
    """``iteration`` for a state whose leaves have a leading seed axis ``[S, ...]``.

    ``"vmap"``: every operation batched over the seeds. ``"map"``: the seeds
    one after another (``jax.lax.map``), each seed's operations at their own
    size; when ``shardings`` split the seed axis over devices
    (:func:`~nnx_ppo.algorithms.distributed.seed_shardings`), each device runs
    its own seeds in turn (``jax.shard_map``), all devices at once.
    """
    check_seed_batching(seed_batching)
    if seed_batching == "vmap":
        return jax.vmap(iteration)

    in_turn = functools.partial(jax.lax.map, iteration)
    mesh = None if shardings is None else jax.tree.leaves(shardings)[0].mesh
    if mesh is None or SEED_AXIS not in mesh.axis_names:
        return in_turn  # one device, or every seed's envs split: XLA partitions each seed's step
    by_seed = PartitionSpec(SEED_AXIS)
    # Nothing crosses devices: each device's seeds are independent trainings.
    return jax.shard_map(in_turn, mesh=mesh, in_specs=by_seed, out_specs=by_seed, check_vma=False)


def compile_iterations(iteration: Callable, max_iterations: int, batched_seeds: bool = False,
                       shardings: Any = None, seed_batching: str = "vmap",
                       population_step: Callable | None = None,
                       compiler_options: dict[str, Any] | None = None) -> Callable:
    """Jit ``iteration(state) -> (state, IterationOutput)`` into
    ``fn(state, n) -> (state, IterationOutput)`` running ``n <=
    max_iterations`` iterations in one call (``n`` is a runtime value, so a
    shorter last call does not recompile); output leaves are
    ``[max_iterations, ...]``, rows ``>= n`` unused. The input state's
    buffers are donated. The state is guarded by :func:`keep_last_healthy`:
    an iteration whose health fails leaves it as it was.

    With ``batched_seeds`` every state leaf has a leading seed axis
    ``[S, ...]``: the iteration runs over it as ``seed_batching`` says (see
    :func:`over_seeds`), each seed guarded on its own (outputs
    ``[max_iterations, S, ...]``). With ``shardings`` (see
    :func:`~nnx_ppo.algorithms.distributed.place`) the state keeps that
    sharding in and out, and the outputs are replicated.

    ``population_step(state, output) -> (state, output)`` (a population, see
    :func:`~nnx_ppo.algorithms.population.population_step`) runs on the whole batch
    after every batched iteration: what crosses members (scores, PBT).

    ``compiler_options`` (``TrainConfig.compiler_options``) go to XLA's
    compiler for this program; options the default backend does not have
    raise a ValueError here (see :func:`check_backend_options`).
    """
    check_backend_options(compiler_options)
    iteration = keep_last_healthy(iteration)
    if batched_seeds:
        iteration = over_seeds(iteration, seed_batching, shardings)
        if population_step is not None:
            batched = iteration
            iteration = lambda state: population_step(*batched(state))  # noqa: E731

    if max_iterations == 1:
        def run(state, n):
            del n
            state, output = iteration(state)
            return state, jax.tree.map(lambda m: m[None], output)
    else:
        def run(state, n):
            shapes = jax.eval_shape(iteration, state)[1]
            buffer = jax.tree.map(lambda m: jnp.zeros((max_iterations,) + m.shape, m.dtype), shapes)

            def body(i, carry):
                state, buffer = carry
                state, output = iteration(state)
                buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, output)
                return state, buffer

            return jax.lax.fori_loop(0, n, body, (state, buffer))

    if shardings is None:
        return jax.jit(run, donate_argnums=0, compiler_options=compiler_options)
    replicated = NamedSharding(jax.tree.leaves(shardings)[0].mesh, PartitionSpec())
    return jax.jit(run, donate_argnums=0, in_shardings=(shardings, replicated), out_shardings=(shardings, replicated),
                   compiler_options=compiler_options)


def check_backend_options(compiler_options: dict[str, Any] | None) -> None:
    """Raise a ValueError naming ``TrainConfig.compiler_options`` when XLA's
    compiler for the default backend rejects them (an option of another
    backend's, such as a TPU option on a CPU), by compiling a one-operation
    program with them: before the training program's long compile, not
    after it. None or empty: nothing to check. Options a backend accepted
    are not compiled for again (a run checks them for its initial state and
    for its training program)."""
    if not compiler_options:
        return
    checked = (jax.default_backend(), tuple(sorted(compiler_options.items())))
    if checked in _ACCEPTED_OPTIONS:
        return
    try:
        jax.jit(lambda x: x + 1, compiler_options=compiler_options).lower(jnp.zeros((), jnp.float32)).compile()
    except Exception as err:  # noqa: BLE001 (XLA's error type varies; its message is kept)
        raise ValueError(f"TrainConfig.compiler_options {compiler_options!r}: XLA's compiler for "
                         f"{jax.default_backend()} rejects them: {err}") from None
    _ACCEPTED_OPTIONS.add(checked)


_ACCEPTED_OPTIONS: set[tuple] = set()
"""``(backend, sorted option items)`` that :func:`check_backend_options` saw compile."""


def make_train_fn(env, graphdef, config: PPOConfig, max_iterations: int, batched_seeds: bool = False,
                  shardings=None, seed_batching: str = "vmap") -> Callable:
    """PPO's iterations compiled into one program (see
    :func:`compile_iterations` for the arguments):
    ``fn(state, n) -> (state, IterationOutput)``; the input state is donated."""
    return compile_iterations(make_iteration(env, graphdef, config), max_iterations, batched_seeds, shardings,
                              seed_batching)


def stack_trees(trees: Sequence[Any]) -> Any:
    """Stack equally shaped pytrees on a new leading axis (PRNG keys included)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, index: int) -> Any:
    """The ``index``-th entry of every leaf's leading (seed) axis."""
    return jax.tree.map(lambda x: x[index], tree)


def enable_compilation_cache(path: str | os.PathLike | None = None, min_compile_seconds: float = 1.0) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in ``path`` (created if needed).

    The cached executable is the one XLA built for the same program, so
    results do not change; only the compile is skipped. ``nnx-ppo`` calls
    this for every command that compiles (docs/cli.md).

    Args:
      path: the cache folder; default ``$XDG_CACHE_HOME/nnx_ppo/jax`` (``~/.cache/nnx_ppo/jax``).
      min_compile_seconds: programs that compiled faster than this are not stored.

    Returns the folder. Programs compiled after the call are cached (and
    looked up); call it before the first training iteration compiles.
    """
    from jax.experimental.compilation_cache import compilation_cache

    if path is None:
        path = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache", "nnx_ppo", "jax")
    folder = pathlib.Path(path).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # so a cache already initialized (or disabled) picks up the new folder
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder


# ----------------------------------------------------------------------------- memory: what a config needs


TRAJECTORY_COPIES = 4
"""How many times an iteration holds its trajectory: as recorded, gathered
for an epoch, one minibatch's replay activations kept for the backward pass
(about one more), and the next rollout's buffer while XLA reuses none of them."""


class FootprintError(ValueError):
    """A config whose buffers cannot fit in the memory it would train in."""


class FootprintWarning(UserWarning):
    """A config that trains far more env steps than asked for (whole iterations)."""


def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):  # a typed key: its raw data (2 uint32 for threefry)
        return 4 * math.prod(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape)
    return np.dtype(dtype).itemsize


def _tree_bytes(tree: Any) -> int:
    return sum(math.prod(leaf.shape) * _itemsize(leaf.dtype) for leaf in jax.tree.leaves(tree))


def estimate_bytes(env, network, n_envs: int, rollout_length: int, entries: int = 1) -> int:
    """Bytes of the buffers an iteration of ``entries`` members with
    ``n_envs`` envs each holds at least: per env, its state and the
    network's carry (twice: before and after a step) and, per rollout step,
    the observation, the carry leaves recorded at every step (those a reset
    does not set to one fixed value: :func:`collect_rollout`) and a dozen scalars
    (action, log-likelihood, value, reward, done, ...), :data:`TRAJECTORY_COPIES`
    times. Computed from shapes (``jax.eval_shape``), nothing allocated."""
    from nnx_ppo.algorithms.functional import NetworkFn

    state = jax.eval_shape(lambda key: env.reset(key), jax.random.key(0))
    view = NetworkFn.of(network)
    carry = jax.eval_shape(lambda view: view.initialize(1)[0], view)
    recorded = [leaf for leaf, f in zip(jax.tree.leaves(carry), view.fixed_resets(carry)) if not f]
    obs, per_env_state, per_env_carry = _tree_bytes(state.obs), _tree_bytes(state), _tree_bytes(carry)
    per_step = obs + _tree_bytes(recorded) + 12 * 4
    per_env = 2 * (per_env_state + per_env_carry) + TRAJECTORY_COPIES * rollout_length * per_step
    return entries * n_envs * per_env


def available_bytes(device=None) -> tuple[int | None, str]:
    """``(bytes, what)`` of memory the program can use on ``device`` (the
    first device by default): an accelerator's memory limit, or the host's
    physical memory for a CPU; None where it cannot be read."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        limit = stats.get("bytes_limit")
        return (int(limit), f"{device.device_kind} memory") if limit else (None, "")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    except (ValueError, OSError, AttributeError):
        return None, ""


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def check_footprint(env, network, ppo, entries: int = 1, devices: int = 1, warn: bool = True) -> None:
    """Refuse ``ppo`` (a :class:`~nnx_ppo.algorithms.config.PPOConfig`) in one
    line when its buffers (:func:`estimate_bytes`, split over ``devices``)
    cannot fit in one device's memory (:func:`available_bytes`); with
    ``warn``, warn when ``total_steps`` is rounded up by more than 10x to
    whole iterations."""
    per_iteration = ppo.n_envs * ppo.rollout_length
    if warn and ppo.total_steps and per_iteration > 10 * ppo.total_steps:
        warnings.warn(f"ppo.total_steps {ppo.total_steps:,} is rounded up to one iteration of {per_iteration:,} env "
                      f"steps (n_envs {ppo.n_envs:,} x rollout_length {ppo.rollout_length}), "
                      f"{per_iteration / ppo.total_steps:,.0f}x as many; lower n_envs or raise total_steps",
                      FootprintWarning, stacklevel=3)
    need = estimate_bytes(env, network, ppo.n_envs, ppo.rollout_length, entries) / max(devices, 1)
    have, where = available_bytes()
    if have is not None and need > have:
        members = f" x {entries} members" if entries > 1 else ""
        raise FootprintError(f"this config needs at least {_gb(need)} for its rollout buffers (n_envs "
                             f"{ppo.n_envs:,} x rollout_length {ppo.rollout_length}{members}), more than the "
                             f"{_gb(have)} of {where}; lower n_envs or rollout_length")


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
