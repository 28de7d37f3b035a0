"""PPO: configs, rollout, advantages, loss replay, the training loop.

Checkpointing lives in :mod:`nnx_ppo.algorithms.checkpointing` (imported on
use, it pulls in orbax).
"""

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.gae import compute_gae
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
    "new_training_state",
    "evaluate",
    "TrainingState",
    "TrainResult",
    "NonFiniteError",
]
