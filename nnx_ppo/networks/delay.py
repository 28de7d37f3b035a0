"""A fixed synaptic delay: :class:`Delay`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Delay"]


class Delay(StatefulModule):
    """Outputs the input it received ``k_steps`` steps earlier.

    With ``y_t`` the output and ``x_t`` the input at step ``t`` of an episode
    (``t = 0`` right after :meth:`initialize_state` or :meth:`reset_state`)::

        y_t = x_{t - k}   if t >= k
        y_t = 0           otherwise

    The carry is a buffer with the same tree structure as ``sample_input``
    whose leaves have shape ``[B, k, *leaf_shape]``; slot 0 holds the oldest
    input. :meth:`reset_state` zeros the buffer. With ``k_steps=0`` the module
    is the identity and its carry is ``()``.

    Args:
      sample_input: an *unbatched* example of one input (any pytree of arrays,
        e.g. ``jnp.zeros(3)`` or ``{"a": jnp.zeros(2)}``); only its tree
        structure, leaf shapes and dtypes are used.
      k_steps: the delay in steps, ``>= 0``.
    """

    def __init__(self, sample_input: Any, k_steps: int):
        if isinstance(k_steps, bool) or not isinstance(k_steps, int) or k_steps < 0:
            raise ValueError(f"Delay: k_steps must be an int >= 0, got {k_steps!r}")
        leaves, treedef = jax.tree.flatten(sample_input)
        if not leaves:
            raise ValueError("Delay: sample_input must contain at least one array leaf")
        self.k_steps = k_steps
        self._treedef = treedef
        self._leaf_shapes = tuple(tuple(int(d) for d in jnp.shape(leaf)) for leaf in leaves)
        self._leaf_dtypes = tuple(jnp.result_type(leaf).name for leaf in leaves)

    def _check_x(self, x: Any) -> list[jax.Array]:
        leaves, treedef = jax.tree.flatten(x)
        if treedef != self._treedef:
            raise ValueError(f"Delay: x has tree structure {treedef}, expected {self._treedef} "
                             "(the structure of sample_input)")
        batch = None
        for i, (leaf, shape) in enumerate(zip(leaves, self._leaf_shapes)):
            got = tuple(jnp.shape(leaf))
            if len(got) != len(shape) + 1 or got[1:] != shape:
                raise ValueError(f"Delay: x leaf {i} has shape {got}, expected (B, "
                                 + "".join(f"{d}, " for d in shape).rstrip(", ") + ") "
                                 "(the shape of sample_input with a leading batch axis)")
            if batch is None:
                batch = got[0]
            elif got[0] != batch:
                raise ValueError(f"Delay: x leaves have different batch sizes ({batch} and {got[0]})")
        return leaves

    def initialize_state(self, batch_size: int) -> Any:
        if self.k_steps == 0:
            return ()
        leaves = [jnp.zeros((batch_size, self.k_steps) + shape, dtype)
                  for shape, dtype in zip(self._leaf_shapes, self._leaf_dtypes)]
        return jax.tree.unflatten(self._treedef, leaves)

    def reset_state(self, prev_state: Any) -> Any:
        if self.k_steps == 0:
            return ()
        return jax.tree.map(jnp.zeros_like, prev_state)

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        x_leaves = self._check_x(x)
        if self.k_steps == 0:
            return StatefulModuleOutput(next_state=(), output=x, regularization_loss=0.0,
                                        metrics={}, rollout_extras=None)
        s_leaves, s_treedef = jax.tree.flatten(state)
        if s_treedef != self._treedef:
            raise ValueError(f"Delay: state has tree structure {s_treedef}, expected {self._treedef}")
        out_leaves, next_leaves = [], []
        for buf, xl, shape in zip(s_leaves, x_leaves, self._leaf_shapes):
            expected = (xl.shape[0], self.k_steps) + shape
            if tuple(buf.shape) != expected:
                raise ValueError(f"Delay: state leaf has shape {tuple(buf.shape)}, expected "
                                 f"{expected} (B, k_steps={self.k_steps}, *leaf shape)")
            out_leaves.append(buf[:, 0])
            next_leaves.append(jnp.concatenate([buf[:, 1:], xl[:, None].astype(buf.dtype)], axis=1))
        return StatefulModuleOutput(
            next_state=jax.tree.unflatten(self._treedef, next_leaves),
            output=jax.tree.unflatten(self._treedef, out_leaves),
            regularization_loss=0.0, metrics={}, rollout_extras=None)
