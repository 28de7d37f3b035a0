"""Every public import path of nnx_ppo.networks listed in DESIGN.md exists."""

import importlib

import pytest

from nnx_ppo.networks.types import StatefulModule

PATHS = {
    "nnx_ppo.networks.types": ["StatefulModule", "StatefulModuleOutput", "PPONetworkOutput"],
    "nnx_ppo.networks.containers": ["Sequential", "Parallel", "Concat", "Splitter"],
    "nnx_ppo.networks.utils": ["Flattener", "Filter", "Map", "Merge", "Scale"],
    "nnx_ppo.networks.feedforward": ["Dense"],
    "nnx_ppo.networks.recurrent": ["LSTM", "GRU"],
    "nnx_ppo.networks.normalizer": ["Normalizer"],
    "nnx_ppo.networks.delay": ["Delay"],
    "nnx_ppo.networks.variational": ["VariationalBottleneck", "AR1VariationalBottleneck"],
    "nnx_ppo.networks.noise": ["GaussianNoise", "DropoutMask", "BernoulliGate"],
    "nnx_ppo.networks.sampling_layers": [
        "ActionSampler", "NormalTanhSampler", "NormalSampler", "CategoricalSampler"],
    "nnx_ppo.networks.adapter": ["PPOAdapter"],
    "nnx_ppo.networks.factories": [
        "make_mlp", "make_mlp_actor_critic", "make_recurrent_actor_critic",
        "make_actor_critic_for_env"],
}

NOT_MODULES = {"StatefulModuleOutput", "PPONetworkOutput"}
CASES = [(mod, name) for mod, names in PATHS.items() for name in names]


@pytest.mark.parametrize("module_name,name", CASES, ids=[f"{m.rsplit('.', 1)[1]}.{n}" for m, n in CASES])
def test_import_path_exists(module_name, name):
    module = importlib.import_module(module_name)
    obj = getattr(module, name)
    if name[0].isupper() and name not in NOT_MODULES:
        assert isinstance(obj, type) and issubclass(obj, StatefulModule), name
    else:
        assert callable(obj)
    assert name in getattr(module, "__all__", [name]), f"{name} missing from {module_name}.__all__"


def test_population_graph():
    try:
        module = importlib.import_module("nnx_ppo.networks.graph")
    except ModuleNotFoundError as err:
        if err.name != "nnx_ppo.networks.graph":
            raise
        pytest.skip("nnx_ppo.networks.graph (PopulationGraph) is not built yet")
    assert issubclass(module.PopulationGraph, StatefulModule)
