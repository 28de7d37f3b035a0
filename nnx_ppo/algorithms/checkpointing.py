"""Checkpoints of the whole training state, for resuming and for inference.

orbax's ``CheckpointManager`` keeps them: it writes a checkpoint into a
temporary sibling and renames it into place once complete (an interrupted
write is never listed, and the next save removes it), keeps the newest
``keep``, and finds a step by its directory name; in a run of several
processes each writes its own shards. Layout written by :func:`save_training_state`::

    RUN_DIR/
      step_000000065536/
        network/                orbax item: params and rest (normalizer statistics, RNG streams)
        training/               orbax item: optimizer state, rollout state, training key, iteration
        layout/layout.json      the format, and path, shape, dtype and PRNG-key impl of every saved leaf
        config/config.json      the TrainConfig (config_to_dict: a learning-rate schedule is saved as its description)
        metadata/metadata.json  the caller's metadata dict (or null)
      best/                     the best evaluated policy (:func:`save_policy`, one per seed of a batch)

What this module adds: typed PRNG keys are stored as their key data and
re-wrapped with their implementation on restore; zero-size arrays (orbax
refuses them) live in the layout only; the saved paths and shapes are
compared with a *template* of the same structure (e.g. a fresh
:func:`nnx_ppo.algorithms.ppo.new_training_state` for the same env, network
and config) first, so that a different architecture is reported by variable
name; a restore from a directory skips a checkpoint that does not read back
for the newest intact one (:class:`CheckpointFallbackWarning`); in a run of
one process a Ctrl-C during a save takes effect once it is done; a
checkpoint written by an earlier, unreleased version of nnx-ppo (layout
formats 1 and 2) is refused in one line (:class:`CheckpointError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo import _original_paths

__all__ = [
    "CheckpointError", "CheckpointFallbackWarning", "save_training_state", "save_policy", "latest_checkpoint",
    "find_checkpoint", "best_policy_dir", "list_checkpoints", "restore_training_state", "load_config", "load_metadata",
    "restore_network", "load",
]

FORMAT_VERSION = 3
"""The layout this version writes and reads. Formats 1 and 2 were written by
earlier, unreleased versions of nnx-ppo (their own commit marker, a
``layout.json`` beside ``network/``): such a checkpoint is refused in one
line, not mapped."""
BEST_DIR = "best"
"""The folder of a checkpoint directory that holds the best evaluated policy."""

_STEP_PREFIX, _STEP_DIGITS = "step", 12  # step_000000065536
_JSON_ITEMS = ("layout", "config", "metadata")  # each saved as ITEM/ITEM.json
# Which TrainingState fields go into which orbax item.
_NETWORK_FIELDS = ("params", "rest")
_TRAINING_FIELDS = ("opt_state", "rollout", "key", "iteration", "return_stats", "member")


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (corrupt, truncated, not a checkpoint, or
    written by an earlier, unreleased version of nnx-ppo)."""


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint could not be read; an older intact one was used
    (``skipped``: the checkpoint that could not be read, ``loaded``: the one used)."""

    def __init__(self, message: str, skipped: pathlib.Path | None = None, loaded: pathlib.Path | None = None):
        super().__init__(message)
        self.skipped, self.loaded = skipped, loaded


def _ocp():
    """``orbax.checkpoint``, imported on first use (the command line starts without it)."""
    import orbax.checkpoint as ocp

    return ocp


def _step_names():
    """orbax's naming of the step directories; its listing skips interrupted writes."""
    return _ocp().path.step.standard_name_format(step_prefix=_STEP_PREFIX, step_format_fixed_length=_STEP_DIGITS)


def _items(state: Any) -> dict[str, dict[str, Any]]:
    """``{orbax item: {field: getattr(state, field)}}`` of a training state, fields in
    order; a training field without a value (``member`` outside a population) is left out."""
    return {"network": {f: getattr(state, f) for f in _NETWORK_FIELDS},
            "training": {f: getattr(state, f) for f in _TRAINING_FIELDS if getattr(state, f) is not None}}


# --------------------------------------------------------------------------- finding checkpoints


def _is_checkpoint(path: pathlib.Path) -> bool:
    """``path`` is one committed checkpoint (its write finished)."""
    return (path / "network").is_dir() and _ocp().utils.is_checkpoint_finalized(path)


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, pathlib.Path]]:
    """Complete checkpoints in a run directory as ``(step, path)``, oldest first.

    Interrupted writes (orbax's temporary directories) are skipped. A
    missing directory gives ``[]``.
    """
    root = pathlib.Path(directory).absolute()  # orbax needs absolute paths
    if not root.is_dir():
        return []
    return sorted((found.step, root / found.path.name) for found in _step_names().find_all(root))


