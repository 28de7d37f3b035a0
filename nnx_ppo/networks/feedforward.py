"""Feed-forward layers, and the library's matrix product (:func:`matmul`) with its precision setting."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Dense", "matmul", "compute_precision"]

PRECISIONS = ("default", "bfloat16")
"""The values of ``PPOConfig.precision`` (:func:`compute_precision`)."""

_PRECISION = contextvars.ContextVar("nnx_ppo_precision", default="default")


@contextlib.contextmanager
def compute_precision(precision: str):
    """Within this block :func:`matmul` (every matrix product of the library's
    modules) computes at ``precision``: ``"default"`` (float32 inputs at
    JAX's default matmul precision) or ``"bfloat16"`` (inputs rounded to
    bfloat16, products summed in float32, a float32 result; parameters stay
    float32). The trainer traces a whole iteration, rollout and replay alike,
    inside it (``PPOConfig.precision``), so the replay still reproduces the
    rollout."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    token = _PRECISION.set(precision)
    try:
        yield
    finally:
        _PRECISION.reset(token)


def current_precision() -> str:
    """The precision :func:`compute_precision` set for the code running now (``"default"`` outside it)."""
    return _PRECISION.get()


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` at the precision :func:`compute_precision` sets (float32 result)."""
    if _PRECISION.get() == "bfloat16":
        return jnp.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
    return x @ w


def check_features(owner: str, x: jax.Array, features: int) -> None:
    """Raise a ValueError naming ``owner`` unless ``x`` has shape ``[B, features]``."""
    if jnp.ndim(x) != 2 or x.shape[-1] != features:
        raise ValueError(f"{owner}: x has shape {tuple(jnp.shape(x))}, expected (B, {features}) "
                         f"(in_features={features})")


def check_argument(owner: str, name: str, value: Any, ok: bool, rule: str) -> None:
    """The modules' check of a constructor argument: a ValueError
    ``"{owner}: {name} must be {rule}, got {value!r}"`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{owner}: {name} must be {rule}, got {value!r}")


def is_int(value: Any, minimum: int) -> bool:
    """Whether ``value`` is an int (a bool is not) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


class Dense(StatefulModule):
    """Affine layer ``activation(x @ kernel + bias)`` on ``[B, in_features]``.

    Stateless (carry ``()``). The parameters are those of the
    ``nnx.Linear`` submodule ``self.linear`` (state paths ``linear/kernel``
    and ``linear/bias``); ``dense.kernel`` and ``dense.bias`` are the same
    variables. ``kernel_init`` defaults to LeCun-normal scaled by
    ``init_scale``; use a small ``init_scale`` (e.g. 0.01) on policy heads.
    The bias starts at zero.
    """

    def __init__(self, in_features: int, out_features: int, rngs: nnx.Rngs, *,
                 activation: Callable[[jax.Array], jax.Array] | None = None, use_bias: bool = True,
                 init_scale: float = 1.0, kernel_init: nnx.Initializer | None = None):
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Dense: in_features and out_features must be positive, got {in_features} and "
                             f"{out_features}")
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        init = kernel_init or nnx.initializers.variance_scaling(init_scale**2, "fan_in", "truncated_normal")
        # One draw from ``rngs`` per layer (the bias needs none), so a network
        # built from one nnx.Rngs gets the same parameters as before the
        # parameters moved into ``self.linear``.
        key = rngs.params()
        self.linear = nnx.Linear(in_features, out_features, use_bias=use_bias,
                                 kernel_init=lambda _key, shape, dtype: init(key, shape, dtype),
                                 bias_init=nnx.initializers.zeros_init(), param_dtype=jnp.float32,
                                 rngs=nnx.Rngs(params=key))

    @property
    def kernel(self) -> nnx.Param:
        """``self.linear.kernel``, ``[in_features, out_features]``."""
        return self.linear.kernel

    @property
    def bias(self) -> nnx.Param | None:
        """``self.linear.bias``, ``[out_features]`` (``None`` without bias)."""
        return self.linear.bias

    def __call__(self, state, x, rollout_extras=None):
        check_features("Dense", x, self.in_features)
        if _PRECISION.get() == "default":
            y = self.linear(x)
        else:
            y = matmul(x, self.linear.kernel[...])
            y = y if self.linear.bias is None else y + self.linear.bias[...][None, :]
        if self.activation is not None:
            y = self.activation(y)
        return StatefulModuleOutput(next_state=(), output=y)
