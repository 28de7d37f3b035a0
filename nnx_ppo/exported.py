"""An exported policy: the files :meth:`nnx_ppo.policy.Policy.export` writes,
checked and read back with JAX alone (:func:`load_exported`)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable

import jax
import numpy as np

__all__ = ["ExportedPolicy", "load_exported", "export_info", "check_export_directory", "ExportedPolicyError",
           "ExportDirInUseError", "ExportWarning", "EXPORT_FILES", "STEP_FILE", "INIT_FILE", "INFO_FILE",
           "PARAMS_FILE", "FORMAT", "ANY", "first_line"]


STEP_FILE = "step.jax"


INIT_FILE = "initial_carry.jax"


INFO_FILE = "policy.json"


PARAMS_FILE = "params.npz"


EXPORT_FILES = (STEP_FILE, INIT_FILE, PARAMS_FILE, INFO_FILE)
"""The files :meth:`Policy.export` writes (and nothing else)."""


FORMAT = "nnx-ppo exported policy 2"  # 2: any batch size; initial_carry takes a [n] bool array


ANY = "any"  # policy.json's batch_size of a step exported for any batch size


class ExportedPolicyError(ValueError):
    """A file of an exported policy is truncated or not what
    :meth:`Policy.export` writes; the message (one line) names the file."""


class ExportDirInUseError(FileExistsError):
    """The directory an export would write to holds something else, or a
    previous export that ``overwrite`` was not given to replace."""


class ExportWarning(UserWarning):
    """The network could not be exported for any batch size and was exported
    for one batch size."""


def first_line(error: BaseException, limit: int = 160) -> str:
    """``error``'s type and the first line of its message, at most ``limit`` characters."""
    line = (str(error).strip().splitlines() or [""])[0]
    line = line if len(line) <= limit else line[:limit - 3] + "..."
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _listing(names: list[str], limit: int = 5) -> str:
    """``a, b, c`` (and N more)."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_export_directory(path: str | os.PathLike, overwrite: bool = False, flag: str = "overwrite=True") -> list[str]:
    """The files of a previous export that an export to ``path`` replaces
    (``[]`` for a new or empty directory).

    An :class:`ExportDirInUseError` (one line) refuses a ``path`` that is a
    file, one that holds anything but an export's files (:data:`EXPORT_FILES`;
    never deleted or mixed in with), and one that holds a previous export
    unless ``overwrite``. ``flag`` is how the message names the overwrite
    option (``"--overwrite"`` on the command line).
    """
    root = pathlib.Path(path)
    if not root.exists():
        return []
    if not root.is_dir():
        raise ExportDirInUseError(f"{os.fspath(root)} is a file; an exported policy is written to a directory "
                                  f"({', '.join(EXPORT_FILES)}): choose a new or empty one")
    names = sorted(p.name for p in root.iterdir())
    others = [name for name in names if name not in EXPORT_FILES]
    if others and overwrite:
        raise ExportDirInUseError(f"{os.fspath(root)} holds {_listing(others)}, not an exported policy's files: "
                                  f"{flag} replaces a previous export only; choose a new or empty directory")
    if others:
        raise ExportDirInUseError(f"{os.fspath(root)} is not empty (it holds {_listing(others)}); export to a new or "
                                  "empty directory")
    if names and not overwrite:
        raise ExportDirInUseError(f"{os.fspath(root)} already holds an exported policy ({', '.join(names)}); pass "
                                  f"{flag} to replace it, or export to a new or empty directory")
    return names


@dataclasses.dataclass(frozen=True)
class ExportedPolicy:
    """An exported policy read back by :func:`load_exported` (JAX only).

    ``initial_carry(n)`` gives the start carry of ``n`` envs (a list of
    arrays; ``n`` defaults to ``batch_size``); ``step(carry, obs, done) ->
    (action, carry)`` as :class:`Policy`, with ``done`` a ``[n]`` bool array
    (all False where nothing ended). With ``any_batch_size`` the step takes
    any number of envs; otherwise ``batch_size`` envs only.
    """

    step_fn: Any
    init_fn: Any
    params: list
    batch_size: int
    any_batch_size: bool = False

    def initial_carry(self, n: int | None = None) -> list:
        """The carry of ``n`` envs (default ``batch_size``) at the start of their episodes."""
        n = self.batch_size if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"ExportedPolicy.initial_carry: n must be a positive int (the number of envs), got {n!r}")
        if not self.any_batch_size and n != self.batch_size:
            raise ValueError(f"ExportedPolicy.initial_carry: this policy was exported for batches of {self.batch_size} "
                             f"envs only, got n={n}")
        return self.init_fn.call(self.params, np.zeros((n,), bool))

    def step(self, carry: list, obs: Any, done: Any = None) -> tuple[Any, list]:
        """Act on ``obs`` (leaves ``[n, ...]``); where ``done`` (``[n]`` bool;
        None: nowhere) the carry is reset first. Returns ``(action, next carry)``."""
        if done is None:
            done = np.zeros((np.shape(jax.tree.leaves(obs)[0])[0],), bool)
        return self.step_fn.call(self.params, carry, obs, done)


def _read_export_file(root: pathlib.Path, name: str, what: str, read: Callable[[pathlib.Path], Any]) -> Any:
    """``read(root / name)``; a missing file is a FileNotFoundError, one that
    does not read back an :class:`ExportedPolicyError` saying it is truncated
    or not ``what``, both one line naming the file."""
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(f"load_exported: {os.fspath(path)} is missing; an exported policy is "
                                f"{', '.join(EXPORT_FILES)} (written by Policy.export or nnx-ppo export)")
    try:
        return read(path)
    except Exception as e:  # any way a damaged file fails to parse: name it, in one line
        raise ExportedPolicyError(f"load_exported: {os.fspath(path)} is truncated or not {what} "
                                  f"({first_line(e, 100)})") from None


def _read_info(path: pathlib.Path) -> dict:
    info = json.loads(path.read_text())
    if not isinstance(info, dict) or not str(info.get("format", "")).startswith("nnx-ppo exported policy"):
        raise ValueError(f"no 'format': 'nnx-ppo exported policy N' entry, got {str(info)[:60]}")
    batch = info.get("batch_size")
    if not (batch == ANY or isinstance(batch, int)):
        raise ValueError(f"batch_size must be 'any' or an int, got {batch!r}")
    return info


def _read_params(path: pathlib.Path) -> list:
    with np.load(path, allow_pickle=False) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def export_info(path: str | os.PathLike) -> dict:
    """The ``policy.json`` of the exported policy in ``path`` (a dict; see
    :meth:`Policy.export`); errors as :func:`load_exported`'s."""
    return _read_export_file(pathlib.Path(path), INFO_FILE, "an exported policy's policy.json", _read_info)


