"""PPOAdapter: turn an action port and a value port into a PPO network."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.containers import child_extras, combine_sequences, prefix_metrics
from nnx_ppo.networks.types import (
    PPONetworkOutput,
    StatefulModule,
    StatefulModuleOutput,
    defines_own_call,
    flatten_time,
    replay_in_time,
    unflatten_time,
)

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


class PPOAdapter(StatefulModule):
    """Run ``action`` and ``value`` on the same input; output a
    :class:`PPONetworkOutput`.

    The action port must end in samplers: its output is one sampler dict
    (``actions`` and ``loglikelihoods`` are then ``[B, ...]`` and ``[B]``
    arrays) or a dict of them, e.g. from ``Map`` over samplers (then both are
    dicts with the same keys). The value port's output ``[B, 1]`` (or
    ``[B]``, or a dict of those for pytree rewards) becomes
    ``value_estimates`` with the trailing size-1 axis squeezed.

    Carry and extras: ``{"action": ..., "value": ...}``.
    """

    def __init__(self, action: StatefulModule, value: StatefulModule):
        for name, port in (("action", action), ("value", value)):
            if not isinstance(port, StatefulModule):
                raise TypeError(f"PPOAdapter: {name} must be a StatefulModule, got {type(port).__name__}")
        self.action = action
        self.value = value

    def _package(self, samples, values) -> PPONetworkOutput:
        """``PPONetworkOutput`` from the ports' ``[B, ...]`` outputs."""
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

    def __call__(self, state, x, rollout_extras=None):
        act = self.action(state["action"], x, child_extras(rollout_extras, "action"))
        val = self.value(state["value"], x, child_extras(rollout_extras, "value"))
        metrics = {}
        prefix_metrics(metrics, "action", act.metrics)
        prefix_metrics(metrics, "value", val.metrics)
        return StatefulModuleOutput(
            next_state={"action": act.next_state, "value": val.next_state},
            output=self._package(act.output, val.output),
            regularization_loss=act.regularization_loss + val.regularization_loss,
            metrics=metrics,
            rollout_extras={"action": act.rollout_extras, "value": val.rollout_extras},
        )

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Replay each port on its own (see :meth:`StatefulModule.replay_sequence`)."""
        if not defines_own_call(self, PPOAdapter):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        results = {
            port: getattr(self, port).replay_sequence(
                carry[port], xs, child_extras(rollout_extras, port), reset, stored_carry[port]
            )
            for port in ("action", "value")
        }
        T, M = reset.shape
        flat = flatten_time((results["action"].output, results["value"].output), T, M)
        return combine_sequences(results, unflatten_time(self._package(*flat), T, M))

    def initialize_state(self, batch_size):
        return {"action": self.action.initialize_state(batch_size), "value": self.value.initialize_state(batch_size)}

    def reset_state(self, prev_state):
        return {
            "action": self.action.reset_state(prev_state["action"]),
            "value": self.value.reset_state(prev_state["value"]),
        }

    def update_statistics(self, rollout_extras):
        self.action.update_statistics(rollout_extras["action"])
        self.value.update_statistics(rollout_extras["value"])
