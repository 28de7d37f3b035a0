"""Finding the checkpoints of a directory (internal): the complete ones (with their
commit marker), the latest, one by step, the best policy, and the newest
that still reads back (:func:`newest_intact`). Re-exported by
:mod:`nnx_ppo.algorithms.checkpointing`."""

from __future__ import annotations

import os
import pathlib
import re
import warnings
from typing import Any

from nnx_ppo.algorithms._checkpoint_layout import CheckpointError
from nnx_ppo.algorithms._checkpoint_write import COMMIT_MARKER

__all__ = ["BEST_DIR", "list_checkpoints", "latest_checkpoint", "find_checkpoint", "best_policy_dir",
           "held_checkpoints", "CheckpointFallbackWarning", "newest_intact", "resolve_latest"]

_STEP_RE = re.compile(r"^step_(\d+)$")
BEST_DIR = "best"
"""The folder of a checkpoint directory that holds the best evaluated policy."""


def _is_complete(path: pathlib.Path) -> bool:
    return (path / COMMIT_MARKER).is_file()


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, pathlib.Path]]:
    """Complete checkpoints in a run directory as ``(step, path)``, oldest first.

    Directories without the ``COMMITTED`` marker and temporary directories of
    unfinished writes are skipped. A missing directory gives ``[]``.
    """
    root = pathlib.Path(directory).absolute()  # orbax needs absolute paths
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_RE.match(child.name)
        if match and child.is_dir() and _is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> pathlib.Path | None:
    """The newest complete checkpoint in ``directory`` (a run directory), or
    ``directory`` itself when it is a complete checkpoint; ``None`` if there is none."""
    root = pathlib.Path(directory).absolute()  # relative paths are resolved against the working directory
    if root.is_dir() and _is_complete(root):
        return root
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def find_checkpoint(directory: str | os.PathLike, step: int | str | None = None,
                    seed: int | None = None) -> pathlib.Path:
    """The checkpoint to load from ``directory`` (a checkpoint directory, one
    checkpoint in it, or a run directory of ``nnx-ppo train`` with its
    ``checkpoints/``): the latest (``step=None``), the best evaluated policy
    (``step="best"``; a seed batch keeps one per seed: pass ``seed``), or the
    one saved at env step ``step``. A FileNotFoundError says what is there."""
    root = pathlib.Path(directory).absolute()
    if (root / "checkpoints").is_dir() and not list_checkpoints(root) and not _is_complete(root):
        root = root / "checkpoints"  # a run directory
    if step is None:
        return resolve_latest(root)
    if step == "best":
        best = best_policy_dir(root, seed)
        if not best.is_dir():
            raise FileNotFoundError(f"no best policy in {str(root)!r} (kept only by runs with evaluation and "
                                    "checkpoints" + ("" if seed is None else f", for seed {seed}") + ")")
        return resolve_latest(best)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step must be None, 'best' or an env step count (int), got {step!r}")
    found = dict(list_checkpoints(root))
    if step not in found:
        raise FileNotFoundError(f"no checkpoint at step {step} in {str(root)!r}; saved steps: {sorted(found)}")
    return found[step]


def best_policy_dir(directory: str | os.PathLike, seed: int | None = None) -> pathlib.Path:
    """Where training keeps the best evaluated policy in a checkpoint
    directory (one per seed of a batch): ``directory/best[/seed_<seed>]``."""
    root = pathlib.Path(directory).absolute() / BEST_DIR
    return root if seed is None else root / f"seed_{int(seed)}"


def held_checkpoints(directory: str | os.PathLike) -> str | None:
    """What a checkpoint directory already holds, in words ("checkpoints at
    steps [512, 1024]", "a best policy"), or ``None`` when it holds nothing
    a fresh run could prune."""
    held = [step for step, _ in list_checkpoints(directory)]
    if held:
        return f"checkpoints at steps {held[:3]}{' ...' if len(held) > 3 else ''}"
    best = best_policy_dir(directory)
    return "a best policy" if best.is_dir() and any(best.iterdir()) else None


def resolve_latest(directory: str | os.PathLike) -> pathlib.Path:
    """:func:`latest_checkpoint` (as an absolute path) or a FileNotFoundError
    explaining why there is none."""
    root = pathlib.Path(directory).absolute()
    if not root.exists():
        raise FileNotFoundError(f"checkpoint directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint path {str(root)!r} is not a directory")
    found = latest_checkpoint(root)
    if found is None:
        hint = ""
        if _STEP_RE.match(root.name):
            hint = f" ({root.name} has no {COMMIT_MARKER} marker: its write was interrupted)"
        raise FileNotFoundError(f"no complete checkpoint in {str(root)!r}{hint}")
    return found


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint could not be read; an older intact one was used
    (``skipped``: the checkpoint that could not be read, ``loaded``: the one used)."""

    def __init__(self, message: str, skipped: pathlib.Path | None = None, loaded: pathlib.Path | None = None):
        super().__init__(message)
        self.skipped, self.loaded = skipped, loaded


def newest_intact(directory: str | os.PathLike, restore: Any) -> Any:
    """``restore(path)`` of the newest checkpoint in ``directory`` that reads
    back; a checkpoint that does not (truncated or corrupt files:
    :class:`CheckpointError`) is skipped with a
    :class:`CheckpointFallbackWarning` naming it and the one used instead.
    ``directory`` naming one checkpoint restores exactly that one."""
    root = pathlib.Path(directory).absolute()
    if root.is_dir() and _is_complete(root):
        return restore(root)
    candidates = [path for _, path in reversed(list_checkpoints(root))] or [resolve_latest(root)]
    skipped: list[tuple[pathlib.Path, CheckpointError]] = []
    for path in candidates:
        try:
            result = restore(path)
        except CheckpointError as err:
            skipped.append((path, err))
            continue
        for bad, err in skipped:
            warnings.warn(CheckpointFallbackWarning(
                f"checkpoint {bad.name} in {str(root)!r} cannot be read ({str(err).splitlines()[0]}); "
                f"loaded {path.name}, the newest intact one", skipped=bad, loaded=path), stacklevel=3)
        return result
    raise skipped[0][1]
