"""Recurrent cells: :class:`SimpleRNN`, :class:`LSTM`, :class:`GRU`, and
their base :class:`RecurrentCell`, from which a cell of your own is a few lines.

The cells are deterministic :class:`~nnx_ppo.networks.types.StatefulModule`
s: the carry holds the hidden state, there is no randomness in the forward
pass, and ``rollout_extras`` is ``None``.

Shapes (``B`` = batch, ``I`` = ``in_features``, ``H`` = ``hidden_features``):

* ``x``: ``[B, I]``; output: ``[B, H]`` (the new hidden state ``h``).
* LSTM carry: the tuple ``(h, c)``, each ``[B, H]`` (as in the original);
  GRU and SimpleRNN carry: ``[B, H]``.

With ``trainable_initial_state=True`` the initial carry is an ``nnx.Param``
(one vector per carry entry) tiled over the batch inside
:meth:`initialize_state` / :meth:`reset_state`, so the loss gradient reaches it
through every episode start that the replay re-runs.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import _original_paths
from nnx_ppo.networks.feedforward import check_argument, check_features, is_int, matmul
from nnx_ppo.networks.types import (
    SequenceOutput,
    StatefulModule,
    StatefulModuleOutput,
    flatten_time,
    has_fast_replay,
    replay_in_time,
    scan_unroll,
    select_where,
    straight_through,
    unflatten_time,
)

__all__ = ["RecurrentCell", "SimpleRNN", "LSTM", "GRU"]


class RecurrentCell(StatefulModule):
    """Base class of the recurrent cells (:class:`SimpleRNN`, :class:`LSTM`,
    :class:`GRU`, and your own).

    A cell is one step ``step(carry, z) -> (next_carry, output)`` on a batch;
    this base does the rest of the module contract:

    * the carry: :meth:`initialize_state` builds it from the layout
      :attr:`carry_keys` (zeros, or with ``trainable_initial_state=True`` the
      ``nnx.Param`` vectors ``initial_<key>`` tiled over the batch), and
      :meth:`reset_state` returns it again for the envs that start an episode;
    * :meth:`__call__`: checks the shapes of ``x`` and the carry (errors name
      the class), runs ``step(carry, project_input(x))`` and wraps the result
      in a :class:`~nnx_ppo.networks.types.StatefulModuleOutput` (no
      regularization, no metrics, ``rollout_extras=None``);
    * :meth:`update_statistics`: nothing (a cell has no running statistics);
    * the loss replay: a cell that overrides :meth:`project_input` computes it
      for all ``T`` steps of a minibatch at once and scans only :meth:`step`
      over time; otherwise the generic step-by-step replay runs. Either way
      the replay reproduces the rollout exactly.

    A subclass calls ``super().__init__(in_features, hidden_features,
    trainable_initial_state=...)`` first, creates its parameters, and defines:

    * :meth:`step` (required): one recurrent update on ``[B, ...]`` arrays;
    * :attr:`carry_keys` (the carry layout): ``None`` (the default) for one
      ``[B, H]`` array (initial parameter ``initial_h``), or a tuple of names
      for a dict of ``[B, H]`` arrays (initial parameters ``initial_<name>``);
      with :attr:`carry_as_tuple` set, a tuple of them in that order instead
      (:class:`LSTM`: ``("h", "c")``, the carry ``(h, c)``);
    * :meth:`project_input` (optional): the part of the step that depends on
      ``x`` alone (``x W + b``). With it, :meth:`step` runs inside a
      ``lax.scan`` over the module in the replay, so neither may write an NNX
      variable (leave it out if your cell counts calls).

    A carry of another form (entries of another width, a non-zero start):
    override :meth:`initialize_state` as well (it must return ``[B, ...]``
    leaves; :meth:`reset_state` calls it).

    Shapes (``B`` = batch, ``I`` = ``in_features``, ``H`` = ``hidden_features``):
    ``x`` is ``[B, I]``, the output what :meth:`step` returns (``[B, H]`` in
    the library's cells).

    Args:
      in_features: size ``I`` of the input's last axis.
      hidden_features: size ``H`` of every carry entry.
      trainable_initial_state: learn the initial carry (one ``nnx.Param`` of
        shape ``[H]`` per carry entry) instead of starting from zeros; the
        loss gradient reaches it through every episode start the replay re-runs.
    """

    carry_keys: ClassVar[tuple[str, ...] | None] = None
    carry_as_tuple: ClassVar[bool] = False

    def __init__(self, in_features: int, hidden_features: int, *, trainable_initial_state: bool = False):
        name = type(self).__name__
        check_argument(name, "in_features", in_features, is_int(in_features, 1), "a positive int")
        check_argument(name, "hidden_features", hidden_features, is_int(hidden_features, 1), "a positive int")
        self.in_features, self.hidden_features = in_features, hidden_features
        self.trainable_initial_state = bool(trainable_initial_state)
        if self.trainable_initial_state:
            for key in self._carry_names():
                setattr(self, f"initial_{key}", nnx.Param(jnp.zeros((hidden_features,), jnp.float32)))

    def step(self, carry: Any, z: Any) -> tuple[Any, Any]:
        """One recurrent update: ``(next_carry, output)`` from the carry
        (layout :attr:`carry_keys`, leaves ``[B, H]``) and ``z =
        project_input(x)`` (``x`` itself unless :meth:`project_input` is
        overridden)."""
        raise NotImplementedError(f"{type(self).__name__} must define step(carry, z) -> (next_carry, output)")

    def project_input(self, x: jax.Array) -> Any:
        """The input's part of the step, ``[B, I] -> [B, ...]`` (default: ``x``
        unchanged). Override it to have the loss replay compute it for all
        steps of a minibatch at once."""
        return x

    def _carry_names(self) -> tuple[str, ...]:
        return ("h",) if self.carry_keys is None else tuple(self.carry_keys)

    def initialize_state(self, batch_size: int) -> Any:
        """The carry of ``batch_size`` fresh envs: zeros, or the learnable
        ``initial_<key>`` vectors tiled over the batch."""
        if self.trainable_initial_state:  # [H] -> [B, H] (explicit, no rank promotion); differentiable
            entries = {key: jnp.tile(getattr(self, f"initial_{key}")[...][None, :], (batch_size, 1))
                       for key in self._carry_names()}
        else:
            shape = (batch_size, self.hidden_features)
            entries = {key: jnp.zeros(shape, jnp.float32) for key in self._carry_names()}
        if self.carry_keys is None:
            return entries["h"]
        return tuple(entries[key] for key in self.carry_keys) if self.carry_as_tuple else entries

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        check_features(type(self).__name__, x, self.in_features)
        self._check_state(state, x.shape[0])
        next_state, output = self.step(state, self.project_input(x))
        return StatefulModuleOutput(next_state=next_state, output=output)

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Loss replay. With :meth:`project_input` overridden, it is computed
        for all ``T`` steps at once and only :meth:`step` scans time; equal to
        the step-by-step replay (same operations, same order), which runs
        otherwise (and for a subclass that overrides ``__call__``)."""
        if (not has_fast_replay(self, RecurrentCell)
                or type(self).project_input is RecurrentCell.project_input):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        T, M = reset.shape
        flat_x = flatten_time(xs, T, M)
        check_features(type(self).__name__, flat_x, self.in_features)
        zx = unflatten_time(self.project_input(flat_x), T, M)

        def step(carry, inputs):
            z, reset_t, stored = inputs
            next_state, output = self._replay_step(carry, z, reset_t, stored)
            return next_state, (output, carry)

        _, (outputs, carries) = jax.lax.scan(step, carry, (zx, reset, stored_carry), unroll=scan_unroll())
        return _cell_sequence(outputs, carries)

    def _replay_step(self, carry: Any, z: Any, reset_t: jax.Array, stored: Any) -> tuple[Any, Any]:
        """One step of the fast replay, ``(next_carry, output)``: the stored
        carry (with the gradient of a recomputed reset) where ``reset_t``, then
        :meth:`step` on ``z = project_input(x)``, as the rollout computed it."""
        carry_in = select_where(reset_t, straight_through(stored, self.reset_state(carry)), carry)
        return self.step(carry_in, z)

    def _check_state(self, state: Any, batch: int) -> None:
        """The carry has the layout of :attr:`carry_keys` and ``[B, H]`` entries."""
        if self.carry_keys is None:
            self._check_h("state", state, batch)
            return
        if self.carry_as_tuple:
            if not isinstance(state, tuple) or len(state) != len(self.carry_keys):
                names = ", ".join(self.carry_keys)
                raise ValueError(f"{type(self).__name__}: state must be the tuple ({names}), got {state!r}")
            for i, (key, entry) in enumerate(zip(self.carry_keys, state)):
                self._check_h(f"state[{i}] ({key})", entry, batch)
            return
        if not isinstance(state, dict) or set(state) != set(self.carry_keys):
            keys = [repr(k) for k in self.carry_keys]
            listed = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]
            raise ValueError(f"{type(self).__name__}: state must be a dict with "
                             f"key{'s' if len(keys) > 1 else ''} {listed}, got {state!r}")
        for key in self.carry_keys:
            self._check_h(f"state[{key!r}]", state[key], batch)

    def _check_h(self, name: str, h: jax.Array, batch_size: int) -> None:
        shape, hidden = tuple(jnp.shape(h)), self.hidden_features
        if len(shape) != 2 or shape[1] != hidden:
            raise ValueError(f"{type(self).__name__}: {name} has shape {shape}, expected (B, {hidden}) "
                             f"(hidden_features={hidden})")
        if h.shape[0] != batch_size:
            raise ValueError(f"{type(self).__name__}: {name} has batch size {h.shape[0]}, expected {batch_size} "
                             "(the batch size of x)")


