"""A functional view of an NNX network: what the compiled training program holds.

:class:`NetworkFn` is a pytree of the network's state (``params``: the
``nnx.Param`` variables; ``rest``: every other variable, e.g. normalizer
statistics and RNG streams) with the static ``graphdef`` as metadata. Its
methods run the module contract functionally and return the updated view
instead of mutating a module, so they can be traced, scanned, vmapped and
differentiated (with respect to ``params``) like any JAX function::

    net = NetworkFn.of(network, deterministic=False)   # nnx.split once
    carry, net = net.initialize(B)
    out, net = net.apply(carry, obs)                    # one step, [B, ...]
    replay = net.replay(trajectory)                     # [T, M] loss replay
    net = net.update_statistics(extras)                 # [T, B, ...] extras
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.replay import SequenceOutput
from nnx_ppo.networks.types import StatefulModuleOutput

__all__ = ["NetworkFn", "copy_leaf", "donatable"]


@dataclasses.dataclass(frozen=True)
class NetworkFn:
    """The network as ``(graphdef, params, rest)``; see the module docstring.

    Attributes:
      graphdef: the static structure (``nnx.split``'s graph definition).
      params: the ``nnx.Param`` state (what the optimizer updates).
      rest: every other variable.
    """

    graphdef: Any
    params: Any
    rest: Any

    @classmethod
    def of(cls, network: nnx.Module, deterministic: bool | None = None) -> "NetworkFn":
        """Split ``network``; with ``deterministic`` set, every module's
        ``deterministic`` flag is set as asked in the view (training: False,
        evaluation: True), and the network's own flags are left as they were."""
        if deterministic is None:
            return cls(*nnx.split(network, nnx.Param, ...))
        modules = [m for _, m in nnx.iter_modules(network) if hasattr(m, "deterministic")]
        saved = [m.deterministic for m in modules]
        for m in modules:
            m.deterministic = deterministic
        try:
            return cls(*nnx.split(network, nnx.Param, ...))
        finally:
            for m, flag in zip(modules, saved):
                m.deterministic = flag

    def module(self) -> nnx.Module:
        """A fresh module with this state (``nnx.merge``)."""
        return nnx.merge(self.graphdef, self.params, self.rest)

    def with_state(self, params: Any = None, rest: Any = None) -> "NetworkFn":
        """The same network with other ``params`` and/or ``rest``."""
        return NetworkFn(self.graphdef, self.params if params is None else params,
                         self.rest if rest is None else rest)

    def _run(self, method: str, *args) -> tuple[Any, "NetworkFn"]:
        """Call ``module.method(*args)``; return its result and the view with
        the module's updated non-parameter variables."""
        module = self.module()
        result = getattr(module, method)(*args)
        _, _, rest = nnx.split(module, nnx.Param, ...)
        return result, self.with_state(rest=rest)

    def apply(self, carry: Any, obs: Any, extras: Any = None) -> tuple[StatefulModuleOutput, "NetworkFn"]:
        """One forward step on a ``[B, ...]`` batch (sampler RNG streams advance)."""
        return self._run("__call__", carry, obs, extras)

    def initialize(self, batch_size: int) -> tuple[Any, "NetworkFn"]:
        """``initialize_state(batch_size)``: the carry of ``batch_size`` fresh envs."""
        return self._run("initialize_state", batch_size)

    def reset(self, carry: Any) -> tuple[Any, "NetworkFn"]:
        """``reset_state(carry)`` for the whole batch (the caller selects per env)."""
        return self._run("reset_state", carry)

    def replay(self, trajectory: Any) -> SequenceOutput:
        """Re-run a ``[T, M]`` slice of a rollout from its stored start carry,
        feeding back the stored extras and resets (``replay_sequence``).
        Updates to non-parameter variables are discarded. ``trajectory`` is a
        :class:`~nnx_ppo.algorithms.rollout.Trajectory`."""
        start = jax.tree.map(lambda x: x[0], trajectory.carry)
        module = self.module()
        return module.replay_sequence(start, trajectory.obs, trajectory.extras, trajectory.reset, trajectory.carry)

    def update_statistics(self, extras: Any) -> "NetworkFn":
        """Fold a rollout's ``[T, B, ...]`` extras into running statistics."""
        return self._run("update_statistics", extras)[1]


jax.tree_util.register_dataclass(NetworkFn, data_fields=["params", "rest"], meta_fields=["graphdef"])


def copy_leaf(x: jax.Array) -> jax.Array:
    """A copy of one array (PRNG key arrays included)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(jnp.copy(jax.random.key_data(x)), impl=jax.random.key_impl(x))
    return jnp.copy(x)


def _unalias(tree: Any) -> Any:
    """Copy leaves that appear more than once (a module may build two carry
    leaves from one array), so the whole tree can be donated."""
    seen: set[int] = set()

    def leaf(x):
        if id(x) in seen:
            return copy_leaf(x)
        seen.add(id(x))
        return x

    return jax.tree.map(leaf, tree)


def _strong_types(tree: Any) -> Any:
    """Give weakly typed leaves (e.g. env fields built from Python floats)
    their plain dtype. The compiled iteration returns strongly typed arrays,
    so without this the second call would see a new signature and compile
    the whole program again."""

    def leaf(x):
        if getattr(x, "weak_type", False):
            return jax.lax.convert_element_type(x, x.dtype)
        return x

    return jax.tree.map(leaf, tree)


def donatable(tree: Any) -> Any:
    """``tree`` made safe to donate to a compiled call and to return from it
    with the same signature: no weak types, no leaf appearing twice."""
    return _unalias(_strong_types(tree))