def latest_checkpoint(directory: str | os.PathLike) -> pathlib.Path | None:
    """The newest complete checkpoint in ``directory`` (a run directory), or
    ``directory`` itself when it is a complete checkpoint; ``None`` if there is none."""
    root = pathlib.Path(directory).absolute()  # relative paths are resolved against the working directory
    if _is_checkpoint(root):
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
    if (root / "checkpoints").is_dir() and not list_checkpoints(root) and not _is_checkpoint(root):
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
        hint = f" ({root.name} is a write that was interrupted)" if _ocp().utils.is_tmp_checkpoint(root) else ""
        raise FileNotFoundError(f"no complete checkpoint in {str(root)!r}{hint}")
    return found


def _newest_intact(directory: str | os.PathLike, restore: Any) -> Any:
    """``restore(path)`` of the newest checkpoint in ``directory`` that reads
    back; a checkpoint that does not (truncated or corrupt files:
    :class:`CheckpointError`) is skipped with a
    :class:`CheckpointFallbackWarning` naming it and the one used instead.
    ``directory`` naming one checkpoint restores exactly that one."""
    root = pathlib.Path(directory).absolute()
    candidates = [root] if _is_checkpoint(root) else [path for _, path in reversed(list_checkpoints(root))]
    skipped: list[tuple[pathlib.Path, CheckpointError]] = []
    for path in candidates or [_resolve_latest(root)]:
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


# --------------------------------------------------------------------------- the layout of the saved leaves


def _path_name(prefix: str, path: tuple) -> str:
    """``params/layers/0/kernel``: a readable name of a leaf (no trailing ``.value``)."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    return "/".join([prefix, jax.tree_util.keystr(path, simple=True, separator="/")]) if path else prefix


def _is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _describe_leaves(prefix: str, tree: Any) -> tuple[list[dict], list[Any], Any]:
    """Flatten one section: ``(layout entries, storable arrays, treedef)``.

    Keys are replaced by their key data; every leaf becomes an array.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    entries, arrays = [], []
    for path, leaf in flat:
        impl = None
        if _is_key(leaf):
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        elif not isinstance(leaf, jax.Array):
            leaf = jnp.asarray(leaf)
        entries.append({"path": _path_name(prefix, path), "shape": list(leaf.shape), "dtype": str(leaf.dtype),
                        "key_impl": impl})
        arrays.append(leaf)
    return entries, arrays, treedef


def _leaf_name(i: int) -> str:
    """The key of the ``i``-th flattened leaf in the orbax item (``leaf_00007``)."""
    return f"leaf_{i:05d}"


def _as_item(arrays: list[Any]) -> dict[str, Any]:
    """The arrays orbax writes; zero-size arrays (orbax refuses them, e.g. an
    MJX state's empty contact buffers) live in the layout only."""
    return {_leaf_name(i): a for i, a in enumerate(arrays) if math.prod(a.shape) > 0}


_WHAT = {"params": "network parameters", "rest": "network variables (normalizer statistics, RNG streams)",
         "opt_state": "optimizer state", "rollout": "env states / network carries", "key": "training key",
         "iteration": "iteration counter"}
_HINT = {"rollout": " (another env or n_envs?)", "params": " (a network of another architecture?)",
         "rest": " (a network of another architecture?)", "opt_state": " (a network of another architecture?)"}


def _check_layout_matches(path: pathlib.Path, section: str, saved: list[dict], expected: list[dict]) -> list[int]:
    """Raise ValueError naming the first leaf whose path, shape, dtype or key
    impl differ; else return, for each expected leaf, its index among the
    saved ones."""
    index = {e["path"]: i for i, e in enumerate(saved)}
    where = f"checkpoint {str(path)!r} does not match the template's {_WHAT.get(section, section)}"
    other = "; was it saved from a network of another architecture?"
    for want in expected:
        name, shape = want["path"], tuple(want["shape"])
        if name not in index:
            raise ValueError(f"{where}: variable {name} (shape {shape}) is not in the checkpoint{other}")
        have = saved[index[name]]
        if tuple(have["shape"]) != shape:
            raise ValueError(f"{where}: variable {name} has shape {tuple(have['shape'])} in the checkpoint "
                             f"but shape {shape} in the template{_HINT.get(section, '')}")
        if (have["dtype"], have.get("key_impl")) != (want["dtype"], want.get("key_impl")):
            raise ValueError(f"{where}: variable {name} has dtype {have.get('key_impl') or have['dtype']} in the "
                             f"checkpoint but {want.get('key_impl') or want['dtype']} in the template")
    expected_paths = {e["path"] for e in expected}
    for have in saved:
        if have["path"] not in expected_paths:
            raise ValueError(f"{where}: the checkpoint has variable {have['path']} (shape {tuple(have['shape'])}) "
                             f"that the template lacks{other}")
    if len(index) != len(saved):
        raise ValueError(f"{where}: the checkpoint stores a variable twice")
    return [index[e["path"]] for e in expected]