def _cell_sequence(outputs: Any, carries: Any) -> SequenceOutput:
    """A cell's replay result: its outputs and entering carries ``[T, M, ...]``
    (a cell has no regularization and no metrics)."""
    return SequenceOutput(output=outputs, regularization_loss=jnp.zeros((), jnp.float32), metrics={}, carry=carries)


def replays_in_stack(module: Any) -> bool:
    """Whether ``module`` is a cell that :func:`replay_stacked` replays
    together with the cells beside it in a
    :class:`~nnx_ppo.networks.containers.Sequential`: a :class:`RecurrentCell`
    with the fast replay (its :meth:`~RecurrentCell.project_input`
    overridden, neither ``__call__`` nor ``replay_sequence``)."""
    return (isinstance(module, RecurrentCell) and has_fast_replay(module, RecurrentCell)
            and type(module).replay_sequence is RecurrentCell.replay_sequence
            and type(module).project_input is not RecurrentCell.project_input)


def replay_stacked(cells: list[RecurrentCell], carries: list[Any], xs: Any, reset: jax.Array,
                   stored_carries: list[Any]) -> list[SequenceOutput]:
    """Loss replay of ``L`` stacked cells (each one's output the next one's
    input, all :func:`replays_in_stack`), one :class:`SequenceOutput` per cell.

    Each cell computes what its own replay computes, step by step from its
    stored carries, but the cells advance together along the diagonals of
    the ``[L, T]`` grid of their steps: at diagonal ``d`` cell ``l`` takes
    step ``t = d - l`` from what cell ``l - 1`` output at the diagonal
    before. So the ``L`` steps of a diagonal do not wait for one another
    (an accelerator runs their products side by side), and one loop of
    ``T - L + 1`` diagonals replaces ``L`` loops of ``T`` steps, each
    unrolled by :func:`~nnx_ppo.networks.types.scan_unroll`; the first and
    last ``L - 1`` diagonals, where fewer cells have a step, are written
    out. The first cell's :meth:`~RecurrentCell.project_input` runs for all
    ``T`` steps at once, the others' inside their steps, at the rollout's
    shape ``[M, ...]``.

    Shapes: ``xs`` ``[T, M, I]``, ``reset`` ``[T, M]``; ``carries[l]`` cell
    ``l``'s carry entering the replay (leaves ``[M, ...]``),
    ``stored_carries[l]`` its recorded carries (leaves ``[T, M, ...]``).
    With fewer steps than cells, each cell replays on its own in turn."""
    L, (T, M) = len(cells), reset.shape
    if T < L:
        results = []
        for cell, carry, stored in zip(cells, carries, stored_carries):
            results.append(cell.replay_sequence(carry, xs, None, reset, stored))
            xs = results[-1].output
        return results
    first = cells[0]
    flat_x = flatten_time(xs, T, M)
    check_features(type(first).__name__, flat_x, first.in_features)
    z_first = unflatten_time(first.project_input(flat_x), T, M)

    def diagonal(state, inputs, layers):
        """Cells ``layers`` each take one step: ``inputs`` is the first
        cell's ``z`` (None when it takes none) and each cell's ``(reset_t,
        stored)``; ``state`` the carries and what cells ``0..L-2`` output at
        the diagonal before."""
        (z_0, own), (carry, below) = inputs, state
        next_carry, next_below, records = list(carry), list(below), {}
        for layer in layers:
            cell = cells[layer]
            if layer == 0:
                z = z_0
            else:
                check_features(type(cell).__name__, below[layer - 1], cell.in_features)
                z = cell.project_input(below[layer - 1])
            next_carry[layer], output = cell._replay_step(carry[layer], z, *own[layer])
            records[layer] = (output, carry[layer])
            if layer < L - 1:
                next_below[layer] = output
        return (next_carry, next_below), records

    def inputs_at(d, layers):
        """The inputs of cells ``layers`` at diagonal ``d`` (an int; a slice of them for the loop)."""
        def pick(tree, shift):
            if isinstance(d, int):
                return jax.tree.map(lambda a: a[d - shift], tree)
            return jax.tree.map(lambda a: a[d.start - shift:d.stop - shift], tree)
        return (pick(z_first, 0) if 0 in layers else None,
                {layer: (pick(reset, layer), pick(stored_carries[layer], layer)) for layer in layers})

    state = (list(carries), [None] * (L - 1))
    head, tail = {layer: [] for layer in range(L)}, {layer: [] for layer in range(L)}
    for d in range(L - 1):  # cells 0..d take their first steps
        state, records = diagonal(state, inputs_at(d, range(d + 1)), range(d + 1))
        for layer, record in records.items():
            head[layer].append(record)
    state, body = jax.lax.scan(lambda s, i: diagonal(s, i, range(L)), state, inputs_at(slice(L - 1, T), range(L)),
                               unroll=scan_unroll())
    for d in range(T, T + L - 1):  # cells d-T+1..L-1 take their last steps
        state, records = diagonal(state, inputs_at(d, range(d - T + 1, L)), range(d - T + 1, L))
        for layer, record in records.items():
            tail[layer].append(record)
    results = []
    for layer in range(L):
        parts = [jax.tree.map(lambda *a: jnp.stack(a), *head[layer])] if head[layer] else []
        parts.append(body[layer])
        if tail[layer]:
            parts.append(jax.tree.map(lambda *a: jnp.stack(a), *tail[layer]))
        outputs, entering = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
        results.append(_cell_sequence(outputs, entering))
    return results


