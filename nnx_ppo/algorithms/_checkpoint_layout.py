"""Reading and describing checkpoints (internal to :mod:`nnx_ppo.algorithms.checkpointing`):
what a checkpoint stores about every leaf, the comparison with a template, and
the restore of saved sections into a template's structure.

Each saved section (``params``, ``rest``, ``opt_state``, ...) is flattened
into layout entries (path, shape, dtype, PRNG-key implementation) and plain
arrays; :func:`check_layout_matches` compares a checkpoint's entries with a
template's and names the first differing variable.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CheckpointError",
    "LAYOUT_FILE",
    "FORMAT_VERSION",
    "describe_leaves",
    "leaf_name",
    "as_item",
    "sections_of",
    "check_layout_matches",
    "checkpointer",
    "read_json",
    "read_layout",
    "restore_sections",
]

LAYOUT_FILE = "layout.json"
FORMAT_VERSION = 2
"""The layout this version writes and reads. Format 1 was written by earlier,
unreleased versions of nnx-ppo (other variable paths, no ``return_stats``):
such a checkpoint is refused in one line, not mapped."""


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (corrupt, truncated, not a checkpoint, or
    written by an earlier, unreleased version of nnx-ppo)."""


def checkpointer():
    """orbax's standard checkpointer (orbax imported on first use)."""
    import orbax.checkpoint as ocp

    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


def _path_name(prefix: str, path: tuple) -> str:
    """``params/layers/0/kernel``: a readable name of a leaf (no trailing ``.value``)."""
    if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and path[-1].name == "value":
        path = path[:-1]
    return "/".join([prefix, jax.tree_util.keystr(path, simple=True, separator="/")]) if path else prefix


def _is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def describe_leaves(prefix: str, tree: Any) -> tuple[list[dict], list[Any], Any]:
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
        entries.append({
            "path": _path_name(prefix, path),
            "shape": list(leaf.shape),
            "dtype": str(leaf.dtype),
            "key_impl": impl,
        })
        arrays.append(leaf)
    return entries, arrays, treedef


def leaf_name(i: int) -> str:
    """The key of the ``i``-th flattened leaf in the orbax item (``leaf_00007``)."""
    return f"leaf_{i:05d}"


def as_item(arrays: list[Any]) -> dict[str, Any]:
    """The arrays orbax writes; zero-size arrays (orbax refuses them, e.g. an
    MJX state's empty contact buffers) live in the layout only."""
    return {leaf_name(i): a for i, a in enumerate(arrays) if math.prod(a.shape) > 0}


def sections_of(state: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    """``{field: getattr(state, field)}`` for the named fields, in order."""
    return {name: getattr(state, name) for name in fields}


def _what(section: str) -> str:
    return {
        "params": "network parameters",
        "rest": "network variables (normalizer statistics, RNG streams)",
        "opt_state": "optimizer state",
        "rollout": "env states / network carries",
        "key": "training key",
        "iteration": "iteration counter",
    }.get(section, section)


def _hint(section: str) -> str:
    if section == "rollout":
        return " (another env or n_envs?)"
    if section in ("params", "rest", "opt_state"):
        return " (a network of another architecture?)"
    return ""


def check_layout_matches(path: pathlib.Path, section: str, saved: list[dict], expected: list[dict]) -> list[int]:
    """Raise ValueError naming the first leaf whose path, shape, dtype or key
    impl differ; else return, for each expected leaf, its index among the
    saved ones."""
    saved_by_path = {e["path"]: e for e in saved}
    expected_paths = {e["path"] for e in expected}
    where = f"checkpoint {str(path)!r} does not match the template's {_what(section)}"
    for want in expected:
        have = saved_by_path.get(want["path"])
        if have is None:
            raise ValueError(
                f"{where}: variable {want['path']} (shape {tuple(want['shape'])}) is not in the checkpoint; "
                "was it saved from a network of another architecture?"
            )
        if list(have["shape"]) != list(want["shape"]):
            raise ValueError(
                f"{where}: variable {want['path']} has shape {tuple(have['shape'])} in the checkpoint "
                f"but shape {tuple(want['shape'])} in the template{_hint(section)}"
            )
        if have["dtype"] != want["dtype"] or have.get("key_impl") != want.get("key_impl"):
            saved_kind = have.get("key_impl") or have["dtype"]
            want_kind = want.get("key_impl") or want["dtype"]
            raise ValueError(
                f"{where}: variable {want['path']} has dtype {saved_kind} in the checkpoint but "
                f"{want_kind} in the template"
            )
    for have in saved:
        if have["path"] not in expected_paths:
            raise ValueError(
                f"{where}: the checkpoint has variable {have['path']} (shape {tuple(have['shape'])}) "
                "that the template lacks; was it saved from a network of another architecture?"
            )
    if len(saved_by_path) != len(saved):
        raise ValueError(f"{where}: the checkpoint stores a variable twice")
    index = {e["path"]: i for i, e in enumerate(saved)}
    return [index[e["path"]] for e in expected]


def read_json(path: pathlib.Path) -> Any:
    """The JSON file ``path`` of a checkpoint (a CheckpointError if missing or unreadable)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {str(path.parent)!r} is corrupt: {path.name} is missing") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {str(path.parent)!r} is corrupt: cannot read {path.name} ({err})") from None


def read_layout(path: pathlib.Path) -> dict[str, list[dict]]:
    """The sections of the checkpoint's ``layout.json`` (checked for its format version)."""
    layout = read_json(path / LAYOUT_FILE)
    if not isinstance(layout, dict) or not isinstance(layout.get("sections"), dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {LAYOUT_FILE} has no sections")
    version = layout.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version < FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} was written by an earlier, unreleased version of nnx-ppo (layout format "
            f"{version}) and cannot be read; this version reads format {FORMAT_VERSION}"
        )
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(path)!r} has format {version!r}; this version reads format {FORMAT_VERSION}"
        )
    return layout["sections"]


