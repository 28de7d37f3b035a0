"""Feed-forward layers."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Dense", "check_features"]


def check_features(owner: str, x: jax.Array, features: int, argument: str = "in_features") -> None:
    """Raise a ValueError naming ``owner`` unless ``x`` has shape ``[B, features]``."""
    if jnp.ndim(x) != 2 or x.shape[-1] != features:
        raise ValueError(
            f"{owner}: x has shape {tuple(jnp.shape(x))}, expected (B, {features}) "
            f"({argument}={features})"
        )


class Dense(StatefulModule):
    """Affine layer ``activation(x @ kernel + bias)`` on ``[B, in_features]``.

    Stateless (carry ``()``). ``kernel_init`` defaults to LeCun-normal scaled by
    ``init_scale``; use a small ``init_scale`` (e.g. 0.01) on policy heads.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rngs: nnx.Rngs,
        *,
        activation: Callable[[jax.Array], jax.Array] | None = None,
        use_bias: bool = True,
        init_scale: float = 1.0,
        kernel_init: nnx.Initializer | None = None,
    ):
        if in_features <= 0 or out_features <= 0:
            raise ValueError(
                f"Dense: in_features and out_features must be positive, got "
                f"{in_features} and {out_features}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.activation = activation
        init = kernel_init or nnx.initializers.variance_scaling(
            init_scale**2, "fan_in", "truncated_normal"
        )
        self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if use_bias else None

    def __call__(self, state, x, rollout_extras=None):
        check_features("Dense", x, self.in_features)
        y = x @ self.kernel[...]
        if self.bias is not None:
            y = y + self.bias[...][None, :]
        if self.activation is not None:
            y = self.activation(y)
        return StatefulModuleOutput(next_state=(), output=y)
