"""Checkers users run on their own modules and environments."""

from nnx_ppo.envs.types import EnvCheckError
from nnx_ppo.testing.env_check import EnvCheckReport, check_env
from nnx_ppo.testing.replay_check import ReplayReport, check_replay_consistency

__all__ = ["check_replay_consistency", "ReplayReport", "check_env", "EnvCheckError", "EnvCheckReport"]
