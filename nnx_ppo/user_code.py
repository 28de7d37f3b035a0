"""The user's own code, named by a reference: ``path/to/file.py:NAME`` or
``package.module:NAME`` (an env class or function, a network function).

:func:`load` finds what a reference names. :func:`snapshot` copies the files
behind a run's references into the run directory (``source/``) and records
their hashes, and :func:`use_run_copies` makes a later command load those
copies when a file has since moved or changed, so that a run stays
rebuildable the way a saved model file does.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["is_file_reference", "normalized", "short_name", "load", "file_of", "snapshot", "use_run_copies",
           "SOURCE_DIR"]

SOURCE_DIR = "source"
"""The run directory's folder that holds copies of the user's files."""

# reference -> the file to load instead (a run's copy of a file that moved or changed)
_REDIRECTS: dict[str, Path] = {}


def is_file_reference(ref: str) -> bool:
    """Whether ``ref`` is ``FILE.py:NAME``."""
    return isinstance(ref, str) and ref.rpartition(":")[0].endswith(".py")


def normalized(ref: str) -> str:
    """``ref`` with a file path made absolute (so the run can be read from another directory)."""
    if is_file_reference(ref):
        where, _, name = ref.rpartition(":")
        return f"{os.path.abspath(where)}:{name}"
    return ref


def short_name(ref: str) -> str:
    """``NAME`` of a ``FILE.py:NAME`` reference (for a run directory's name); anything else as it is."""
    return ref.rpartition(":")[2] if is_file_reference(ref) else ref


def _split(ref: str, what: str) -> tuple[str, str]:
    where, _, name = ref.rpartition(":")
    if not where or not name.isidentifier():
        raise ValueError(f"{what} {ref!r}: expected MODULE:NAME or FILE.py:NAME")
    return where, name


def _load_file(path: Path, ref: str, what: str):
    """The module of the Python file ``path``, run once per process (every
    seed's objects must come from the same classes)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"nnx_ppo_user_{digest}_{path.stem}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        sys.path.insert(0, str(path.parent))  # its sibling modules import as when it runs as a script
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's file failed to run: say where, in one line
            del sys.modules[module_name]
            raise ValueError(f"{what} {ref!r}: running {path} failed: {type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(str(path.parent))
    return module


def _import(module_name: str, ref: str, what: str):
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as `python -m` would find it
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {ref!r}: cannot import {module_name} ({e})") from None
    except Exception as e:
        raise ValueError(f"{what} {ref!r}: importing {module_name} failed: {type(e).__name__}: {e}") from None


def load(ref: str, what: str = "reference", kind: str = "") -> Any:
    """What ``ref`` names: ``NAME`` in ``package.module`` (importable, or found
    from the current directory) or in ``path/to/file.py`` (the run's copy of
    it instead, after :func:`use_run_copies` chose it). A ValueError says in
    one line, starting with ``what`` and ``ref``, what could not be found
    (``kind``, e.g. "function", names what ``NAME`` should be)."""
    where, name = _split(ref, what)
    redirect = _REDIRECTS.get(ref)
    if redirect is not None:
        module = _load_file(redirect, ref, what)
    elif where.endswith(".py"):
        path = Path(os.path.abspath(where))
        if not path.is_file():
            raise ValueError(f"{what} {ref!r}: no file {path}")
        module = _load_file(path, ref, what)
    else:
        module = _import(where, ref, what)
    if not hasattr(module, name):
        raise ValueError(f"{what} {ref!r}: {where} has no {kind + ' ' if kind else ''}{name!r}")
    return getattr(module, name)


def file_of(ref: str) -> Path | None:
    """The Python file behind ``ref`` (a module's file found without running
    it), or None where there is none (a built-in or namespace module)."""
    where = ref.rpartition(":")[0]
    if where.endswith(".py"):
        path = Path(os.path.abspath(where))
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(refs: list[str], run_dir: str | os.PathLike) -> dict[str, dict[str, str]]:
    """Copy the file behind each reference of ``refs`` into ``run_dir/source/``
    and return ``{ref: {"file": absolute path, "copy": "source/NAME.py",
    "sha256": hash}}`` for ``config.json``. A reference with no file (a
    built-in module) is left out; one file named by two references is copied once."""
    out: dict[str, dict[str, str]] = {}
    copies: dict[Path, str] = {}
    target = Path(run_dir) / SOURCE_DIR
    for ref in dict.fromkeys(refs):
        path = file_of(ref)
        if path is None:
            continue
        if path not in copies:
            name, n = path.name, 1
            while (target / name).exists() and _sha256(target / name) != _sha256(path):
                n += 1
                name = f"{path.stem}_{n}{path.suffix}"
            target.mkdir(parents=True, exist_ok=True)
            if not (target / name).exists():
                shutil.copy2(path, target / name)
            copies[path] = f"{SOURCE_DIR}/{name}"
        out[ref] = {"file": str(path), "copy": copies[path], "sha256": _sha256(path)}
    return out


def use_run_copies(run_dir: str | os.PathLike, recorded: dict[str, Any], current: bool = False) -> list[str]:
    """Check the files a run's references were trained with (``recorded``,
    what :func:`snapshot` returned, from ``config.json``) and return one line
    for each that moved or changed since. For those, :func:`load` uses the
    run's copy from now on, unless ``current`` (then the file as it is now,
    where it still exists)."""
    notes = []
    for ref, entry in (recorded or {}).items():
        if not isinstance(entry, dict) or not {"file", "copy", "sha256"} <= set(entry):
            continue
        copy = Path(run_dir) / entry["copy"]
        _REDIRECTS.pop(ref, None)
        path = file_of(ref)
        if path is not None and path.is_file() and _sha256(path) == entry["sha256"]:
            continue
        what = (f"{entry['file']} has changed since the run was trained" if path is not None
                else f"{entry['file']} no longer exists")
        if current and path is not None:
            notes.append(f"{what}; using it as it is now (--current-code)")
            continue
        if not copy.is_file():
            notes.append(f"{what}, and the run's copy {copy} is missing too")
            continue
        _REDIRECTS[ref] = copy.resolve()
        hint = "; --current-code uses the file as it is now" if path is not None else ""
        notes.append(f"{what}; using the run's copy {copy}{hint}")
    return notes
