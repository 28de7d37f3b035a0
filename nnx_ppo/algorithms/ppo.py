"""PPO: its training state, its iteration and :func:`train_ppo`.

Reading order: :func:`~nnx_ppo.algorithms.state.new_training_state` (what
an iteration starts from, defined with the state), :func:`train_iteration`
(rollout -> advantages -> epochs of minibatch replay and updates ->
statistics; pure, traced once), then :func:`train_ppo`, which
hands both to the one trainer (:func:`nnx_ppo.algorithms.trainer.train`:
compiled program, driver loop, evaluation, checkpoints, resume, devices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Unpack

import jax
import jax.numpy as jnp
import optax

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.driver import Health, IterationOutput
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.gae import trajectory_gae
from nnx_ppo.algorithms.hyperparameters import with_hyperparameters
from nnx_ppo.algorithms.losses import Minibatch
from nnx_ppo.algorithms.optimization import make_optimizer, update_epochs
from nnx_ppo.algorithms.program import compile_iterations
from nnx_ppo.algorithms.reward_scaling import (
    ReturnStatistics,
    scale_rewards,
    update_return_statistics,
)
from nnx_ppo.algorithms.rollout import collect_rollout, sum_leaves
from nnx_ppo.algorithms.state import TrainingState, TrainResult, new_training_state
from nnx_ppo.algorithms.trainer import Algorithm, TrainOptions, train
from nnx_ppo.networks.feedforward import compute_precision

__all__ = ["PPO", "new_training_state", "train_iteration", "make_train_fn", "train_ppo"]


def _explained_variance(values, returns):
    values, returns = sum_leaves(values), sum_leaves(returns)
    return 1.0 - jnp.var(returns - values) / (jnp.var(returns) + 1e-8)


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


def make_train_fn(env, graphdef, config: PPOConfig, max_iterations: int, batched_seeds: bool = False,
                  shardings=None, seed_batching: str = "vmap") -> Callable:
    """PPO's iterations compiled into one program (see
    :func:`~nnx_ppo.algorithms.program.compile_iterations` for the arguments):
    ``fn(state, n) -> (state, IterationOutput)``; the input state is donated."""
    return compile_iterations(_iteration(env, graphdef, config), max_iterations, batched_seeds, shardings,
                              seed_batching)


def _iteration(env, graphdef, config: PPOConfig) -> Callable:
    """``fn(state) -> (state, IterationOutput)``: :func:`train_iteration` with
    its optimizer, for the state's own hyperparameters when it carries them
    (a member of a population, see :mod:`nnx_ppo.algorithms.hyperparameters`)."""

    def iteration(state: TrainingState):
        ppo = config if state.member is None else with_hyperparameters(config, state.member.hyperparameters)
        with compute_precision(config.precision):
            return train_iteration(env, graphdef, make_optimizer(ppo), ppo, state)

    return iteration


PPO = Algorithm(initial_state=new_training_state, iteration=_iteration)
"""PPO for :func:`nnx_ppo.algorithms.trainer.train` (also used by
:func:`~nnx_ppo.algorithms.population.train_seeds`)."""


def train_ppo(
    env,
    network,
    config: TrainConfig,
    *,
    state: TrainingState | None = None,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train ``network`` on ``env`` with PPO; the network is updated in place.

    Args:
      env: an env with the ``reset(key)`` / ``step(state, action)`` API
        (see :mod:`nnx_ppo.envs`), or anything :func:`~nnx_ppo.envs.as_env` accepts.
      network: a :class:`StatefulModule` whose output is a
        :class:`PPONetworkOutput` (e.g. from :mod:`nnx_ppo.networks.factories`),
        or its name, built here from ``config.seed``: ``"mlp"``, ``"lstm"``,
        ``"gru"`` (the default preset's width), your function as
        ``"MODULE:FUNCTION"`` or ``"FILE.py:FUNCTION"`` (called as
        ``function(env, rngs)``), or a :class:`~nnx_ppo.network_spec.NetworkSpec`.
        A named network lets ``nnx-ppo eval`` and ``--resume`` rebuild a
        ``run_dir``'s network; the trained one is ``result.network``.
      config: the :class:`TrainConfig`.
      state: continue from this training state instead of a fresh one.
      on_evaluation: called after every evaluation as
        ``on_evaluation(policy, env_steps)`` with the evaluated policy (a
        :class:`NetworkFn` in eval mode), e.g. to record a video of it.
      **options: the :class:`~nnx_ppo.algorithms.trainer.TrainOptions`
        (``log_fn``, ``eval_env``, ``checkpoint_dir``, ``resume_from``,
        ``checkpoint_metadata``, ``should_stop``, ``run_dir``, ``progress``).

    Raises:
      NonFiniteError: NaN/inf in rewards, observations or the loss, at the
        iteration where it happened; the network then holds the last finite
        parameters (those of the iteration before).
      ReplayMismatchError: the loss replay did not reproduce the rollout (a
        module breaks the randomness rules).
    """
    [result] = train(PPO, env, config, network=network, state=state, on_evaluation=on_evaluation, **options)
    return result
