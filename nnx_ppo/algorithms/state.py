"""What training carries from call to call (:class:`TrainingState`) and
what :func:`~nnx_ppo.algorithms.ppo.train_ppo` returns (:class:`TrainResult`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

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
    """

    params: Any
    rest: Any
    opt_state: Any
    rollout: RolloutState
    key: jax.Array
    iteration: jax.Array
    return_stats: ReturnStatistics


@dataclasses.dataclass
class TrainResult:
    """What :func:`train_ppo` returns.

    Attributes:
      state: the final :class:`TrainingState` (the network was updated in place too).
      metrics: metrics of the last iteration.
      eval_history: ``(env_steps, eval metrics)`` of every evaluation.
      total_steps: env steps trained.
      total_iterations: iterations run.
      compile_seconds: time of the first (compiling) call.
    """

    state: TrainingState
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    total_steps: int
    total_iterations: int
    compile_seconds: float
