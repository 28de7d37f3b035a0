"""Recurrent cells: :class:`LSTM` and :class:`GRU`.

Both cells are deterministic :class:`~nnx_ppo.networks.types.StatefulModule`
s: the carry holds the hidden state, there is no randomness in the forward
pass, and ``rollout_extras`` is ``None``.

Shapes (``B`` = batch, ``I`` = ``in_features``, ``H`` = ``hidden_features``):

* ``x``: ``[B, I]``; output: ``[B, H]`` (the new hidden state ``h``).
* LSTM carry: ``{"h": [B, H], "c": [B, H]}``; GRU carry: ``[B, H]``.

With ``trainable_initial_state=True`` the initial carry is an ``nnx.Param``
(one vector per carry entry) tiled over the batch inside
:meth:`initialize_state` / :meth:`reset_state`, so the loss gradient reaches it
through every episode start that the replay re-runs.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.replay import (
    SequenceOutput,
    flatten_time,
    has_fast_replay,
    replay_in_time,
    select_where,
    straight_through,
    unflatten_time,
)
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, batch_size_of

__all__ = ["LSTM", "GRU"]


def _check_positive_int(cls_name: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{cls_name}: {name} must be a positive int, got {value!r}")
    return value


def _check_array(cls_name: str, name: str, value: Any, trailing: tuple[int, ...], note: str) -> None:
    """Raise a ValueError unless ``value`` has shape ``(B, *trailing)``."""
    shape = tuple(jnp.shape(value))
    if len(shape) != 1 + len(trailing) or shape[1:] != trailing:
        expected = "(B, " + ", ".join(str(d) for d in trailing) + ")"
        raise ValueError(f"{cls_name}: {name} has shape {shape}, expected {expected} ({note})")


def _tile(vector: jax.Array, batch_size: int) -> jax.Array:
    """``[H] -> [B, H]`` (explicit, no rank promotion); differentiable."""
    return jnp.tile(vector[None, :], (batch_size, 1))


class _RecurrentBase(StatefulModule):
    """What the gated cells share: the constructor, the weight matrices, the
    forward pass and the loss replay.

    A cell sets ``_n_gates`` and defines :meth:`_init_cell_params` (its biases
    and learnable initial carry), :meth:`initialize_state`, :meth:`_check_state`,
    :meth:`_project` (``x W_x + b``) and :meth:`_step` (one recurrent update).
    """

    _n_gates = 1

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 trainable_initial_state: bool = False):
        name = type(self).__name__
        self.in_features = _check_positive_int(name, "in_features", in_features)
        self.hidden_features = _check_positive_int(name, "hidden_features", hidden_features)
        self.trainable_initial_state = bool(trainable_initial_state)
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

    def reset_state(self, prev_state: Any) -> Any:
        return self.initialize_state(batch_size_of(prev_state))

    def __call__(self, state: Any, x: jax.Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        self._check_x(x)
        self._check_state(state, x.shape[0])
        next_state, h_new = self._step(state, self._project(x))
        return StatefulModuleOutput(next_state=next_state, output=h_new,
                                    regularization_loss=0.0, metrics={}, rollout_extras=None)

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Loss replay with the input projection ``x W_x + b`` computed for all
        ``T`` steps at once; only the recurrent part scans time. Equal to the
        step-by-step replay (same operations, same order)."""
        if not has_fast_replay(self, LSTM, GRU):  # a subclass changed the forward pass
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        T, M = reset.shape
        flat_x = flatten_time(xs, T, M)
        self._check_x(flat_x)
        zx = unflatten_time(self._project(flat_x), T, M)

        def step(carry, inputs):
            z, reset_t, stored = inputs
            carry_in = select_where(reset_t, straight_through(stored, self.reset_state(carry)), carry)
            next_state, h = self._step(carry_in, z)
            return next_state, (h, carry)

        _, (hs, carries) = jax.lax.scan(step, carry, (zx, reset, stored_carry))
        return SequenceOutput(output=hs, regularization_loss=jnp.zeros((), jnp.float32), metrics={}, carry=carries)

    def _check_x(self, x: jax.Array) -> None:
        _check_array(type(self).__name__, "x", x, (self.in_features,),
                     f"in_features={self.in_features}")

    def _check_h(self, name: str, h: jax.Array, batch_size: int) -> None:
        _check_array(type(self).__name__, name, h, (self.hidden_features,),
                     f"hidden_features={self.hidden_features}")
        if h.shape[0] != batch_size:
            raise ValueError(
                f"{type(self).__name__}: {name} has batch size {h.shape[0]}, expected {batch_size} "
                "(the batch size of x)")


