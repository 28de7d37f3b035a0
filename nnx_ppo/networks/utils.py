"""Small routing and reshaping modules for building networks from pytrees.

* :class:`Flattener` - pytree of ``[B, ...]`` leaves to one ``[B, F]`` array.
* :class:`Filter` - pick and rename entries of a dict input.
* :class:`Map`, :class:`Merge` - per-key dispatch and merged dict outputs (containers).
* :class:`Scale` - multiply by a constant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.containers import DictContainer, Parallel
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Flattener", "Filter", "Map", "Merge", "Scale", "NotADictError"]


class NotADictError(TypeError, ValueError):
    """A :class:`Merge` child output something other than a dict. A
    ``TypeError``, as in the original nnx-ppo, and a ``ValueError``, as this
    library's other input errors."""


def flatten_batch(tree: Any) -> jax.Array:
    """Concatenate every ``[B, ...]`` leaf of ``tree`` into ``[B, F]`` (leaf order)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError("Flattener: input has no array leaves")
    pieces = [jnp.reshape(leaf, (leaf.shape[0], -1)).astype(jnp.result_type(float)) for leaf in leaves]
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=-1)


def _flatten_below(x: Any, levels: int, preserve_levels: int) -> Any:
    if levels == 0:
        return flatten_batch(x)
    if isinstance(x, Mapping):
        return {k: _flatten_below(v, levels - 1, preserve_levels) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_flatten_below(v, levels - 1, preserve_levels) for v in x)
    depth = preserve_levels - levels
    raise TypeError(f"Flattener: preserve_levels={preserve_levels} keeps {preserve_levels} levels of dict/list/tuple "
                    f"structure, but the input has a leaf ({type(x).__name__}) at depth {depth}")


class Flattener(StatefulModule):
    """Flatten a pytree of ``[B, ...]`` leaves into a ``[B, F]`` array.

    With ``preserve_levels=N`` the top ``N`` levels of dict/list/tuple
    structure are kept and only what lies below is flattened:
    ``Flattener(preserve_levels=1)`` maps ``{"a": {"p": [B, 4], "q": [B, 2]}, "b": [B, 3]}``
    to ``{"a": [B, 6], "b": [B, 3]}``. An input with a leaf (an array)
    less than ``N`` levels deep is a ``TypeError``.
    """

    def __init__(self, preserve_levels: int = 0):
        if preserve_levels < 0:
            raise ValueError(f"Flattener: preserve_levels must be >= 0, got {preserve_levels}")
        self.preserve_levels = preserve_levels

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=(), output=_flatten_below(x, self.preserve_levels, self.preserve_levels))


FilterSpec = str | tuple | Callable[[Any], Any]


class Filter(StatefulModule):
    """Build a dict from parts of the input.

    ``spec`` maps each output key to a string key of ``x``, a tuple path
    (``("a", "b")`` takes ``x["a"]["b"]``), or a callable applied to ``x``.
    Unnamed entries are dropped.
    """

    def __init__(self, spec: Mapping[str, FilterSpec]):
        if not isinstance(spec, Mapping) or not spec:
            raise TypeError(f"Filter: spec must be a non-empty dict, got {spec!r}")
        for key, sub in spec.items():
            if not (isinstance(sub, (str, tuple)) or callable(sub)):
                raise TypeError(f"Filter: spec[{key!r}] must be a key, a tuple path or a callable, got {sub!r}")
        self.spec = dict(spec)

    def __call__(self, state, x, rollout_extras=None):
        output = {}
        for key, sub in self.spec.items():
            if callable(sub):
                output[key] = sub(x)
                continue
            path = (sub,) if isinstance(sub, str) else sub
            value = x
            for i, part in enumerate(path):
                try:
                    value = value[part]
                except (KeyError, IndexError, TypeError) as err:
                    raise ValueError(f"Filter: spec[{key!r}] path {path[: i + 1]} not found in the input") from err
            output[key] = value
        return StatefulModuleOutput(next_state=(), output=output)


class Scale(StatefulModule):
    """Multiply every leaf of the input by a constant ``factor``."""

    def __init__(self, factor: float):
        self.factor = float(factor)

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=(), output=jax.tree.map(lambda v: v * self.factor, x))


class Map(DictContainer):
    """Per-key dispatch: child ``name`` maps ``x[name]`` to ``output[name]``.

    ``Map(arm=NormalTanhSampler(rngs), grip=CategoricalSampler(rngs))``. Input
    keys without a child are dropped; a missing key is a
    :class:`~nnx_ppo.networks.containers.MissingKeyError` (a ``KeyError``
    and a ``ValueError``).
    """


class Merge(Parallel):
    """Run every child on the same input (like :class:`Parallel`) and merge
    their dict outputs into one flat dict; a key produced by two children is
    a ``ValueError``, a child whose output is not a dict a
    :class:`NotADictError` (a ``TypeError`` and a ``ValueError``)."""

    def _combine(self, outputs):
        merged = {}
        for name in self.names:
            out = outputs[name]
            if not isinstance(out, Mapping):
                raise NotADictError(f"Merge: child {name!r} must output a dict, got {type(out).__name__}")
            for key, value in out.items():
                if key in merged:
                    raise ValueError(f"Merge: key {key!r} is produced by more than one child")
                merged[key] = value
        return merged
