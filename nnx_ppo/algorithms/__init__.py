"""PPO: configs, rollout, advantages, loss replay, the training loop; distillation on the same loop;
activation recording (:mod:`nnx_ppo.algorithms.evaluation`).

Checkpointing lives in :mod:`nnx_ppo.algorithms.checkpointing` (imported on
use, it pulls in orbax). The names below are imported on first use, so
``import nnx_ppo.algorithms.config`` (the configs alone) loads no JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnx_ppo import _original_paths
from nnx_ppo._lazy import lazy_exports

# the module defining them -> public names
_EXPORTS = {
    "nnx_ppo.algorithms.config": ("PPOConfig", "EvalConfig", "TrainConfig"),
    "nnx_ppo.algorithms.ppo": ("new_training_state", "compute_gae", "TrainingState", "NonFiniteError"),
    "nnx_ppo.algorithms.functional": ("ReplayMismatchError",),
    "nnx_ppo.algorithms.trainer": ("train_ppo", "TrainResult", "Failure"),
    "nnx_ppo.algorithms.distillation": ("train_distillation", "DistillationConfig"),
    "nnx_ppo.algorithms.population": ("train_seeds", "train_population"),
    "nnx_ppo.algorithms.evaluation": ("evaluate", "Recording", "module_paths", "record_activations"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__path__.append(_original_paths.PATH)  # the original nnx-ppo 0.3.0's modules this library lacks (types, ...)


if TYPE_CHECKING:  # for type checkers and IDEs
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.distillation import DistillationConfig, train_distillation
    from nnx_ppo.algorithms.evaluation import Recording, evaluate, module_paths, record_activations
    from nnx_ppo.algorithms.functional import ReplayMismatchError
    from nnx_ppo.algorithms.population import train_population, train_seeds
    from nnx_ppo.algorithms.ppo import NonFiniteError, TrainingState, compute_gae, new_training_state
    from nnx_ppo.algorithms.trainer import Failure, TrainResult, train_ppo