class _ProjectedCell(RecurrentCell):
    """What the library's cells share besides :class:`RecurrentCell`: the
    weight matrices ``kernel_x`` ``[I, G H]`` (LeCun normal) and ``kernel_h``
    ``[H, G H]`` (one orthogonal block per gate), drawn in that order from
    ``rngs.params()``, then the cell's own parameters (:meth:`_init_cell_params`);
    and :meth:`project_input`, ``x kernel_x + bias`` (:class:`GRU` has its own).
    """

    _n_gates = 1

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 trainable_initial_state: bool = False):
        super().__init__(in_features, hidden_features, trainable_initial_state=trainable_initial_state)
        g = self._n_gates * hidden_features
        self.kernel_x = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (in_features, g)))
        # One orthogonal block per gate keeps the recurrent map well conditioned.
        blocks = [nnx.initializers.orthogonal()(rngs.params(), (hidden_features, hidden_features))
                  for _ in range(self._n_gates)]
        self.kernel_h = nnx.Param(jnp.concatenate(blocks, axis=1))
        self._init_cell_params(hidden_features)

    def _init_cell_params(self, h: int) -> None:
        """Create the cell's own parameters (after the kernels) for ``h`` hidden features."""
        raise NotImplementedError

    def project_input(self, x: jax.Array) -> jax.Array:
        return matmul(x, self.kernel_x[...]) + self.bias[...][None, :]


