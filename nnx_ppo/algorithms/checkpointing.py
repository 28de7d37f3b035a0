"""Checkpoints of the whole training state, for resuming and for inference.

Layout of a run directory written by :func:`save_training_state`::

    RUN_DIR/
      step_000000065536/
        network/        orbax checkpoint: params and rest (normalizer statistics, RNG streams)
        training/       orbax checkpoint: optimizer state, rollout state, training key, iteration
        layout.json     path, shape, dtype and PRNG-key impl of every saved leaf
        config.json     the TrainConfig (config_to_dict: a learning-rate schedule is saved as its description)
        metadata.json   the caller's metadata dict (or null)
        COMMITTED       completion marker, written last

A checkpoint is first written to a hidden temporary sibling
(``.tmp-step_...``) and renamed into place once complete, so a crash while
saving never leaves a ``step_*`` directory that looks finished. Directories
without the ``COMMITTED`` marker are never picked.

Typed PRNG keys (RNG streams, keys in env states and network carries, the
training key) are stored as their raw key data and re-wrapped with the saved
key implementation on restore.

``layout.json`` records its format (``FORMAT_VERSION``); a checkpoint written
by an earlier, unreleased version of nnx-ppo (format 1) is refused with a
one-line :class:`CheckpointError` saying so.

Restoring needs a *template* with the same structure, e.g. a fresh
:func:`nnx_ppo.algorithms.ppo.new_training_state` for the same env, network
and config; the saved paths and shapes are compared with the template's first
so that a different architecture is reported by variable name.

Finding the checkpoints of a directory: the complete ones (with their commit
marker, :func:`list_checkpoints`), the latest, one by step or the best policy
(:func:`find_checkpoint`, :func:`best_policy_dir`); a restore reads the newest
checkpoint that still reads back, skipping a corrupt one with a
:class:`CheckpointFallbackWarning`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.algorithms._checkpoint_layout import (
    FORMAT_VERSION,
    LAYOUT_FILE,
    CheckpointError,
    as_item,
    describe_leaves,
    read_json,
    read_layout,
    restore_sections,
    sections_of,
)
from nnx_ppo.algorithms._checkpoint_write import COMMIT_MARKER, write_checkpoint

__all__ = [
    "CheckpointError",
    "CheckpointFallbackWarning",
    "COMMIT_MARKER",
    "save_training_state",
    "save_policy",
    "latest_checkpoint",
    "find_checkpoint",
    "best_policy_dir",
    "BEST_DIR",
    "list_checkpoints",
    "held_checkpoints",
    "restore_training_state",
    "load_config",
    "load_metadata",
    "restore_network",
    "save",
    "load",
    "resume",
]

_CONFIG_FILE = "config.json"
_METADATA_FILE = "metadata.json"
# Which TrainingState fields go into which orbax item.
_NETWORK_FIELDS = ("params", "rest")
_TRAINING_FIELDS = ("opt_state", "rollout", "key", "iteration", "return_stats", "member")


def _training_fields(state: Any) -> tuple[str, ...]:
    """The training fields ``state`` has values for (``member`` is None outside a population)."""
    return tuple(f for f in _TRAINING_FIELDS if getattr(state, f) is not None)


# --------------------------------------------------------------------------- the directory's files


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
        return _resolve_latest(root)
    if step == "best":
        best = best_policy_dir(root, seed)
        if not best.is_dir():
            raise FileNotFoundError(f"no best policy in {str(root)!r} (kept only by runs with evaluation and "
                                    "checkpoints" + ("" if seed is None else f", for seed {seed}") + ")")
        return _resolve_latest(best)
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


def _resolve_latest(directory: str | os.PathLike) -> pathlib.Path:
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


def _newest_intact(directory: str | os.PathLike, restore: Any) -> Any:
    """``restore(path)`` of the newest checkpoint in ``directory`` that reads
    back; a checkpoint that does not (truncated or corrupt files:
    :class:`CheckpointError`) is skipped with a
    :class:`CheckpointFallbackWarning` naming it and the one used instead.
    ``directory`` naming one checkpoint restores exactly that one."""
    root = pathlib.Path(directory).absolute()
    if root.is_dir() and _is_complete(root):
        return restore(root)
    candidates = [path for _, path in reversed(list_checkpoints(root))] or [_resolve_latest(root)]
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


# --------------------------------------------------------------------------- saving


def _json_parts(config: Any, metadata: dict | None, who: str) -> tuple[str, str]:
    """``config.json`` and ``metadata.json`` text, checked before anything is written."""
    from nnx_ppo.algorithms.config import config_to_dict

    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{who}: config must be a TrainConfig instance, got {config!r}")
    config_json = json.dumps(config_to_dict(config), indent=2, sort_keys=True) + "\n"
    try:
        metadata_json = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
    except TypeError as err:
        raise TypeError(f"{who}: metadata must be JSON-serializable ({err})") from None
    return config_json, metadata_json


def _write(directory: str | os.PathLike, items: dict[str, dict[str, Any]], config: Any, *, step: int,
           keep: int | None, metadata: dict | None, who: str) -> pathlib.Path:
    """Write ``items`` (orbax item name -> {section name -> tree}) as the
    checkpoint ``directory/step_<step:012d>/`` (see :func:`write_checkpoint`)."""
    if keep is not None and keep <= 0:
        raise ValueError(f"{who}: keep must be positive or None, got {keep}")
    step = int(step)
    if step < 0:
        raise ValueError(f"{who}: step must be >= 0, got {step}")
    config_json, metadata_json = _json_parts(config, metadata, who)  # fails before anything is written
    layout: dict[str, Any] = {"format": FORMAT_VERSION, "step": step, "sections": {}}
    arrays: dict[str, dict[str, Any]] = {}
    for item_name, sections in items.items():
        arrays[item_name] = {}
        for name, tree in sections.items():
            entries, leaves, _ = describe_leaves(name, tree)
            layout["sections"][name] = entries
            arrays[item_name][name] = as_item(leaves)
    files = {LAYOUT_FILE: json.dumps(layout, indent=2, sort_keys=True) + "\n", _CONFIG_FILE: config_json,
             _METADATA_FILE: metadata_json}
    root = pathlib.Path(directory).absolute()  # relative paths are resolved against the working directory
    return write_checkpoint(root, f"step_{step:012d}", arrays, files, step,
                            prune=lambda: [path for _, path in list_checkpoints(root)][:-keep] if keep else [])


def save_training_state(
    directory: str | os.PathLike,
    state: Any,
    config: Any,
    *,
    step: int,
    keep: int | None = 3,
    metadata: dict | None = None,
) -> pathlib.Path:
    """Save the whole training state as ``directory/step_<step:012d>/``.

    Args:
      directory: the run directory (created if missing).
      state: a :class:`~nnx_ppo.algorithms.ppo.TrainingState`.
      config: the :class:`~nnx_ppo.algorithms.config.TrainConfig` (saved as ``config.json``).
      step: env steps trained so far; names the checkpoint.
      keep: keep only this many most recent complete checkpoints (``None``: keep all).
      metadata: JSON-serializable dict saved as ``metadata.json`` (e.g. how to
        rebuild the network for :func:`nnx_ppo.load_network`).

    Returns the path of the new checkpoint. The write is atomic: the
    checkpoint only appears under its final name once complete. Saving an
    existing step replaces it.
    """
    items = {"network": sections_of(state, _NETWORK_FIELDS), "training": sections_of(state, _training_fields(state))}
    return _write(directory, items, config, step=step, keep=keep, metadata=metadata, who="save_training_state")


def save_policy(directory: str | os.PathLike, params: Any, rest: Any, config: Any, *, step: int,
                keep: int | None = 1, metadata: dict | None = None) -> pathlib.Path:
    """Save a policy alone (the network's parameters and other variables,
    no optimizer or env state) as ``directory/step_<step:012d>/``, the
    same way as :func:`save_training_state`; :func:`restore_network` and
    :func:`nnx_ppo.load_network` read it. Training keeps its best
    evaluated policy this way (see :mod:`nnx_ppo.algorithms.trainer`)."""
    items = {"network": {"params": params, "rest": rest}}
    return _write(directory, items, config, step=step, keep=keep, metadata=metadata, who="save_policy")


# --------------------------------------------------------------------------- restoring


def restore_training_state(directory: str | os.PathLike, template: Any) -> Any:
    """Restore the latest complete checkpoint in ``directory`` (or the
    checkpoint ``directory`` itself) into the structure of ``template``.

    Args:
      directory: a run directory or one checkpoint in it.
      template: a :class:`~nnx_ppo.algorithms.ppo.TrainingState` with the same
        structure, e.g. ``new_training_state(env, network, config)`` for the
        same env, network architecture and config.

    Returns a new ``TrainingState`` (same pytree structure, dtypes and key
    implementations as ``template``).

    Raises:
      FileNotFoundError: ``directory`` is missing or holds no complete checkpoint.
      ValueError: the template does not match (another architecture, number of
        envs, ...); the message names the first differing variable and both shapes.
      CheckpointError: the checkpoint is corrupt, or was written by an earlier,
        unreleased version of nnx-ppo; the message (one line) names its path.
    """

    def restore(path: pathlib.Path) -> Any:
        layout = read_layout(path)
        values = {}
        values.update(restore_sections(path, "network", sections_of(template, _NETWORK_FIELDS), layout))
        values.update(restore_sections(path, "training", sections_of(template, _training_fields(template)), layout))
        return dataclasses.replace(template, **values)

    return _newest_intact(directory, restore)


# --------------------------------------------------------------------------- config / metadata


def load_config(directory: str | os.PathLike, *, learning_rate: Any = None):
    """The :class:`~nnx_ppo.algorithms.config.TrainConfig` saved with the latest
    checkpoint in ``directory`` (or with the checkpoint ``directory``).

    ``learning_rate`` (a number or an optax schedule) replaces the saved one;
    it is required for a run trained with a learning-rate schedule, which is
    saved only as a description (otherwise
    :class:`~nnx_ppo.algorithms.config.ScheduleNotSavedError`)."""
    from nnx_ppo.algorithms.config import ScheduleNotSavedError, config_from_dict

    path = _resolve_latest(directory)
    data = read_json(path / _CONFIG_FILE)
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {_CONFIG_FILE} is not an object")
    try:
        return config_from_dict(data, where=str(path / _CONFIG_FILE), learning_rate=learning_rate)
    except ScheduleNotSavedError:
        raise
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: {_CONFIG_FILE} is not a valid TrainConfig ({err})") from err


def load_metadata(directory: str | os.PathLike) -> dict | None:
    """The metadata dict saved with the latest checkpoint (``None`` if none was given)."""
    path = _resolve_latest(directory)
    return read_json(path / _METADATA_FILE)


# --------------------------------------------------------------------------- inference


def restore_network(directory: str | os.PathLike, network: Any, seed: int | None = None):
    """Restore a network's variables for inference from the latest
    checkpoint in ``directory`` (or the checkpoint ``directory``). To
    rebuild the network from the checkpoint's metadata as well, use
    :func:`nnx_ppo.load_network`, which calls this.

    Only the network's variables (parameters, normalizer statistics, RNG
    streams) are read; the optimizer and env states are not needed.

    Args:
      directory: a run directory or one checkpoint in it.
      network: a network of the same architecture to load into (updated in place).
      seed: for a checkpoint of several seeds trained together
        (:func:`nnx_ppo.algorithms.seeds.train_seeds`), which seed's network
        to load (required there, refused elsewhere).

    Returns the network, switched to deterministic mode (``network.eval()``).
    Step it with ``out = net(net.initialize_state(B), obs)``.

    Raises:
      FileNotFoundError, CheckpointError: as :func:`restore_training_state`.
      ValueError: the network does not match the checkpoint (names the first
        differing variable and both shapes), or ``network`` is None.
    """
    if network is None:
        raise ValueError("checkpointing.restore_network needs the network to load into; "
                         "nnx_ppo.load_network(directory) rebuilds it from the checkpoint's metadata")
    _, params, rest = nnx.split(network, nnx.Param, ...)

    def restore(path: pathlib.Path) -> Any:
        layout = read_layout(path)
        metadata = read_json(path / _METADATA_FILE)
        seeds = metadata.get("seeds") if isinstance(metadata, dict) else None
        if seeds is None:
            if seed is not None:
                raise ValueError(f"checkpoint {str(path)!r} holds one training run, not several seeds; "
                                 f"load it without seed= (got seed={seed})")
            return restore_sections(path, "network", {"params": params, "rest": rest}, layout)
        if seed not in seeds:
            raise ValueError(f"checkpoint {str(path)!r} holds the seeds {seeds} trained together; "
                             f"pass seed= one of them (got {seed!r})")
        stacked = jax.tree.map(lambda x: jnp.stack([x] * len(seeds)), {"params": params, "rest": rest})
        values = restore_sections(path, "network", stacked, layout)
        return jax.tree.map(lambda x: x[seeds.index(seed)], values)

    values = _newest_intact(directory, restore)
    nnx.update(network, values["params"], values["rest"])
    network.eval()
    return network


# The short names users write (DESIGN.md): save / load / resume.
save = save_training_state
"""Short name of :func:`save_training_state`."""
load = restore_network
"""Short name of :func:`restore_network` (a trained network's variables, for inference)."""
resume = restore_training_state
"""Short name of :func:`restore_training_state`."""
