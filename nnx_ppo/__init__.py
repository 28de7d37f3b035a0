"""nnx-ppo: PPO in JAX + Flax NNX for networks that carry state.

The names a user starts with::

    import nnx_ppo

    env = nnx_ppo.make("gymnax:CartPole-v1")
    net = nnx_ppo.make_actor_critic_for_env(env, "lstm", nnx.Rngs(0))
    nnx_ppo.train_ppo(env, net, nnx_ppo.TrainConfig(ppo=nnx_ppo.PPOConfig(total_steps=100_000)))

Everything else lives in the subpackages (``nnx_ppo.envs``,
``nnx_ppo.networks``, ``nnx_ppo.algorithms``, ``nnx_ppo.testing``). The
names below are imported on first use, so ``import nnx_ppo`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "train_ppo": "nnx_ppo.algorithms.ppo",
    "evaluate": "nnx_ppo.algorithms.ppo",
    "PPOConfig": "nnx_ppo.algorithms.config",
    "EvalConfig": "nnx_ppo.algorithms.config",
    "TrainConfig": "nnx_ppo.algorithms.config",
    "make": "nnx_ppo.envs",
    "make_mlp_actor_critic": "nnx_ppo.networks.factories",
    "make_recurrent_actor_critic": "nnx_ppo.networks.factories",
    "make_actor_critic_for_env": "nnx_ppo.networks.factories",
    "PopulationGraph": "nnx_ppo.networks.graph",
    "load_network": "nnx_ppo.network_spec",
    "NetworkSpec": "nnx_ppo.network_spec",
    "check_replay_consistency": "nnx_ppo.testing",
    "check_env": "nnx_ppo.testing",
    "get_preset": "nnx_ppo.presets",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nnx_ppo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import evaluate, train_ppo
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env, make_mlp_actor_critic, make_recurrent_actor_critic
    from nnx_ppo.network_spec import NetworkSpec, load_network
    from nnx_ppo.networks.graph import PopulationGraph
    from nnx_ppo.presets import get_preset
    from nnx_ppo.testing import check_env, check_replay_consistency
