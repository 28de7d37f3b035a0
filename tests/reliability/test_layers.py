"""The layers of docs/architecture.md: every import of a package module points
down the layers (the lower layers never import the run layer or the command line)."""

import ast
from pathlib import Path

import nnx_ppo

ROOT = Path(nnx_ppo.__file__).parent
LOWER = ("envs", "networks", "algorithms", "testing")  # below the run layer
ABOVE = ("nnx_ppo.run_dir", "nnx_ppo.run_logger", "nnx_ppo.runner", "nnx_ppo.network_spec", "nnx_ppo.presets",
         "nnx_ppo.policy", "nnx_ppo.exported", "nnx_ppo.progress", "nnx_ppo.app", "nnx_ppo.cli")


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


def test_modules_and_app_functions_stay_small():
    """No module of the package is over 400 lines, and no function of the
    command-line layer (cli.py, app/) over 60 (docs/architecture.md)."""
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(ROOT.rglob("*.py"))
                if (n := len(p.read_text().splitlines())) > 400]
    for path in [ROOT / "cli.py", *sorted((ROOT / "app").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                f"{node.end_lineno - node.lineno + 1} lines")
    assert not too_long, "\n".join(too_long)
