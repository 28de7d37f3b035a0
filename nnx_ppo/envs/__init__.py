"""Environments: a single-env functional API (reset/step on EnvState), adapters
for gymnax / MuJoCo Playground / Brax, wrappers, and small built-in memory tasks.

See docs/environments.md.
"""

from nnx_ppo.envs.registry import as_env, list_envs, make, register
from nnx_ppo.envs.spaces import Box, Discrete, flat_size, space_shape
from nnx_ppo.envs.tasks import CartpoleNoVelocity, ConstantReward, CueMemory
from nnx_ppo.envs.types import EnvState, RLEnv
from nnx_ppo.envs.wrappers import ActionRepeat, ObservationMask, RewardScale, TimeLimit, Wrapper

__all__ = [
    "make",
    "as_env",
    "list_envs",
    "register",
    "EnvState",
    "RLEnv",
    "Box",
    "Discrete",
    "space_shape",
    "flat_size",
    "Wrapper",
    "TimeLimit",
    "RewardScale",
    "ObservationMask",
    "ActionRepeat",
    "CueMemory",
    "CartpoleNoVelocity",
    "ConstantReward",
]
