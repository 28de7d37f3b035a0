"""Checkers users run on their own modules and environments."""

from nnx_ppo.testing.env_check import check_env, EnvCheckError
from nnx_ppo.testing.replay_check import ReplayReport, check_replay_consistency

__all__ = ["ReplayReport", "check_replay_consistency"]
