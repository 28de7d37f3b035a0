"""What training carries from call to call (:class:`TrainingState`) and
what a training run returns (:class:`TrainResult`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from nnx_ppo.algorithms.driver import Failure
from nnx_ppo.algorithms.reward_scaling import ReturnStatistics
from nnx_ppo.algorithms.rollout import RolloutState

__all__ = ["TrainingState", "TrainResult"]


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
        (a :class:`~nnx_ppo.algorithms.hyperparameters.MemberState`); None
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


@dataclasses.dataclass
class TrainResult:
    """What :func:`~nnx_ppo.algorithms.ppo.train_ppo` returns (and
    :func:`~nnx_ppo.algorithms.seeds.train_seeds` per seed).

    Attributes:
      state: the final :class:`TrainingState` (the network was updated in
        place too); for a failed seed, the state of its last healthy iteration.
      metrics: metrics of the last iteration.
      eval_history: ``(env_steps, eval metrics)`` of every evaluation.
      total_steps: env steps trained (a failed seed's: up to its last healthy iteration).
      total_iterations: iterations run (likewise).
      compile_seconds: time of the first (compiling) call.
      failure: for a seed of a batch whose health failed (non-finite values or a
        replay mismatch), where and why (a :class:`~nnx_ppo.algorithms.driver.Failure`);
        None when it trained to the end.
      network: the trained network (the one given, updated in place; or the
        one the trainer built: a seed's from ``make_network``, or from a
        network named by a string).
    """

    state: TrainingState
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    total_steps: int
    total_iterations: int
    compile_seconds: float
    failure: Failure | None = None
    network: Any = None
