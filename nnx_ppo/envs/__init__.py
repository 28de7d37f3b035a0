"""Environments: a single-env functional API (reset/step on EnvState), adapters
for gymnax / MuJoCo Playground / Brax, wrappers, and small built-in memory tasks.

See docs/environments.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnx_ppo._lazy import lazy_exports

# the module defining them -> public names (imported on first use: the
# registry alone, e.g. for `nnx-ppo envs`, loads no JAX)
_EXPORTS = {
    "nnx_ppo.envs.registry": ("make", "list_envs", "register", "register_source", "as_env"),
    "nnx_ppo.envs.types": ("EnvState", "RLEnv"),
    "nnx_ppo.envs.spaces": ("Box", "Discrete", "space_shape", "flat_size"),
    "nnx_ppo.envs.wrappers": ("Wrapper", "TimeLimit", "RewardScale", "ObservationMask", "ActionRepeat",
                              "ResetPool"),
    "nnx_ppo.envs.tasks": ("CueMemory", "CartpoleNoVelocity", "ConstantReward", "LimbReacher"),
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:  # for type checkers and IDEs
    from nnx_ppo.envs.registry import as_env, list_envs, make, register, register_source
    from nnx_ppo.envs.spaces import Box, Discrete, flat_size, space_shape
    from nnx_ppo.envs.tasks import CartpoleNoVelocity, ConstantReward, CueMemory, LimbReacher
    from nnx_ppo.envs.types import EnvState, RLEnv
    from nnx_ppo.envs.wrappers import ActionRepeat, ObservationMask, ResetPool, RewardScale, TimeLimit, Wrapper