def restore_sections(path: pathlib.Path, item_name: str, sections: dict[str, Any],
                      saved_layout: dict[str, list[dict]]) -> dict[str, Any]:
    """Check ``sections`` (name -> template tree) against the layout, read the
    orbax item and rebuild each tree with the template's structure."""
    import orbax.checkpoint as ocp

    prepared = {}
    for name, tree in sections.items():
        entries, arrays, treedef = describe_leaves(name, tree)
        if name not in saved_layout:
            raise CheckpointError(f"checkpoint {str(path)!r} is corrupt: {LAYOUT_FILE} lacks the {name!r} section")
        order = check_layout_matches(path, name, saved_layout[name], entries)
        prepared[name] = (entries, arrays, treedef, jax.tree.leaves(tree), order)

    target = {
        name: {leaf_name(j): jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
               for j, a in zip(order, arrays) if math.prod(a.shape) > 0}
        for name, (_, arrays, _, _, order) in prepared.items()
    }
    try:
        restored = checkpointer().restore(path / item_name, args=ocp.args.StandardRestore(target))
    except Exception as err:  # orbax / tensorstore raise many kinds
        raise CheckpointError(
            f"checkpoint {str(path)!r} is corrupt or unreadable: restoring {item_name}/ failed "
            f"({type(err).__name__}: {err})"
        ) from err

    out = {}
    for name, (entries, arrays, treedef, template_leaves, order) in prepared.items():
        leaves = []
        for j, entry, stored, template_leaf in zip(order, entries, arrays, template_leaves):
            if math.prod(entry["shape"]) == 0:
                value = jnp.zeros(entry["shape"], entry["dtype"])
            else:
                value = restored[name][leaf_name(j)]
            if tuple(value.shape) != tuple(entry["shape"]) or str(value.dtype) != entry["dtype"]:
                raise CheckpointError(
                    f"checkpoint {str(path)!r} is corrupt: {entry['path']} was read with shape "
                    f"{tuple(value.shape)} {value.dtype}, expected {tuple(entry['shape'])} {entry['dtype']}"
                )
            if not stored.committed:
                # Like the template (``stored``: its leaf as stored, key data for
                # keys): a fresh state's arrays are not committed to
                # a device; committed ones would make jit compile the training
                # program (and every eager op) again for the resumed run.
                value = jnp.asarray(np.asarray(value))
            if entry["key_impl"] is not None:
                value = jax.random.wrap_key_data(value, impl=entry["key_impl"])
            elif isinstance(template_leaf, np.ndarray):
                value = np.asarray(value)
            elif isinstance(template_leaf, (bool, int, float, complex, np.generic)):
                value = type(template_leaf)(np.asarray(value).item())
            leaves.append(value)
        out[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    return out
