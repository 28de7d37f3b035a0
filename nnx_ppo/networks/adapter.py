"""PPOAdapter: turn an action port and a value port into a PPO network."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.networks.containers import Concat, DictContainer, Sequential
from nnx_ppo.networks.sampling_layers import ActionSampler
from nnx_ppo.networks.types import PPONetworkOutput, StatefulModule
from nnx_ppo.networks.utils import Merge

__all__ = ["PPOAdapter", "extras_for_actions"]


def is_sampler_dict(x: Any) -> bool:
    """True for the ``{"action", "log_likelihood"}`` dict a sampler outputs."""
    return isinstance(x, dict) and {"action", "log_likelihood"} <= set(x)


def _squeeze_value(v: jax.Array) -> jax.Array:
    if jnp.ndim(v) == 2 and v.shape[-1] == 1:
        return v[:, 0]
    if jnp.ndim(v) != 1:
        raise ValueError(f"PPOAdapter: the value port output has shape {tuple(jnp.shape(v))}, expected (B,) or (B, 1)")
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
        several = isinstance(samples, dict) and samples and all(is_sampler_dict(v) for v in samples.values())
        if not (is_sampler_dict(samples) or several):
            raise ValueError("PPOAdapter: the action port must output a sampler dict {'action', 'log_likelihood'} "
                             f"or a dict of them; got {jax.tree.map(jnp.shape, samples)}")
        pick = lambda field: jax.tree.map(lambda d: d[field], samples, is_leaf=is_sampler_dict)
        return PPONetworkOutput(actions=pick("action"), loglikelihoods=pick("log_likelihood"),
                                value_estimates=jax.tree.map(_squeeze_value, values))


def extras_for_actions(network: StatefulModule, extras: Any, actions: Any) -> Any:
    """``extras`` (a rollout's, leaves ``[..., B, ...]``) with every sampler's
    stored raw action replaced by the one that gives ``actions``.

    Replaying ``network`` with the result scores ``actions`` (e.g. a
    teacher's) instead of the actions the network took, on exactly the
    carries of the rollout: a sampler's raw action feeds nothing but its own
    log-likelihood, so no carry changes. The samplers are found through
    :class:`PPOAdapter` (its action port), :class:`Sequential` (its last
    layer) and the dict containers whose output is their children's outputs
    by name (``Map``, ``Parallel``); ``actions`` has the network's action
    structure (an array, or a dict for a ``Map`` of samplers).

    Raises:
      TypeError: a module on the way to a sampler is none of these.
    """
    if isinstance(network, ActionSampler):
        return network.raw_from_action(actions)
    if isinstance(network, PPOAdapter):
        return {**extras, "action": extras_for_actions(network.action, extras["action"], actions)}
    if isinstance(network, Sequential):
        last = len(network.layers) - 1
        return tuple(extras[:last]) + (extras_for_actions(network.layers[last], extras[last], actions),)
    if isinstance(network, DictContainer) and not isinstance(network, (Concat, Merge)) and (
            type(network)._combine is DictContainer._combine):
        if not isinstance(actions, dict) or set(actions) != set(network.names):
            raise TypeError(f"extras_for_actions: {type(network).__name__} with children {list(network.names)} "
                            f"needs actions with the same keys, got {jax.tree.structure(actions)}")
        return {name: extras_for_actions(child, extras[name], actions[name]) for name, child in network._children()}
    raise TypeError(f"extras_for_actions: cannot find the action samplers inside {type(network).__name__}; expected an "
                    "ActionSampler, reached through PPOAdapter, Sequential (last layer) or Map/Parallel of samplers")
