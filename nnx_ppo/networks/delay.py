"""A fixed synaptic delay: :class:`Delay`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.feedforward import check_argument, is_int
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Delay"]


class Delay(StatefulModule):
    """Outputs the input it received ``k_steps`` steps earlier.

    With ``y_t`` the output and ``x_t`` the input at step ``t`` of an episode
    (``t = 0`` right after :meth:`initialize_state` or :meth:`reset_state`)::

        y_t = x_{t - k}         if t >= k
        y_t = initial_value     otherwise

    The carry is the original's ring buffer, ``{"buffer": ..., "idx": [B]}``:
    ``buffer`` has the tree structure of ``sample_input`` with leaves
    ``[B, k, *leaf_shape]``, and ``idx`` (int32) is, per env, the slot read
    (the input of ``k`` steps ago) and then overwritten with ``x_t`` at this
    step, advancing by one modulo ``k``. Every env has its own position, so a
    slice of the carry over envs (a minibatch) steps exactly as those envs do
    in the whole batch. :meth:`reset_state` fills the buffer with
    ``initial_value`` again and sets ``idx`` to 0. With ``k_steps=0`` the
    module is the identity and its carry is ``()``.

    Args:
      sample_input: an *unbatched* example of one input (any pytree of arrays,
        e.g. ``jnp.zeros(3)`` or ``{"a": jnp.zeros(2)}``); only its tree
        structure, leaf shapes and dtypes are used.
      k_steps: the delay in steps, ``>= 0``.
      initial_value: what the buffer holds before it fills (a number; every
        element of every leaf), as in the original.
    """

    def __init__(self, sample_input: Any, k_steps: int, initial_value: float = 0.0):
        check_argument("Delay", "k_steps", k_steps, is_int(k_steps, 0), "an int >= 0")
        leaves, treedef = jax.tree.flatten(sample_input)
        if not leaves:
            raise ValueError("Delay: sample_input must contain at least one array leaf")
        self.k_steps = k_steps
        self.initial_value = float(initial_value)
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
        leaves = [jnp.full((batch_size, self.k_steps) + shape, self.initial_value, dtype)
                  for shape, dtype in zip(self._leaf_shapes, self._leaf_dtypes)]
        return {"buffer": jax.tree.unflatten(self._treedef, leaves), "idx": jnp.zeros((batch_size,), jnp.int32)}

    def _check_state(self, state: Any, batch: int) -> tuple[list[jax.Array], jax.Array]:
        if not isinstance(state, dict) or set(state) != {"buffer", "idx"}:
            raise ValueError(f"Delay: state must be the dict {{'buffer', 'idx'}} from initialize_state, got {state!r}")
        leaves, treedef = jax.tree.flatten(state["buffer"])
        if treedef != self._treedef:
            raise ValueError(f"Delay: state['buffer'] has tree structure {treedef}, expected {self._treedef}")
        for buf, shape in zip(leaves, self._leaf_shapes):
            expected = (batch, self.k_steps) + shape
            if tuple(buf.shape) != expected:
                raise ValueError(f"Delay: state['buffer'] leaf has shape {tuple(buf.shape)}, expected "
                                 f"{expected} (B, k_steps={self.k_steps}, *leaf shape)")
        if tuple(jnp.shape(state["idx"])) != (batch,):
            raise ValueError(f"Delay: state['idx'] has shape {tuple(jnp.shape(state['idx']))}, expected ({batch},)")
        return leaves, state["idx"]

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        x_leaves = self._check_x(x)
        if self.k_steps == 0:
            return StatefulModuleOutput(next_state=(), output=x)
        buffers, idx = self._check_state(state, x_leaves[0].shape[0])
        out_leaves, next_leaves = [], []
        for buf, xl in zip(buffers, x_leaves):
            trailing = (1,) * (buf.ndim - 2)
            out_leaves.append(jnp.take_along_axis(buf, jnp.reshape(idx, idx.shape + (1,) + trailing), axis=1)[:, 0])
            at = jnp.reshape(jnp.arange(self.k_steps)[None, :] == idx[:, None], idx.shape + (self.k_steps,) + trailing)
            next_leaves.append(jnp.where(at, xl[:, None].astype(buf.dtype), buf))
        next_state = {"buffer": jax.tree.unflatten(self._treedef, next_leaves),
                      "idx": ((idx + 1) % self.k_steps).astype(jnp.int32)}
        return StatefulModuleOutput(next_state=next_state, output=jax.tree.unflatten(self._treedef, out_leaves))
