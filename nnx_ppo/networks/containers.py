"""Containers: compose :class:`StatefulModule` children into one module.

The general containers live here; two routing ones built on them,
``Map`` and ``Merge``, live in :mod:`nnx_ppo.networks.utils`, and
:class:`~nnx_ppo.networks.adapter.PPOAdapter` is a :class:`DictContainer`.
Every container routes the carry (``state``), the ``rollout_extras`` and
``update_statistics`` to its children in the same tree shape it holds them
in (a tuple for :class:`Sequential`, a dict for the others), sums the
children's ``regularization_loss`` and prefixes their metrics with the
child's index or name (``"1/entropy"``, ``"value/kl_divergence"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.recurrent import replay_stacked, replays_in_stack
from nnx_ppo.networks.types import (
    SequenceOutput,
    StatefulModule,
    StatefulModuleOutput,
    flatten_time,
    has_fast_replay,
    replay_in_time,
    scan_unroll,
    unflatten_time,
)

__all__ = ["Sequential", "Parallel", "Concat", "Splitter", "DictContainer", "MissingKeyError"]


class MissingKeyError(KeyError, ValueError):
    """A per-key container (``Map``, ``Concat``, ``PPOAdapter``) got a dict
    input without a key one of its children reads. A ``KeyError``, as
    ``x[name]`` raised in the original nnx-ppo, and a ``ValueError``, as
    this library's other input errors."""

    def __str__(self) -> str:
        # KeyError shows its argument's repr; the message reads better plain.
        return str(self.args[0]) if self.args else ""


