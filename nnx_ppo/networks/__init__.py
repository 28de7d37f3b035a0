"""Network building blocks: every piece is a :class:`StatefulModule`.

Import from the submodules (``nnx_ppo.networks.recurrent.LSTM``) or from
here (``nnx_ppo.networks.LSTM``); both are stable.
"""

from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Concat, Parallel, Sequential, Splitter
from nnx_ppo.networks.delay import Delay
from nnx_ppo.networks.factories import (
    make_actor_critic_for_env,
    make_intention_network,
    make_mlp,
    make_mlp_actor_critic,
    make_mlp_layers,
    make_modular_actor_critic,
    make_recurrent_actor_critic,
)
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.noise import BernoulliGate, DropoutMask, GaussianNoise
from nnx_ppo.networks.normalizer import Normalizer, NormalizerStatistics
from nnx_ppo.networks.recurrent import GRU, LSTM, RecurrentCell, SimpleRNN
from nnx_ppo.networks.sampling_layers import ActionSampler, CategoricalSampler, NormalSampler, NormalTanhSampler
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule, StatefulModuleOutput, select_where
from nnx_ppo.networks.utils import Filter, Flattener, Map, Merge, Scale
from nnx_ppo.networks.variational import AR1VariationalBottleneck, VariationalBottleneck

__all__ = [
    "StatefulModule",
    "StatefulModuleOutput",
    "PPONetworkOutput",
    "select_where",
    "Sequential",
    "Parallel",
    "Concat",
    "Splitter",
    "Flattener",
    "Filter",
    "Map",
    "Merge",
    "Scale",
    "Dense",
    "LSTM",
    "GRU",
    "SimpleRNN",
    "RecurrentCell",
    "Delay",
    "Normalizer",
    "NormalizerStatistics",
    "VariationalBottleneck",
    "AR1VariationalBottleneck",
    "GaussianNoise",
    "DropoutMask",
    "BernoulliGate",
    "ActionSampler",
    "NormalTanhSampler",
    "NormalSampler",
    "CategoricalSampler",
    "PPOAdapter",
    "make_mlp_layers",
    "make_mlp",
    "make_mlp_actor_critic",
    "make_modular_actor_critic",
    "make_intention_network",
    "make_recurrent_actor_critic",
    "make_actor_critic_for_env",
]
