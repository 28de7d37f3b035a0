"""The replay machinery: re-running a stretch ``[T, M]`` of a rollout.

The module contract (:mod:`nnx_ppo.networks.types`) says what one step does;
this module holds how a whole stored sequence is replayed for the loss:
:func:`replay_in_time` (the reference: a scan over time with the rollout's
resets), :func:`replay_flat` (modules without carry run once on the flattened
``[T * M]`` batch), :func:`straight_through` (stored value, recomputed
gradient), the one guard :func:`has_fast_replay` that decides whether a
module's faster ``replay_sequence`` applies, and the small helpers they share.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# The helpers module writers use (SequenceOutput, select_where, flatten_time,
# unflatten_time, straight_through, replay_in_time, replay_flat, scan_unroll)
# are public through nnx_ppo.networks.types, the module contract.
__all__ = ["has_fast_replay", "unrolled"]

_UNROLL = contextvars.ContextVar("nnx_ppo_replay_unroll", default=1)


def scan_unroll() -> int:
    """The ``unroll`` a replay's ``lax.scan`` over time uses: what the trainer
    asks for (``PPOConfig.replay_unroll``) while it traces the loss replay,
    1 otherwise. A module whose ``replay_sequence`` scans time passes it on:
    ``jax.lax.scan(step, carry, xs, unroll=scan_unroll())``."""
    return _UNROLL.get()


@contextlib.contextmanager
def unrolled(unroll: int):
    """Within this block :func:`scan_unroll` returns ``unroll`` (the trainer
    traces the loss replay inside it)."""
    token = _UNROLL.set(unroll)
    try:
        yield
    finally:
        _UNROLL.reset(token)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class SequenceOutput:
    """What :meth:`StatefulModule.replay_sequence` returns.

    Attributes:
      output: the module's outputs at every step, leaves ``[T, M, ...]``.
      regularization_loss: scalar, the module's ``regularization_loss`` averaged over steps.
      metrics: scalars, averaged over steps.
      carry: the carry the replay computed entering each step, before a reset
        was applied (leaves ``[T, M, ...]``; the stored carry for modules
        without state). Used by the consistency checker.
    """

    output: Any
    regularization_loss: jax.Array
    metrics: dict[str, Any]
    carry: Any


def select_where(mask: jax.Array, if_true: Any, if_false: Any) -> Any:
    """Per-env select over two trees of ``[B, ...]`` leaves with a ``[B]`` mask.

    Works for float, integer, boolean and typed-PRNG-key leaves.
    """

    def pick(a, b):
        m = jnp.reshape(mask, mask.shape + (1,) * (jnp.ndim(b) - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, if_true, if_false)


def flatten_time(tree: Any, T: int, M: int) -> Any:
    """``[T, M, ...]`` leaves to ``[T * M, ...]``."""
    return jax.tree.map(lambda x: jnp.reshape(x, (T * M,) + x.shape[2:]), tree)


def unflatten_time(tree: Any, T: int, M: int) -> Any:
    """``[T * M, ...]`` leaves to ``[T, M, ...]``."""
    return jax.tree.map(lambda x: jnp.reshape(x, (T, M) + x.shape[1:]), tree)


def straight_through(stored: Any, recomputed: Any) -> Any:
    """Value of ``stored``, gradient of ``recomputed`` for float leaves;
    other leaves (integers, PRNG keys) are taken from ``stored``."""

    def leaf(s, r):
        if jnp.issubdtype(s.dtype, jnp.floating):
            return s + (r - jax.lax.stop_gradient(r))
        return s

    return jax.tree.map(leaf, stored, recomputed)


def replay_in_time(module: nnx.Module, carry, xs, rollout_extras, reset, stored_carry) -> SequenceOutput:
    """Reference replay: scan ``module`` over time, one step at a time.

    Before step ``t`` the carry of envs with ``reset[t]`` is replaced by the
    stored post-reset carry (value) with the gradient of a recomputed
    ``reset_state``. The module's own variables ride along in the scan carry so
    a ``reset_state`` that advances its ``nnx.Rngs`` traces cleanly; those
    updates are discarded. Writes made by ``__call__`` are kept: after the
    scan, ``module`` holds the values its last step left, as after a
    :func:`replay_flat` (so a caller, e.g. the trainer's replay check, sees
    which variables the forward pass writes).
    """
    graphdef, variables = nnx.split(module)
    written_by_call: set[tuple] = set()  # variable paths __call__ writes (found when the step is traced)

    def step(scan_carry, inputs):
        carry, variables = scan_carry
        x, extras, reset_t, stored = inputs
        m = nnx.merge(graphdef, variables)
        carry_in = select_where(reset_t, straight_through(stored, m.reset_state(carry)), carry)
        before = _variable_values(m)
        out = m(carry_in, x, extras)
        _, variables = nnx.split(m)
        written_by_call.update(path for path, value in _variable_values(m).items() if value is not before[path])
        regularization = jnp.asarray(out.regularization_loss, jnp.float32)
        return (out.next_state, variables), (out.output, regularization, out.metrics, carry)

    inputs = (xs, rollout_extras, reset, stored_carry)
    (_, last), (output, regularization, metrics, carries) = jax.lax.scan(step, (carry, variables), inputs,
                                                                         unroll=scan_unroll())
    if written_by_call:
        last = dict(nnx.to_flat_state(last))
        for path, variable in nnx.to_flat_state(nnx.state(module)):
            if path in written_by_call:
                variable.set_value(last[path].get_value())
    return SequenceOutput(
        output=output,
        regularization_loss=jnp.mean(regularization),
        metrics={k: jnp.mean(v) for k, v in metrics.items()},
        carry=carries,
    )


def _variable_values(module: nnx.Module) -> dict[tuple, Any]:
    """``{path: value}`` of every NNX variable of ``module`` (a write replaces
    the value object, so identity tells which ones a call wrote)."""
    return {path: variable.get_value() for path, variable in nnx.to_flat_state(nnx.state(module))}


def has_fast_replay(module: nnx.Module, *classes: type) -> bool:
    """Whether ``module``'s forward pass is the one a fast ``replay_sequence``
    written for ``classes`` replays: ``type(module).__call__`` is one of
    theirs. A subclass that overrides ``__call__`` gets ``False`` and must be
    replayed by the generic :func:`replay_in_time`. Containers, recurrent
    layers and the PPO adapter all guard their fast replay with it."""
    return any(type(module).__call__ is cls.__call__ for cls in classes)


def replay_flat(module: nnx.Module, carry, xs, rollout_extras, reset, stored_carry) -> SequenceOutput:
    """Replay of a module without carry leaves: one call on the flattened
    ``[T * M]`` batch instead of a scan over time."""
    T, M = reset.shape
    out = module(carry, flatten_time(xs, T, M), None if rollout_extras is None else flatten_time(rollout_extras, T, M))
    return SequenceOutput(
        output=unflatten_time(out.output, T, M),
        regularization_loss=jnp.asarray(out.regularization_loss, jnp.float32),
        metrics={k: jnp.mean(v) for k, v in out.metrics.items()},
        carry=stored_carry,
    )
