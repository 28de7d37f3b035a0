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

from typing import TYPE_CHECKING

from nnx_ppo import _original_paths
from nnx_ppo._lazy import lazy_exports
from nnx_ppo.algorithms import _outputs

_original_paths.install()  # the original nnx-ppo 0.3.0's import paths (docs/migrating.md)
__path__.append(_original_paths.PATH)  # its modules this library lacks: nnx_ppo.wrappers, ...

# The trainers (algorithms/) write run directories through the run layer above
# them (nnx_ppo.runner); naming it here, where every import of nnx_ppo
# starts, keeps every import pointing down the layers (docs/architecture.md).
_outputs.RUN_LAYER = "nnx_ppo.runner"

__version__ = "0.1.0"

_EXPORTS = {
    "nnx_ppo.algorithms.trainer": ("train_ppo",),
    "nnx_ppo.algorithms.evaluation": ("evaluate",),
    "nnx_ppo.algorithms.population": ("train_seeds", "train_population"),
    "nnx_ppo.algorithms.distillation": ("train_distillation",),
    "nnx_ppo.algorithms.config": ("PPOConfig", "EvalConfig", "TrainConfig"),
    "nnx_ppo.envs": ("make",),
    "nnx_ppo.networks.factories": ("make_mlp_actor_critic", "make_recurrent_actor_critic", "make_actor_critic_for_env"),
    "nnx_ppo.networks.graph": ("PopulationGraph",),
    "nnx_ppo.network_spec": ("load_network", "NetworkSpec"),
    "nnx_ppo.policy": ("load_policy", "Policy"),
    "nnx_ppo.testing": ("check_replay_consistency", "check_env"),
    "nnx_ppo.presets": ("get_preset",),
}

_names, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["__version__", *_names]


if TYPE_CHECKING:  # for type checkers and IDEs
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.distillation import train_distillation
    from nnx_ppo.algorithms.evaluation import evaluate
    from nnx_ppo.algorithms.population import train_population, train_seeds
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.envs import make
    from nnx_ppo.network_spec import NetworkSpec, load_network
    from nnx_ppo.networks.factories import make_actor_critic_for_env, make_mlp_actor_critic, make_recurrent_actor_critic
    from nnx_ppo.networks.graph import PopulationGraph
    from nnx_ppo.policy import Policy, load_policy
    from nnx_ppo.presets import get_preset
    from nnx_ppo.testing import check_env, check_replay_consistency
