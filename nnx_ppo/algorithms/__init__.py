"""PPO: configs, rollout, advantages, loss replay, the training loop; distillation on the same loop;
activation recording (:mod:`nnx_ppo.algorithms.recording`).

Checkpointing lives in :mod:`nnx_ppo.algorithms.checkpointing` (imported on
use, it pulls in orbax).
"""

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.distillation import DistillationConfig, train_distillation
from nnx_ppo.algorithms.gae import compute_gae
from nnx_ppo.algorithms.recording import Recording, module_paths, record_activations
from nnx_ppo.algorithms.ppo import (
    NonFiniteError,
    TrainingState,
    TrainResult,
    evaluate,
    new_training_state,
    train_ppo,
)

__all__ = [
    "PPOConfig",
    "EvalConfig",
    "TrainConfig",
    "compute_gae",
    "train_ppo",
    "train_distillation",
    "DistillationConfig",
    "new_training_state",
    "evaluate",
    "TrainingState",
    "TrainResult",
    "NonFiniteError",
    "Recording",
    "module_paths",
    "record_activations",
]
