"""PPOAdapter: turn an action port and a value port into a PPO network."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.containers import DictContainer
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule

__all__ = ["PPOAdapter", "is_sampler_dict"]


def is_sampler_dict(x: Any) -> bool:
    """True for the ``{"action", "log_likelihood"}`` dict a sampler outputs."""
    return isinstance(x, dict) and {"action", "log_likelihood"} <= set(x)


def _squeeze_value(v: jax.Array) -> jax.Array:
    if jnp.ndim(v) == 2 and v.shape[-1] == 1:
        return v[:, 0]
    if jnp.ndim(v) != 1:
        raise ValueError(
            f"PPOAdapter: the value port output has shape {tuple(jnp.shape(v))}, expected (B,) or (B, 1)"
        )
    return v


class PPOAdapter(DictContainer):
    """Run ``action`` and ``value`` on the same input; output a
    :class:`PPONetworkOutput`.

    The action port must end in samplers: its output is one sampler dict
    (``actions`` and ``loglikelihoods`` are then ``[B, ...]`` and ``[B]``
    arrays) or a dict of them, e.g. from ``Map`` over samplers (then both are
    dicts with the same keys). The value port's output ``[B, 1]`` (or
    ``[B]``, or a dict of those for pytree rewards) becomes
    ``value_estimates`` with the trailing size-1 axis squeezed.

    A :class:`~nnx_ppo.networks.containers.DictContainer` with children
    ``action`` and ``value`` (like ``Parallel``): carry and extras are
    ``{"action": ..., "value": ...}``, metrics are prefixed ``action/`` and
    ``value/``, and each port replays on its own.
    """

    def __init__(self, action: StatefulModule, value: StatefulModule):
        for name, port in (("action", action), ("value", value)):
            if not isinstance(port, StatefulModule):
                raise TypeError(f"PPOAdapter: {name} must be a StatefulModule, got {type(port).__name__}")
        super().__init__(action=action, value=value)

    @property
    def action(self) -> StatefulModule:
        """The action port (ends in samplers)."""
        return self.components["action"]

    @property
    def value(self) -> StatefulModule:
        """The value port."""
        return self.components["value"]

    def _inputs(self, x):
        return {"action": x, "value": x}

    def _combine(self, outputs) -> PPONetworkOutput:
        """``PPONetworkOutput`` from the ports' ``[B, ...]`` outputs."""
        samples, values = outputs["action"], outputs["value"]
        if not (is_sampler_dict(samples) or (
            isinstance(samples, dict) and samples and all(is_sampler_dict(v) for v in samples.values())
        )):
            raise ValueError(
                "PPOAdapter: the action port must output a sampler dict {'action', 'log_likelihood'} "
                f"or a dict of them; got {jax.tree.map(jnp.shape, samples)}"
            )
        pick = lambda field: jax.tree.map(lambda d: d[field], samples, is_leaf=is_sampler_dict)
        return PPONetworkOutput(
            actions=pick("action"),
            loglikelihoods=pick("log_likelihood"),
            value_estimates=jax.tree.map(_squeeze_value, values),
        )