# --------------------------------------------------------------------------- saving


@contextlib.contextmanager
def _ctrl_c_after() -> Iterator[None]:
    """Ctrl-C (SIGINT) waits until the block has run, then takes effect as it
    would have (once per Ctrl-C): a save cut short inside orbax leaves its
    event loop and coroutines half made, each printing a traceback or a
    warning. Only in a run of one process."""
    if (jax.process_count() > 1 or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):
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


def _commit(root: pathlib.Path, step: int, keep: int | None, values: dict[str, Any]) -> None:
    """Save ``values`` (item name -> arrays, or JSON for the layout, config
    and metadata) as checkpoint ``step`` in ``root`` through orbax's
    CheckpointManager, which keeps the newest ``keep``; a checkpoint of the
    same step is replaced. A failed save leaves nothing behind."""
    ocp = _ocp()
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    for name in _JSON_ITEMS:
        registry.add(name, ocp.args.JsonSave, ocp.handlers.JsonCheckpointHandler(filename=f"{name}.json"))
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, step_prefix=_STEP_PREFIX, step_format_fixed_length=_STEP_DIGITS,
        enable_async_checkpointing=False, save_root_metadata=False, cleanup_tmp_directories=True)
    args = ocp.args.Composite(**{name: (ocp.args.JsonSave if name in _JSON_ITEMS else ocp.args.StandardSave)(value)
                                 for name, value in values.items()})
    try:
        with ocp.CheckpointManager(root, options=options, handler_registry=registry) as manager:
            if step in manager.all_steps():
                manager.delete(step)
            manager.save(step, args=args, force=True)  # force: whatever the step, after the latest or not
    except BaseException:
        if jax.process_index() == 0:
            for leftover in root.glob(f"{_step_names().build_name(step)}{ocp.path.atomicity.TMP_DIR_SUFFIX}*"):
                shutil.rmtree(leftover, ignore_errors=True)
        raise


def _write(directory: str | os.PathLike, items: dict[str, dict[str, Any]], config: Any, *, step: int,
           keep: int | None, metadata: dict | None, who: str) -> pathlib.Path:
    """Write ``items`` (orbax item name -> {section name -> tree}) with the
    layout, ``config`` and ``metadata`` as the checkpoint ``directory/step_<step:012d>/``."""
    from nnx_ppo.algorithms.config import config_to_dict

    if keep is not None and keep <= 0:
        raise ValueError(f"{who}: keep must be positive or None, got {keep}")
    step = int(step)
    if step < 0:
        raise ValueError(f"{who}: step must be >= 0, got {step}")
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"{who}: config must be a TrainConfig instance, got {config!r}")
    try:
        json.dumps(metadata)  # fails before anything is written
    except TypeError as err:
        raise TypeError(f"{who}: metadata must be JSON-serializable ({err})") from None
    layout: dict[str, Any] = {"format": FORMAT_VERSION, "sections": {}}
    values: dict[str, Any] = {"layout": layout, "config": config_to_dict(config), "metadata": metadata}
    for item_name, sections in items.items():
        values[item_name] = {}
        for name, tree in sections.items():
            layout["sections"][name], leaves, _ = _describe_leaves(name, tree)
            values[item_name][name] = _as_item(leaves)
    root = pathlib.Path(directory).absolute()  # relative paths are resolved against the working directory
    with _ctrl_c_after():
        _commit(root, step, keep, values)
    return root / _step_names().build_name(step)


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
      keep: keep only this many most recently saved checkpoints (``None``: keep all).
      metadata: JSON-serializable dict saved as ``metadata/metadata.json``
        (e.g. how to rebuild the network for :func:`nnx_ppo.load_network`).

    Returns the path of the new checkpoint, complete when the call returns.
    The write is atomic: the checkpoint only appears under its final name
    once complete. Saving an existing step replaces it.
    """
    return _write(directory, _items(state), config, step=step, keep=keep, metadata=metadata, who="save_training_state")


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


def _read_json(path: pathlib.Path, item: str) -> Any:
    """The JSON item ``item`` of the checkpoint ``path``; a CheckpointError if
    it is missing or unreadable, or the checkpoint has an earlier layout."""
    if (path / "layout.json").is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by an earlier, unreleased version of nnx-ppo (layout format 1 "
            f"or 2: a layout.json beside network/) and cannot be read; this version reads format {FORMAT_VERSION}"
        )
    name = f"{item}/{item}.json"
    try:
        return json.loads((path / name).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {name} is missing") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: cannot read {name} ({err})") from None


def _read_layout(path: pathlib.Path) -> dict[str, list[dict]]:
    """The sections of the checkpoint's layout (checked for its format)."""
    layout = _read_json(path, "layout")
    if not isinstance(layout, dict) or not isinstance(layout.get("sections"), dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: layout/layout.json has no sections")
    if layout.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has layout format {layout.get('format')!r}; "
                              f"this version reads format {FORMAT_VERSION}")
    return layout["sections"]


