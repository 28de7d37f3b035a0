"""The layers of docs/architecture.md: every import of a package module points
down the layers (the lower layers never import the run layer or the command line)."""

import ast
from pathlib import Path

import nnx_ppo

ROOT = Path(nnx_ppo.__file__).parent
LOWER = ("envs", "networks", "algorithms", "testing")  # below the run layer
ABOVE = ("nnx_ppo.runner", "nnx_ppo.network_spec", "nnx_ppo.presets",
         "nnx_ppo.policy", "nnx_ppo._app", "nnx_ppo.cli")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (at the top or inside a function)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            if node.module == "nnx_ppo":
                names += [f"nnx_ppo.{alias.name}" for alias in node.names]
    return names


def test_no_import_runs_up_the_layers():
    upward = []
    for package in LOWER:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _imports(path):
                if any(name == above or name.startswith(above + ".") for above in ABOVE):
                    upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The walk above finds an import inside a function (so the test can fail)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from nnx_ppo import runner as rd\n    return rd\n")
    assert "nnx_ppo.runner" in _imports(module)


def _code_lines(node: ast.AST) -> int:
    """A function's lines, its docstring not counted."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_function_is_over_80_lines():
    """No function of the package is over 80 lines, its docstring not
    counted (docs/architecture.md); a module is as long as its concept."""
    too_long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := _code_lines(node)) > 80:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, "\n".join(too_long)


def test_the_length_check_skips_the_docstring():
    node = ast.parse('def f():\n    """Doc\n    string."""\n    return 1\n').body[0]
    assert _code_lines(node) == 2


def _module_graph() -> dict[str, set[str]]:
    """``{module: the package modules it imports}``, imports inside functions
    and under ``TYPE_CHECKING`` included; ``from P import m`` of a submodule
    ``m`` points at ``P.m``, not at the package ``P``."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = ("nnx_ppo", *path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    """No two modules of the package import each other, directly or through
    others, counting imports inside functions (docs/architecture.md)."""
    assert not _cycles(_module_graph()), _cycles(_module_graph())


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# One compiled PPO iteration reads top to bottom in these files (docs/architecture.md): the iteration
# module, the network's functional view, the module contract and the config.
ITERATION_FILES = {"algorithms/ppo.py", "algorithms/functional.py", "networks/types.py", "algorithms/config.py"}
# Helpers the iteration calls that live with the network modules sharing them: the matrix-product precision
# of the library's layers (set around the whole iteration, read by the replay) and the running-moments merge of
# Normalizer (the return statistics' too).
SHARED_WITH_MODULES = {("networks/feedforward.py", "compute_precision"),
                       ("networks/feedforward.py", "current_precision"),
                       ("networks/normalizer.py", "merge_moments")}


def _functions_run_for_the_algorithm(run) -> dict[str, set[str]]:
    """``{file under the package: names of its functions that ran}`` while
    ``run()`` runs, leaving out what runs on behalf of the network or the
    env: a method of an ``nnx.Module`` (``self``), a function of ``envs/``,
    and everything they call."""
    import sys

    from flax import nnx

    root = str(ROOT) + "/"
    theirs = set()  # live frames of the network's and the env's code
    found: dict[str, set[str]] = {}

    def caller(frame):
        frame = frame.f_back
        while frame is not None and not frame.f_code.co_filename.startswith(root):
            frame = frame.f_back
        return frame

    def profile(frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(root):
            return
        if event == "return":
            theirs.discard(frame)
            return
        if event != "call":
            return
        path = code.co_filename[len(root):]
        method = code.co_argcount and code.co_varnames[0] == "self" and isinstance(frame.f_locals.get("self"),
                                                                                   nnx.Module)
        if method or path.startswith("envs/") or caller(frame) in theirs:
            theirs.add(frame)
        else:
            found.setdefault(path, set()).add(code.co_name)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return found


def test_one_iteration_reads_four_files():
    """Tracing PPO's compiled iteration (``make_train_fn``, two iterations a
    call, rewards normalized) on a small env and MLP runs, besides the
    network's and the env's own code, functions of the four files above only."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.functional import NetworkFn
    from nnx_ppo.algorithms.ppo import make_train_fn, new_training_state
    from nnx_ppo.networks.factories import make_mlp_actor_critic
    from tests.algorithms.toy_envs import Target

    env = Target()
    network = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=64, n_minibatches=2,
                                       normalize_rewards=True), eval=EvalConfig(enabled=False))
    state = new_training_state(env, network, config)
    graphdef = NetworkFn.of(network, deterministic=False).graphdef

    def trace():
        jax.eval_shape(make_train_fn(env, graphdef, config.ppo, max_iterations=2), state, jnp.asarray(1))

    found = _functions_run_for_the_algorithm(trace)
    listing = "\n".join(f"{path}: {', '.join(sorted(names))}" for path, names in sorted(found.items()))
    assert "algorithms/ppo.py" in found, listing  # (the profile saw the trace)
    elsewhere = {(path, name) for path, names in found.items() if path not in ITERATION_FILES for name in names}
    assert elsewhere <= SHARED_WITH_MODULES, f"the iteration reads {sorted(found)}:\n{listing}"


# `nnx-ppo train` reaches PPO's update through these files, besides the network's and the env's own
# (docs/architecture.md).
TRAIN_PATH_FILES = {"cli.py", "_app/runs.py", "_app/train.py", "presets.py", "network_spec.py", "runner.py",
                    "algorithms/config.py", "algorithms/distributed.py", "algorithms/checkpointing.py",
                    "algorithms/trainer.py", "algorithms/ppo.py", "algorithms/functional.py"}


def test_train_reaches_the_update_through_twelve_files(tmp_path, monkeypatch):
    """Every package file outside ``networks/`` and ``envs/`` in which a
    function runs between ``cli.main`` starting and the first call of
    ``update_epochs`` is one of :data:`TRAIN_PATH_FILES` (the original
    0.3.0's import paths, ``_original_paths.py``, run nothing on the way)."""
    import sys

    from nnx_ppo import cli
    from nnx_ppo.algorithms import ppo

    root = str(ROOT) + "/"
    reached = []
    found: set[str] = set()
    update_epochs = ppo.update_epochs

    def first_update(*args, **kwargs):
        reached.append(True)
        return update_epochs(*args, **kwargs)

    def profile(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and not reached and path.startswith(root) and frame.f_code.co_flags & 0x2:  # a function
            found.add(path[len(root):])

    monkeypatch.setattr(ppo, "update_epochs", first_update)
    sys.setprofile(profile)
    try:
        cli.main(["train", "cue_memory", "--run-dir", str(tmp_path / "run"), "--ppo.n-envs", "4",
                  "--ppo.rollout-length", "4", "--ppo.n-minibatches", "2", "--ppo.total-steps", "32",
                  "--eval.no-enabled"])
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    assert reached, "the run never reached update_epochs"
    ours = {path for path in found if not path.startswith(("networks/", "envs/"))}
    assert ours <= TRAIN_PATH_FILES, sorted(ours - TRAIN_PATH_FILES)
