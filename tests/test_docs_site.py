"""The documentation site builds with `mkdocs build --strict`, and every
public name it documents has a docstring.

The build runs mkdocstrings over the API pages in docs/api/, so it also fails
on docstrings Griffe cannot parse (a documented parameter the signature lacks,
a malformed section) and on broken links between pages.
"""

import importlib
import inspect
import os
import pathlib
import pkgutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Packages whose public names (their `__all__` and their modules' `__all__`)
# must be documented.
PACKAGES = ["nnx_ppo", "nnx_ppo.envs", "nnx_ppo.networks", "nnx_ppo.algorithms", "nnx_ppo.testing"]


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocstrings_handlers.python", reason="needs the docs extra: pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "api" / "networks" / "index.html").exists()


def _modules():
    """Each package in PACKAGES and the modules directly inside it."""
    seen = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        seen[name] = package
        for info in pkgutil.iter_modules(package.__path__, prefix=f"{name}."):
            if not info.ispkg:
                seen[info.name] = importlib.import_module(info.name)
    return list(seen.values())


def _is_auto_doc(obj, doc):
    """Dataclasses and named tuples without a docstring get `Name(fields...)`."""
    return inspect.isclass(obj) and doc.startswith(f"{obj.__name__}(")


def test_public_names_have_docstrings():
    missing = []
    for module in _modules():
        if not (module.__doc__ or "").strip():
            missing.append(f"{module.__name__} (module)")
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            # Constants and type aliases (PRESETS, ENV_AXIS, unions) carry no docstring.
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            doc = (obj.__doc__ or "").strip()
            if not doc or _is_auto_doc(obj, doc):
                missing.append(f"{module.__name__}.{name}")
    assert not missing, "public names without a docstring:\n" + "\n".join(sorted(set(missing)))


def test_api_reference_has_one_entry_per_module():
    """Every public module of the library (the command line's own modules
    aside: docs/cli.md documents the commands) has exactly one
    ``::: module`` entry in docs/api, and no entry appears twice."""
    import collections
    import re

    entries = collections.Counter(
        match for page in (ROOT / "docs" / "api").rglob("*.md")
        for match in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    assert not [name for name, n in entries.items() if n > 1], entries
    package = ROOT / "nnx_ppo"
    modules = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts) or parts[1:2] in (("app",), ("cli",)):
            continue
        modules.add(".".join(parts))
    assert sorted(modules - set(entries)) == [], "modules without an API page"
    assert sorted(set(entries) - modules) == [], "API entries of no module"
