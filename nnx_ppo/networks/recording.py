"""Per-step activations of a network's modules, read from its metrics.

The module-level recording of the original nnx-ppo, for analysis loops you
write yourself::

    rec = with_recording(network)            # a copy; network is unchanged
    out = rec(carry, obs)                    # the same outputs as network's
    acts = extract_activations(out.metrics)  # {0: [B, 8], 1: {"rnn": [B, 6], "ff": [B, 3]}}

:func:`with_recording` wraps every leaf module (a :class:`StatefulModule`
without :class:`StatefulModule` children) of a copy in a :class:`Recorder`,
which adds the leaf's output to its metrics under :data:`ACTIVATION_KEY`; a
:class:`~nnx_ppo.networks.graph.PopulationGraph` is not wrapped but has its
``record_activations`` flag set, and then reports every population's
activation. The containers carry those entries up like any metric
(``"1/rnn/__activation__"``), and :func:`extract_activations` turns them
back into a tree keyed by module path.

These activations are ``[B, ...]`` arrays, not the scalars training logs, so
a recording copy is for calling step by step, not for training. To record
over evaluation episodes (``[T, B, ...]`` arrays with episode boundaries,
saved to a file) use :func:`nnx_ppo.algorithms.evaluation.record_activations`,
which needs no copy of this kind.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

from flax import nnx

from nnx_ppo.networks.graph import PopulationGraph
from nnx_ppo.networks.types import ACTIVATION_KEY, StatefulModule, StatefulModuleOutput, activation_metrics

__all__ = ["ACTIVATION_KEY", "Recorder", "with_recording", "extract_activations"]


class Recorder(StatefulModule):
    """Runs ``wrapped`` unchanged and adds its output to the metrics under
    :data:`ACTIVATION_KEY`; carry, resets, statistics and replay are the
    wrapped module's (``rec.wrapped``)."""

    def __init__(self, wrapped: StatefulModule):
        if not isinstance(wrapped, StatefulModule):
            raise TypeError(f"Recorder: wrapped must be a StatefulModule, got {type(wrapped).__name__}")
        self.wrapped = wrapped

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        out = self.wrapped(state, x, rollout_extras)
        return out.replace(metrics={**out.metrics, **activation_metrics(out.output)})

    def initialize_state(self, batch_size: int) -> Any:
        return self.wrapped.initialize_state(batch_size)

    def reset_state(self, prev_state: Any) -> Any:
        return self.wrapped.reset_state(prev_state)

    def update_statistics(self, rollout_extras: Any) -> None:
        return self.wrapped.update_statistics(rollout_extras)


def _is_leaf(module: Any) -> bool:
    """Whether ``module`` is a :class:`StatefulModule` without
    :class:`StatefulModule` below it (the modules :func:`with_recording`
    wraps)."""
    if not isinstance(module, StatefulModule):
        return False
    return not any(path and isinstance(m, StatefulModule) for path, m in nnx.iter_modules(module))


def with_recording(network: StatefulModule) -> StatefulModule:
    """A recording copy of ``network``: every leaf module wrapped in a
    :class:`Recorder`, every :class:`~nnx_ppo.networks.graph.PopulationGraph`
    with ``record_activations`` set (its connections' transforms are not
    wrapped: the graph reports its populations). The copy shares the
    network's variables, so it sees later training; ``network`` itself is
    not modified. A network that already holds a :class:`Recorder` is
    returned as it is, with a warning."""
    if any(isinstance(m, Recorder) for _, m in nnx.iter_modules(network)):
        warnings.warn("with_recording: the network already holds Recorder modules (it is a recording "
                      "copy); returning it unchanged", UserWarning, stacklevel=2)
        return network
    graphs = [tuple(path) for path, m in nnx.iter_modules(network) if isinstance(m, PopulationGraph)]

    def wrap(path: tuple, node: Any) -> Any:
        if any(tuple(path[:len(g)]) == g and len(path) > len(g) for g in graphs):
            return node  # inside a graph: the graph reports its populations
        if isinstance(node, PopulationGraph):
            node.record_activations = True
            return node
        return Recorder(node) if _is_leaf(node) else node

    return nnx.recursive_map(wrap, network)


def extract_activations(metrics: Any) -> Any:
    """The activations a recording copy put in ``metrics`` (its
    ``out.metrics``), as a tree keyed by module path: ``{0: [B, 8], 1: {"ff":
    [B, 3]}}`` (a :class:`~nnx_ppo.networks.containers.Sequential` position
    is an int key); a graph's entry is ``{population: [B, size]}``. Other
    metrics and branches without activations are left out; ``None`` when
    there are none. Reads the flat ``"1/ff/__activation__"`` keys the
    containers of this library write, and nested dicts alike."""
    if not isinstance(metrics, Mapping):
        return None
    if ACTIVATION_KEY in metrics:  # a recorded module (its other metrics are not activations)
        return metrics[ACTIVATION_KEY]
    prefix = ACTIVATION_KEY + "/"
    if any(isinstance(k, str) and k.startswith(prefix) for k in metrics):  # a recorded pytree, one key per leaf
        tree: dict[Any, Any] = {}
        for key, value in metrics.items():
            if isinstance(key, str) and key.startswith(prefix):
                *parents, leaf = key[len(prefix):].split("/")
                node = tree
                for part in parents:
                    node = node.setdefault(_path_key(part), {})
                node[_path_key(leaf)] = value
        return tree
    children: dict[Any, Any] = {}
    for key, value in metrics.items():
        if isinstance(key, str) and "/" in key:
            head, rest = key.split("/", 1)
            child = children.setdefault(_path_key(head), {})
            if isinstance(child, dict):
                child[rest] = value
        else:
            children.setdefault(_path_key(key), value)
    found = {key: extract_activations(child) for key, child in children.items()}
    found = {key: value for key, value in found.items() if value is not None}
    return found or None


def _path_key(part: Any) -> Any:
    """A Sequential's position (``"1"`` in a flat key) as an int."""
    return int(part) if isinstance(part, str) and re.fullmatch(r"\d+", part) else part
