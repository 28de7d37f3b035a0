"""The layers of docs/architecture.md: every import of a package module points
down the layers (the lower layers never import the run layer or the command line)."""

import ast
from pathlib import Path

import nnx_ppo

ROOT = Path(nnx_ppo.__file__).parent
LOWER = ("envs", "networks", "algorithms", "testing")  # below the run layer
ABOVE = ("nnx_ppo.run_dir", "nnx_ppo.runner", "nnx_ppo.network_spec", "nnx_ppo.presets",
         "nnx_ppo.policy", "nnx_ppo.progress", "nnx_ppo.app", "nnx_ppo.cli")


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
    module.write_text("def f():\n    from nnx_ppo import run_dir as rd\n    return rd\n")
    assert "nnx_ppo.run_dir" in _imports(module)


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
