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
    from nnx_ppo.networks.graph import PopulationGraph

    assert issubclass(PopulationGraph, StatefulModule)


def test_public_face_exports_the_starting_names():
    import nnx_ppo

    for name in nnx_ppo.__all__:
        assert getattr(nnx_ppo, name) is not None, name
    assert nnx_ppo.PopulationGraph is importlib.import_module("nnx_ppo.networks.graph").PopulationGraph
    assert callable(nnx_ppo.train_ppo) and callable(nnx_ppo.load_network) and callable(nnx_ppo.check_env)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = nnx_ppo.nope


def test_no_module_imports_from_a_layer_above_it():
    """envs < networks < algorithms (beside it the run directory, the network
    spec and the progress bar, which the trainers write and show) < testing
    < presets < app < cli: every module-level or function-level ``import
    nnx_ppo.X`` goes down the layers (or stays in its own)."""
    import ast
    import pathlib

    root = pathlib.Path(importlib.import_module("nnx_ppo").__file__).parent
    rank = {"_lazy": -1, "envs": 0, "networks": 1, "algorithms": 2, "network_spec": 2,
            "run_dir": 2, "progress": 2, "testing": 3, "presets": 4, "app": 5, "cli": 6}
    bad = []
    for path in root.rglob("*.py"):
        layer = path.relative_to(root).parts[0].removesuffix(".py")
        if layer not in rank:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                parts = name.split(".")
                if parts[0] == "nnx_ppo" and len(parts) > 1 and parts[1] in rank and rank[parts[1]] > rank[layer]:
                    bad.append(f"{path.relative_to(root)} imports {name}")
    assert not bad, bad


def test_each_public_name_has_one_import_path():
    """A class or function is in the ``__all__`` of one module only (the
    packages' ``__init__`` faces aside, which import theirs on first use)."""
    import inspect
    import pkgutil

    import nnx_ppo

    homes: dict[int, list[str]] = {}
    for info in pkgutil.walk_packages(nnx_ppo.__path__, prefix="nnx_ppo."):
        if info.ispkg or info.name.rsplit(".", 1)[1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                homes.setdefault(id(obj), []).append(f"{info.name}.{name}")
    repeated = [paths for paths in homes.values() if len({p.rsplit(".", 1)[0] for p in paths}) > 1]
    assert not repeated, repeated