def _leaf_value(restored: dict, j: int, entry: dict, stored: Any, template_leaf: Any, path: pathlib.Path) -> Any:
    """The ``j``-th saved leaf as the template holds it (``stored``: the
    template's leaf as stored, key data for keys)."""
    value = jnp.zeros(entry["shape"], entry["dtype"]) if math.prod(entry["shape"]) == 0 else restored[_leaf_name(j)]
    if tuple(value.shape) != tuple(entry["shape"]) or str(value.dtype) != entry["dtype"]:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt: {entry['path']} was read with shape "
            f"{tuple(value.shape)} {value.dtype}, expected {tuple(entry['shape'])} {entry['dtype']}"
        )
    if not stored.committed:
        # Like the template: a fresh state's arrays are not committed to a
        # device; committed ones would make jit compile the training program
        # (and every eager op) again for the resumed run.
        value = jnp.asarray(np.asarray(value))
    if entry["key_impl"] is not None:
        return jax.random.wrap_key_data(value, impl=entry["key_impl"])
    if isinstance(template_leaf, np.ndarray):
        return np.asarray(value)
    if isinstance(template_leaf, (bool, int, float, complex, np.generic)):
        return type(template_leaf)(np.asarray(value).item())
    return value


def _restore_item(path: pathlib.Path, item_name: str, sections: dict[str, Any],
                  saved_layout: dict[str, list[dict]]) -> dict[str, Any]:
    """Check ``sections`` (name -> template tree) against the layout, read the
    orbax item and rebuild each tree with the template's structure."""
    ocp = _ocp()
    prepared = {}
    target = {}
    for name, tree in sections.items():
        entries, arrays, treedef = _describe_leaves(name, tree)
        if name not in saved_layout:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: its layout lacks the {name!r} section")
        order = _check_layout_matches(path, name, saved_layout[name], entries)
        prepared[name] = (entries, arrays, treedef, jax.tree.leaves(tree), order)
        target[name] = {_leaf_name(j): jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
                        for j, a in zip(order, arrays) if math.prod(a.shape) > 0}
    try:
        checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
        restored = checkpointer.restore(path / item_name, args=ocp.args.StandardRestore(target))
    except Exception as err:  # orbax / tensorstore raise many kinds
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or unreadable: restoring {item_name}/ failed "
            f"({type(err).__name__}: {err})"
        ) from err
    return {name: jax.tree_util.tree_unflatten(treedef, [
        _leaf_value(restored[name], j, entry, stored, template_leaf, path)
        for j, entry, stored, template_leaf in zip(order, entries, arrays, template_leaves)])
        for name, (entries, arrays, treedef, template_leaves, order) in prepared.items()}


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
        layout = _read_layout(path)
        values = {}
        for item_name, sections in _items(template).items():
            values.update(_restore_item(path, item_name, sections, layout))
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
    data = _read_json(path, "config")
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: config/config.json is not an object")
    try:
        return config_from_dict(data, where=str(path / "config" / "config.json"), learning_rate=learning_rate)
    except ScheduleNotSavedError:
        raise
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {str(path)!r}: config/config.json is not a valid TrainConfig "
                              f"({err})") from err


def load_metadata(directory: str | os.PathLike) -> dict | None:
    """The metadata dict saved with the latest checkpoint (``None`` if none was given)."""
    return _read_json(_resolve_latest(directory), "metadata")


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
        (:func:`nnx_ppo.algorithms.population.train_seeds`), which seed's network
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
        layout = _read_layout(path)
        metadata = _read_json(path, "metadata")
        seeds = metadata.get("seeds") if isinstance(metadata, dict) else None
        if seeds is None:
            if seed is not None:
                raise ValueError(f"checkpoint {str(path)!r} holds one training run, not several seeds; "
                                 f"load it without seed= (got seed={seed})")
            return _restore_item(path, "network", {"params": params, "rest": rest}, layout)
        if seed not in seeds:
            raise ValueError(f"checkpoint {str(path)!r} holds the seeds {seeds} trained together; "
                             f"pass seed= one of them (got {seed!r})")
        stacked = jax.tree.map(lambda x: jnp.stack([x] * len(seeds)), {"params": params, "rest": rest})
        values = _restore_item(path, "network", stacked, layout)
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


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