class LSTM(_RecurrentBase):
    """Long short-term memory cell.

    Gates (``σ`` = logistic sigmoid, ``⊙`` = elementwise product)::

        i, f, g, o = split(x W_x + h W_h + b, 4)
        c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g)
        h' = σ(o) ⊙ tanh(c')

    The forget-gate bias starts at ``forget_bias`` (1 by default). Carry
    ``{"h": [B, H], "c": [B, H]}``; output ``h'``.

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

    def __init__(self, in_features: int, hidden_features: int, rngs: nnx.Rngs, *,
                 trainable_initial_state: bool = False, forget_bias: float = 1.0):
        if isinstance(forget_bias, bool) or not isinstance(forget_bias, (int, float)) or not math.isfinite(forget_bias):
            raise ValueError(f"LSTM: forget_bias must be a finite number, got {forget_bias!r}")
        self.forget_bias = float(forget_bias)
        super().__init__(in_features, hidden_features, rngs, trainable_initial_state=trainable_initial_state)

    def _init_cell_params(self, h: int) -> None:
        bias = jnp.zeros((4 * h,), jnp.float32).at[h:2 * h].set(self.forget_bias)
        self.bias = nnx.Param(bias)
        if self.trainable_initial_state:
            self.initial_h = nnx.Param(jnp.zeros((h,), jnp.float32))
            self.initial_c = nnx.Param(jnp.zeros((h,), jnp.float32))

    def initialize_state(self, batch_size: int) -> dict[str, jax.Array]:
        if self.trainable_initial_state:
            return {"h": _tile(self.initial_h[...], batch_size),
                    "c": _tile(self.initial_c[...], batch_size)}
        shape = (batch_size, self.hidden_features)
        return {"h": jnp.zeros(shape, jnp.float32), "c": jnp.zeros(shape, jnp.float32)}

    def _check_state(self, state: Any, batch: int) -> None:
        if not isinstance(state, dict) or set(state) != {"h", "c"}:
            raise ValueError(f"LSTM: state must be a dict with keys 'h' and 'c', got {state!r}")
        self._check_h("state['h']", state["h"], batch)
        self._check_h("state['c']", state["c"], batch)

    def _project(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel_x[...] + self.bias[...][None, :]

    def _step(self, state, zx):
        h, c = state["h"], state["c"]
        z = zx + h @ self.kernel_h[...]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        return {"h": h_new, "c": c_new}, h_new


class GRU(_RecurrentBase):
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
    """

    _n_gates = 3

    def _init_cell_params(self, h: int) -> None:
        self.bias_x = nnx.Param(jnp.zeros((3 * h,), jnp.float32))
        self.bias_hn = nnx.Param(jnp.zeros((h,), jnp.float32))
        if self.trainable_initial_state:
            self.initial_h = nnx.Param(jnp.zeros((h,), jnp.float32))

    def initialize_state(self, batch_size: int) -> jax.Array:
        if self.trainable_initial_state:
            return _tile(self.initial_h[...], batch_size)
        return jnp.zeros((batch_size, self.hidden_features), jnp.float32)

    def _check_state(self, state: Any, batch: int) -> None:
        self._check_h("state", state, batch)

    def _project(self, x: jax.Array) -> jax.Array:
        return x @ self.kernel_x[...] + self.bias_x[...][None, :]

    def _step(self, h, zx):
        hdim = self.hidden_features
        kh = self.kernel_h[...]
        zh_ru = h @ kh[:, :2 * hdim]
        zh_n = h @ kh[:, 2 * hdim:] + self.bias_hn[...][None, :]
        r = jax.nn.sigmoid(zx[:, :hdim] + zh_ru[:, :hdim])
        u = jax.nn.sigmoid(zx[:, hdim:2 * hdim] + zh_ru[:, hdim:])
        n = jnp.tanh(zx[:, 2 * hdim:] + r * zh_n)
        h_new = (1.0 - u) * n + u * h
        return h_new, h_new
