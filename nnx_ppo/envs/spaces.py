"""Observation and action spaces.

Spaces are plain (static) Python objects, not pytrees: they describe the
shape/dtype/bounds of the arrays an environment produces or consumes.
An observation space may be a single :class:`Box` or a dict (any pytree)
whose leaves are :class:`Box`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Box", "Discrete", "space_shape", "flat_size"]


class Box:
    """A (possibly unbounded) box of real values.

    ``low``/``high`` are scalars or arrays broadcastable to ``shape``.
    Continuous *action* spaces exposed by nnx_ppo envs are always
    ``Box((k,), -1, 1)``: adapters rescale to the wrapped env's bounds.
    """

    def __init__(self, shape, low=-np.inf, high=np.inf, dtype=jnp.float32):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = jnp.dtype(dtype)
        self.low = np.broadcast_to(np.asarray(low, dtype=np.float64), self.shape).copy()
        self.high = np.broadcast_to(np.asarray(high, dtype=np.float64), self.shape).copy()
        if np.any(self.low > self.high):
            raise ValueError(f"Box low must be <= high, got low={low}, high={high}")

    def sample(self, key: jax.Array) -> jax.Array:
        """Uniform sample where bounded, standard normal (clipped) elsewhere."""
        finite = np.isfinite(self.low) & np.isfinite(self.high)
        low = np.where(finite, self.low, 0.0)
        high = np.where(finite, self.high, 1.0)
        k1, k2 = jax.random.split(key)
        u = jax.random.uniform(k1, self.shape, minval=jnp.asarray(low), maxval=jnp.asarray(high))
        n = jnp.clip(jax.random.normal(k2, self.shape), jnp.asarray(self.low), jnp.asarray(self.high))
        return jnp.where(jnp.asarray(finite), u, n).astype(self.dtype)

    def __eq__(self, other):
        return (isinstance(other, Box) and self.shape == other.shape and self.dtype == other.dtype
                and np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high))

    def __hash__(self):
        return hash((Box, self.shape, str(self.dtype)))

    def __repr__(self):
        def fmt(v):
            return f"{v.flat[0]:g}" if v.size and np.all(v == v.flat[0]) else repr(v)

        return f"Box(shape={self.shape}, low={fmt(self.low)}, high={fmt(self.high)}, dtype={self.dtype.name})"


class Discrete:
    """``n`` discrete choices; a value is an int32 scalar in ``[0, n)``."""

    def __init__(self, n: int):
        if int(n) < 1:
            raise ValueError(f"Discrete needs n >= 1, got {n}")
        self.n = int(n)
        self.shape: tuple[int, ...] = ()
        self.dtype = jnp.dtype(jnp.int32)

    def sample(self, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, (), 0, self.n, dtype=jnp.int32)

    def __eq__(self, other):
        return isinstance(other, Discrete) and other.n == self.n

    def __hash__(self):
        return hash((Discrete, self.n))

    def __repr__(self):
        return f"Discrete({self.n})"


def is_space(x: Any) -> bool:
    """Whether ``x`` is a :class:`Box` or a :class:`Discrete` (a leaf of a space tree)."""
    return isinstance(x, (Box, Discrete))


def space_shape(space):
    """Shape of one value of ``space``; for a pytree of spaces, the same pytree of shapes."""
    return jax.tree.map(lambda s: s.shape, space, is_leaf=is_space)


def flat_size(space_tree) -> int:
    """Total width of the flattened space tree.

    A Box counts ``prod(shape)``; a Discrete counts ``n`` (the width of its
    one-hot encoding, or the number of logits a policy head needs).
    """
    total = 0
    for s in jax.tree.leaves(space_tree, is_leaf=is_space):
        if isinstance(s, Discrete):
            total += s.n
        elif isinstance(s, Box):
            total += math.prod(s.shape)
        else:
            raise TypeError(f"flat_size: not a space: {s!r}")
    return total


def sample(space_tree, key: jax.Array):
    """Sample a value from a space or a pytree of spaces."""
    leaves, treedef = jax.tree.flatten(space_tree, is_leaf=is_space)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [s.sample(k) for s, k in zip(leaves, keys)])