def _named(owner: str, positional: Mapping[str, Any] | None, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
    """``owner``'s entries given as a positional dict or as keyword arguments
    (not both, not empty: ``what`` names one entry in the error)."""
    if positional is not None and kwargs:
        raise ValueError(f"{owner}: pass either a positional dict or keyword arguments, not both")
    entries = dict(positional if positional is not None else kwargs)
    if not entries:
        raise ValueError(f"{owner}: needs at least one {what}")
    return entries


def _regularization_and_metrics(results: dict[Any, Any]) -> tuple[Any, dict[str, Any]]:
    """The children's ``regularization_loss`` summed (in the order of
    ``results``) and their metrics under ``"{key}/{metric}"``."""
    metrics: dict[str, Any] = {}
    regularization = jnp.zeros((), jnp.float32)
    for key, result in results.items():
        regularization = regularization + result.regularization_loss
        metrics.update({f"{key}/{name}": value for name, value in result.metrics.items()})
    return regularization, metrics


def combine_sequences(results: dict[Any, SequenceOutput], output: Any) -> SequenceOutput:
    """A container's :class:`SequenceOutput` from its children's: summed
    regularization, prefixed metrics, carries under the children's keys."""
    regularization, metrics = _regularization_and_metrics(results)
    return SequenceOutput(output=output, regularization_loss=regularization, metrics=metrics,
                          carry={key: result.carry for key, result in results.items()})


def combine_outputs(results: dict[Any, StatefulModuleOutput], output: Any) -> StatefulModuleOutput:
    """A container's step output from its children's (in the order they ran):
    summed regularization, prefixed metrics, carries and extras under the
    children's keys."""
    regularization, metrics = _regularization_and_metrics(results)
    return StatefulModuleOutput(next_state={key: result.next_state for key, result in results.items()},
                                output=output, regularization_loss=regularization, metrics=metrics,
                                rollout_extras={key: result.rollout_extras for key, result in results.items()})


def child_extras(rollout_extras: Any, key: Any) -> Any:
    """The replayed extras of one child (``None`` during a rollout)."""
    return None if rollout_extras is None else rollout_extras[key]


class DictContainer(StatefulModule):
    """Shared plumbing for containers that hold named children.

    Subclasses choose what each child sees (:meth:`_inputs`) and how the
    children's outputs combine (:meth:`_combine`); calling, replaying,
    carries, resets and statistics are routed here once for all of them.
    """

    def __init__(self, modules=None, /, **kwargs):
        # Container({"a": m}) or Container(a=m) (not both, not empty)
        components = _named(type(self).__name__, modules, kwargs, "child module")
        for name, child in components.items():
            if not isinstance(child, StatefulModule):
                raise TypeError(f"{type(self).__name__}: child {name!r} must be a StatefulModule, got "
                                f"{type(child).__name__}")
        self.components = nnx.Dict(components)
        # nnx.split/merge rebuilds ``components`` with sorted keys; keep the
        # construction order (Concat's concatenation order) as static data.
        self.names = tuple(components)

    def _children(self):
        """``(name, child)`` pairs in construction order."""
        return [(name, self.components[name]) for name in self.names]

    def _inputs(self, x):
        """What each child sees: ``{name: input}`` (default: per-key
        dispatch, child ``name`` sees ``x[name]``)."""
        if not isinstance(x, Mapping):
            raise ValueError(f"{type(self).__name__}: x must be a dict with keys {list(self.names)}, "
                             f"got {type(x).__name__}")
        missing = [k for k in self.names if k not in x]
        if missing:
            raise MissingKeyError(f"{type(self).__name__}: x is missing keys {missing}; expected at least "
                                  f"{list(self.names)}, got {list(x)}")
        return {name: x[name] for name in self.names}

    def _combine(self, outputs):
        """The container's output from ``{name: child_output}`` (default: the dict)."""
        return outputs

    def __call__(self, state, x, rollout_extras=None):
        inputs = self._inputs(x)
        results = {name: child(state[name], inputs[name], child_extras(rollout_extras, name))
                   for name, child in self._children()}
        return combine_outputs(results, self._combine({name: out.output for name, out in results.items()}))

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Replay each child on its own (stateless children without a time scan)."""
        if not has_fast_replay(self, DictContainer):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        inputs = self._inputs(xs)
        results = {name: child.replay_sequence(carry[name], inputs[name], child_extras(rollout_extras, name), reset,
                                               stored_carry[name])
                   for name, child in self._children()}
        T, M = reset.shape
        outputs = flatten_time({name: r.output for name, r in results.items()}, T, M)
        return combine_sequences(results, unflatten_time(self._combine(outputs), T, M))

    def initialize_state(self, batch_size):
        return {name: c.initialize_state(batch_size) for name, c in self._children()}

    def reset_state(self, prev_state):
        return {name: c.reset_state(prev_state[name]) for name, c in self._children()}

    def update_statistics(self, rollout_extras):
        for name, child in self._children():
            child.update_statistics(rollout_extras[name])

    def __getitem__(self, name):
        return self.components[name]


class Sequential(StatefulModule):
    """Chain of modules: the output of child ``i`` is the input of child ``i+1``.

    ``Sequential([a, b, c])`` or ``Sequential(a, b, c)``. Carry and extras are
    tuples with one entry per child.
    """

    def __init__(self, *layers: StatefulModule | Sequence[StatefulModule]):
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        if not layers:
            raise ValueError("Sequential: needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, StatefulModule):
                raise TypeError(f"Sequential: layer {i} must be a StatefulModule, got {type(layer).__name__}")
        self.layers = nnx.List(layers)

    def __call__(self, state, x, rollout_extras=None):
        results = {}
        for i, layer in enumerate(self.layers):
            results[i] = layer(state[i], x, child_extras(rollout_extras, i))
            x = results[i].output
        combined = combine_outputs(results, x)
        return combined.replace(next_state=tuple(combined.next_state.values()),
                                rollout_extras=tuple(combined.rollout_extras.values()))

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Replay layer by layer: stateless layers run on the flattened batch,
        stateful ones scan time; in an unrolled replay consecutive recurrent
        cells scan it together (:func:`~nnx_ppo.networks.recurrent.replay_stacked`)."""
        if not has_fast_replay(self, Sequential):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        results, i = {}, 0
        while i < len(self.layers):
            stack = self._stack_at(i)
            if len(stack) > 1:  # consecutive cells replay together (replay_stacked)
                replayed = replay_stacked([self.layers[j] for j in stack], [carry[j] for j in stack], xs, reset,
                                          [stored_carry[j] for j in stack])
                results.update(zip(stack, replayed))
            else:
                results[i] = self.layers[i].replay_sequence(carry[i], xs, child_extras(rollout_extras, i), reset,
                                                            stored_carry[i])
            i = stack[-1] + 1
            xs = results[stack[-1]].output
        combined = combine_sequences(results, xs)
        return dataclasses.replace(combined, carry=tuple(combined.carry.values()))

    def _stack_at(self, i: int) -> list[int]:
        """The indices of the cells from layer ``i`` on that replay together
        (:func:`~nnx_ppo.networks.recurrent.replays_in_stack`), or ``[i]``.
        Only in a replay unrolled over time (:func:`~nnx_ppo.networks.types.scan_unroll`
        above 1: an accelerator's default): rolled, as on a CPU, each cell
        replays alone, and a later cell computes its input products for all
        steps at once, which a CPU's small minibatches favour (a cell that
        replays together computes them step by step, reading its weights at
        every step: the intention network's 4 x 512 LSTM decoder at 16 envs on
        a 2-core CPU trained at 85 env-steps/s together, 147-190 alone)."""
        end = i
        if scan_unroll() > 1:
            while end < len(self.layers) and replays_in_stack(self.layers[end]):
                end += 1
        return list(range(i, max(end, i + 1)))

    def initialize_state(self, batch_size):
        return tuple(layer.initialize_state(batch_size) for layer in self.layers)

    def reset_state(self, prev_state):
        return tuple(layer.reset_state(s) for layer, s in zip(self.layers, prev_state))

    def update_statistics(self, rollout_extras):
        for layer, extras in zip(self.layers, rollout_extras):
            layer.update_statistics(extras)

    def __getitem__(self, index):
        return self.layers[index]

    def __len__(self):
        return len(self.layers)


class Parallel(DictContainer):
    """Run every child on the **same** input; output ``{name: child_output}``.

    ``Parallel(actor=a, critic=c)`` or ``Parallel({"actor": a, "critic": c})``.
    """

    def _inputs(self, x):
        return {name: x for name in self.names}


class Concat(DictContainer):
    """Per-key dispatch then concatenation: child ``name`` sees ``x[name]``;
    the children's ``[B, F_i]`` outputs are concatenated on the last axis
    (in construction order)."""

    def _combine(self, outputs):
        pieces = [jnp.reshape(outputs[name], (outputs[name].shape[0], -1)) for name in self.names]
        return jnp.concatenate(pieces, axis=-1)


class Splitter(StatefulModule):
    """Split a ``[B, F]`` input into named slices of its last axis.

    ``Splitter(action_params=4, value=1)`` maps ``[B, 5]`` to
    ``{"action_params": [B, 4], "value": [B, 1]}``, slices taken in argument
    order. The input must have at least the sum of the sizes as features.
    Stateless (carry ``()``).
    """

    def __init__(self, sizes: Mapping[str, int] | None = None, /, **kwargs: int):
        sizes = _named("Splitter", sizes, kwargs, "named slice")
        for name, size in sizes.items():
            if int(size) <= 0:
                raise ValueError(f"Splitter: size of slice {name!r} must be positive, got {size}")
        self.sizes = tuple((name, int(size)) for name, size in sizes.items())

    def __call__(self, state, x, rollout_extras=None):
        total = sum(size for _, size in self.sizes)
        if jnp.ndim(x) < 2 or x.shape[-1] < total:
            raise ValueError(f"Splitter: x has shape {jnp.shape(x)}, expected (B, >= {total}) for slices "
                             f"{dict(self.sizes)}")
        output, start = {}, 0
        for name, size in self.sizes:
            output[name] = x[..., start : start + size]
            start += size
        return StatefulModuleOutput(next_state=(), output=output)