def _finite_bias(cell: str, name: str, value: float) -> float:
    """``value`` as a float, or a ValueError naming the cell and the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{cell}: {name} must be a finite number, got {value!r}")
    return float(value)


class SimpleRNN(_ProjectedCell):
    """Elman recurrent cell::

        h' = activation(x W_x + h W_h + b)

    with ``tanh`` by default. ``W_x`` is LeCun normal, ``W_h`` orthogonal, ``b``
    starts at zero. Carry ``[B, H]``; output ``h'``.

    Args:
      in_features: size ``I`` of the input's last axis.
      hidden_features: size ``H`` of the hidden state.
      rngs: ``nnx.Rngs`` used for weight initialisation only.
      activation: the nonlinearity (default ``jnp.tanh``); a bounded one keeps
        the hidden state from growing over long episodes.
      trainable_initial_state: learn the initial ``h`` (``nnx.Param`` of shape
        ``[H]``) instead of starting from zeros.
    """

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 activation: Callable[[jax.Array], jax.Array] = jnp.tanh, trainable_initial_state: bool = False):
        check_argument("SimpleRNN", "activation", activation, callable(activation), "callable")
        self.activation = activation
        super().__init__(in_features, hidden_features, rngs, trainable_initial_state=trainable_initial_state)

    def _init_cell_params(self, h: int) -> None:
        self.bias = nnx.Param(jnp.zeros((h,), jnp.float32))

    def step(self, h, zx):
        h_new = self.activation(zx + matmul(h, self.kernel_h[...]))
        return h_new, h_new


class LSTM(_ProjectedCell):
    """Long short-term memory cell.

    Gates (``σ`` = logistic sigmoid, ``⊙`` = elementwise product)::

        i, f, g, o = split(x W_x + h W_h + b, 4)
        c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g)
        h' = σ(o) ⊙ tanh(c')

    The forget-gate bias starts at ``forget_bias`` (1 by default). Carry
    ``(h, c)``, each ``[B, H]`` (the original's layout); output ``h'``.

    Args:
      in_features: size ``I`` of the input's last axis.
      hidden_features: size ``H`` of the hidden and cell state.
      rngs: ``nnx.Rngs`` used for weight initialisation only.
      trainable_initial_state: learn the initial ``h`` and ``c`` (``nnx.Param``
        of shape ``[H]``) instead of starting from zeros.
      forget_bias: the forget gate's initial bias. The cell state then decays
        by about ``sigmoid(forget_bias)`` per step at first (0.73 at 1, 0.95
        at 3), so a larger value lets gradients reach further back in time.
    """

    _n_gates = 4
    carry_keys = ("h", "c")
    carry_as_tuple = True

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 trainable_initial_state: bool = False, forget_bias: float = 1.0):
        self.forget_bias = _finite_bias("LSTM", "forget_bias", forget_bias)
        super().__init__(in_features, hidden_features, rngs, trainable_initial_state=trainable_initial_state)

    def _init_cell_params(self, h: int) -> None:
        bias = jnp.zeros((4 * h,), jnp.float32).at[h:2 * h].set(self.forget_bias)
        self.bias = nnx.Param(bias)

    def step(self, state, zx):
        h, c = state
        z = zx + matmul(h, self.kernel_h[...])
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        return (h_new, c_new), h_new


class GRU(_ProjectedCell):
    """Gated recurrent unit (the variant with the reset gate applied after the
    recurrent matrix, as in cuDNN)::

        r  = σ(x W_xr + h W_hr + b_r)
        u  = σ(x W_xu + h W_hu + b_u)
        n  = tanh(x W_xn + b_n + r ⊙ (h W_hn + b_hn))
        h' = (1 - u) ⊙ n + u ⊙ h

    Carry ``[B, H]``; output ``h'``.

    Args:
      in_features: size ``I`` of the input's last axis.
      hidden_features: size ``H`` of the hidden state.
      rngs: ``nnx.Rngs`` used for weight initialisation only.
      trainable_initial_state: learn the initial ``h`` (``nnx.Param`` of shape
        ``[H]``) instead of starting from zeros.
      update_bias: the update gate's initial bias ``b_u`` (0 by default). The
        state then keeps about ``sigmoid(update_bias)`` of itself per step at
        first (0.5 at 0, 0.95 at 3), as an LSTM's ``forget_bias`` does.
    """

    _n_gates = 3

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 trainable_initial_state: bool = False, update_bias: float = 0.0):
        self.update_bias = _finite_bias("GRU", "update_bias", update_bias)
        super().__init__(in_features, hidden_features, rngs, trainable_initial_state=trainable_initial_state)

    def _init_cell_params(self, h: int) -> None:
        self.bias_x = nnx.Param(jnp.zeros((3 * h,), jnp.float32).at[h:2 * h].set(self.update_bias))
        self.bias_hn = nnx.Param(jnp.zeros((h,), jnp.float32))

    def project_input(self, x: jax.Array) -> jax.Array:
        return matmul(x, self.kernel_x[...]) + self.bias_x[...][None, :]

    def step(self, h, zx):
        hdim = self.hidden_features
        kh = self.kernel_h[...]
        zh_ru = matmul(h, kh[:, :2 * hdim])
        zh_n = matmul(h, kh[:, 2 * hdim:]) + self.bias_hn[...][None, :]
        r = jax.nn.sigmoid(zx[:, :hdim] + zh_ru[:, :hdim])
        u = jax.nn.sigmoid(zx[:, hdim:2 * hdim] + zh_ru[:, hdim:])
        n = jnp.tanh(zx[:, 2 * hdim:] + r * zh_n)
        h_new = (1.0 - u) * n + u * h
        return h_new, h_new


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
