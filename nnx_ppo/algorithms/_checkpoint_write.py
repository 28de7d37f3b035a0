"""Writing a checkpoint directory (internal to :mod:`nnx_ppo.algorithms.checkpointing`).

One crash-safe sequence: the orbax items and files go into a hidden
temporary sibling, the commit marker last, then one rename puts the
checkpoint in place and the oldest are pruned. In a run of several
processes every process writes its shards and process 0 alone does the rest,
with barriers between the steps.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import jax

from nnx_ppo.algorithms._checkpoint_layout import checkpointer

__all__ = ["COMMIT_MARKER", "TMP_PREFIX", "write_checkpoint"]

COMMIT_MARKER = "COMMITTED"
"""Name of the file whose presence marks a checkpoint directory as complete."""
TMP_PREFIX = ".tmp-"


def _save_item(path: pathlib.Path, item: dict[str, Any]) -> None:
    import orbax.checkpoint as ocp

    checkpointer().save(path, args=ocp.args.StandardSave(item))


def _fill(tmp: pathlib.Path, files: dict[str, str], step: int) -> None:
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / COMMIT_MARKER).write_text(f"step {step}\n")


def _finish(root: pathlib.Path, prune: Callable[[], list[pathlib.Path]]) -> None:
    """Remove leftovers of interrupted writes (one writer per directory) and what ``prune()`` lists."""
    for child in root.iterdir():
        if child.name.startswith(TMP_PREFIX) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
    for old in prune():
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (SIGINT) waits until the block has run, then takes effect as it
    would have (once per Ctrl-C): a save cut short inside orbax leaves its
    event loop and coroutines half made, each printing a traceback or a warning."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # (only the main thread takes signals; None: a handler Python did not install)
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        for frame in caught:
            if callable(previous):
                previous(signal.SIGINT, frame)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


def write_checkpoint(root: pathlib.Path, name: str, items: dict[str, dict[str, Any]], files: dict[str, str],
                     step: int, prune: Callable[[], list[pathlib.Path]]) -> pathlib.Path:
    """Write ``root/name/``: each orbax item of ``items`` (item name ->
    arrays), the text ``files`` and the commit marker; replace an existing
    ``root/name``; then delete what ``prune()`` returns. Returns the path.
    In one process a Ctrl-C during the write takes effect once it is done."""
    final = root / name
    if jax.process_count() > 1:
        return _write_multiprocess(root, final, items, files, step, prune)
    with _ctrl_c_after():
        return _write_here(root, final, items, files, step, prune)


def _write_here(root: pathlib.Path, final: pathlib.Path, items: dict, files: dict[str, str], step: int,
                prune: Callable[[], list[pathlib.Path]]) -> pathlib.Path:
    """:func:`write_checkpoint` in a run of one process."""
    name = final.name
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{name}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        for item_name, item in items.items():
            _save_item(tmp / item_name, item)
        _fill(tmp, files, step)
        if final.exists():
            old = root / f"{TMP_PREFIX}old-{name}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _finish(root, prune)
    return final


def _write_multiprocess(root: pathlib.Path, final: pathlib.Path, items: dict, files: dict[str, str], step: int,
                        prune: Callable[[], list[pathlib.Path]]) -> pathlib.Path:
    """:func:`write_checkpoint` in a run of several processes."""
    from nnx_ppo.algorithms.distributed import barrier, is_primary

    tmp = root / f"{TMP_PREFIX}{final.name}"  # the same name in every process
    if is_primary():
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier(f"nnx_ppo checkpoint {final.parent.name}/{final.name} start")
    for item_name, item in items.items():
        _save_item(tmp / item_name, item)
    barrier(f"nnx_ppo checkpoint {final.parent.name}/{final.name} arrays")
    if is_primary():
        _fill(tmp, files, step)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _finish(root, prune)
    barrier(f"nnx_ppo checkpoint {final.parent.name}/{final.name} done")
    return final