def load_exported(path: str | os.PathLike) -> ExportedPolicy:
    """Read what :meth:`Policy.export` wrote: ``step.jax`` and
    ``initial_carry.jax`` (serialized :mod:`jax.export` functions),
    ``params.npz`` (the parameters they take first) and ``policy.json``. The
    same can be done with JAX and NumPy alone, where nnx_ppo is not
    installed::

        import numpy as np
        from jax import export

        step = export.deserialize(open(f"{path}/step.jax", "rb").read())
        init = export.deserialize(open(f"{path}/initial_carry.jax", "rb").read())
        data = np.load(f"{path}/params.npz")
        params = [data[f"arr_{i}"] for i in range(len(data.files))]
        carry = init.call(params, np.zeros(n, bool))   # n envs
        action, carry = step.call(params, carry, obs, done)

    A missing file is a FileNotFoundError, a truncated or damaged one an
    :class:`ExportedPolicyError`; each message is one line naming the file.
    """
    root = pathlib.Path(path)
    if not (root / STEP_FILE).is_file():
        raise FileNotFoundError(f"load_exported: {os.fspath(root)!r} holds no exported policy ({STEP_FILE} missing)")
    info = export_info(root)
    if info["format"] != FORMAT:
        version = str(info["format"]).rsplit(" ", 1)[-1]
        earlier = version.isdigit() and int(version) < int(FORMAT.rsplit(" ", 1)[-1])
        raise ExportedPolicyError(
            f"load_exported: {os.fspath(root / INFO_FILE)} says {info['format']!r}: "
            + ("it was written by an earlier, unreleased version of nnx-ppo and cannot be read; " if earlier else "")
            + f"this version reads {FORMAT!r} (export the policy again with this version)")

    def deserialize(file: pathlib.Path) -> Any:
        return jax.export.deserialize(bytearray(file.read_bytes()))

    step_fn = _read_export_file(root, STEP_FILE, "a jax.export artifact", deserialize)
    init_fn = _read_export_file(root, INIT_FILE, "a jax.export artifact", deserialize)
    params = _read_export_file(root, PARAMS_FILE, "a NumPy .npz archive", _read_params)
    if len(params) != info.get("params", len(params)):
        raise ExportedPolicyError(f"load_exported: {os.fspath(root / PARAMS_FILE)} holds {len(params)} arrays, but "
                                  f"{INFO_FILE} says {info['params']}: the files are of different exports")
    any_batch = info["batch_size"] == ANY
    return ExportedPolicy(step_fn=step_fn, init_fn=init_fn, params=params,
                          batch_size=int(info.get("default_batch_size", 1) if any_batch else info["batch_size"]),
                          any_batch_size=any_batch)
