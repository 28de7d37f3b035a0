"""What a checkpoint stores about every leaf, and the comparison with a template.

Each saved section (``params``, ``rest``, ``opt_state``, ...) is flattened
into layout entries (path, shape, dtype, PRNG-key implementation) and plain
arrays; :func:`check_layout_matches` compares a checkpoint's entries with a
template's and names the first differing variable.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["describe_leaves", "leaf_name", "as_item", "sections_of", "check_layout_matches"]


def _entry_name(entry: Any) -> str:
    if isinstance(entry, jax.tree_util.DictKey):
        return str(entry.key)
    if isinstance(entry, jax.tree_util.SequenceKey):
        return str(entry.idx)
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return entry.name
    if isinstance(entry, jax.tree_util.FlattenedIndexKey):
        return str(entry.key)
    return str(entry)


def _path_name(prefix: str, path: tuple) -> str:
    """``params/layers/0/kernel``: a readable name of a leaf (no trailing ``.value``)."""
    names = [_entry_name(e) for e in path]
    if names and names[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
        names = names[:-1]
    return "/".join([prefix, *names])


def _is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impl_name(leaf: Any) -> str:
    return str(jax.random.key_impl(leaf))


def describe_leaves(prefix: str, tree: Any) -> tuple[list[dict], list[Any], Any]:
    """Flatten one section: ``(layout entries, storable arrays, treedef)``.

    Keys are replaced by their key data; every leaf becomes an array.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    entries, arrays = [], []
    for path, leaf in flat:
        impl = None
        if _is_key(leaf):
            impl = _key_impl_name(leaf)
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


def check_layout_matches(path: pathlib.Path, section: str, saved: list[dict], expected: list[dict]) -> None:
    """Raise ValueError naming the first leaf whose path, shape, dtype or key impl differ."""
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
    # Same set of paths: the leaf order must agree too (it does for equal tree structures).
    if [e["path"] for e in saved] != [e["path"] for e in expected]:
        raise ValueError(f"{where}: the variables are stored in another order (a different tree structure)")
