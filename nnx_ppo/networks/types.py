"""The module contract every nnx-ppo network piece follows.

A :class:`StatefulModule` is an ``nnx.Module`` whose forward pass takes and
returns a *carry* (``state``) explicitly::

    out = module(state, x, rollout_extras=None)
    out.next_state, out.output, out.regularization_loss, out.metrics, out.rollout_extras

Shapes: ``x`` and every leaf of ``state`` have the batch ``[B, ...]`` as the
leading axis; there is no time axis inside ``__call__`` (the trainer scans
time). ``update_statistics`` receives the ``rollout_extras`` the module
emitted during a rollout, stacked to ``[T, B, ...]``.

Rules (see ``docs/custom_modules.md``):

* ``__call__`` never writes an NNX variable that changes the forward output
  (a write that does not, such as a call counter, is allowed: kept in the
  rollout, discarded in the loss replay); running statistics change only in
  :meth:`StatefulModule.update_statistics`.
* A stochastic module keeps one PRNG key per env in its carry (shape ``[B]``),
  seeded in :meth:`StatefulModule.initialize_state` and split locally in
  ``__call__``. Action samplers are the one exception.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.jax_dataclass import JaxDataclass

# Defined with the replay machinery (nnx_ppo.networks.replay); this module,
# the contract module writers import from, is their public path.
from nnx_ppo.networks.replay import (
    SequenceOutput,
    flatten_time,
    replay_flat,
    replay_in_time,
    scan_unroll,
    select_where,
    straight_through,
    unflatten_time,
)

__all__ = [
    "ACTIVATION_KEY",
    "activation_metrics",
    "StatefulModule",
    "StatefulModuleOutput",
    "PPONetworkOutput",
    "ModuleState",
    "batch_size_of",
    "as_rngs",
    "split_key_carry",
    "SequenceOutput",
    "select_where",
    "replay_in_time",
    "replay_flat",
    "scan_unroll",
    "flatten_time",
    "unflatten_time",
    "straight_through",
]

#: The metrics key under which a module of a recording copy of a network
#: (:func:`nnx_ppo.networks.recording.with_recording`) reports its activation.
ACTIVATION_KEY = "__activation__"


def activation_metrics(output: Any) -> dict[str, Any]:
    """A recorded ``output`` as metrics: ``{ACTIVATION_KEY: array}`` for an
    array, one flat entry per leaf for a pytree (``"__activation__/motor"``),
    so that every metric stays an array (a rollout and the loss replay
    average them)."""
    leaves = jax.tree_util.tree_leaves_with_path(output)
    if len(leaves) == 1 and not leaves[0][0]:
        return {ACTIVATION_KEY: output}
    return {f"{ACTIVATION_KEY}/{jax.tree_util.keystr(path, simple=True, separator='/')}": leaf
            for path, leaf in leaves}


#: The carry of a :class:`StatefulModule` (its ``state`` argument, what
#: ``initialize_state`` returns): any JAX pytree whose leaves have the batch
#: ``[B, ...]`` as their leading axis, ``()`` for a module without state.
ModuleState: TypeAlias = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StatefulModuleOutput(JaxDataclass):
    """What one forward step of a :class:`StatefulModule` returns (a pytree).

    ``out.replace(output=...)`` returns a copy with fields changed. Fields may
    be given by keyword or by position, in the order below (the original
    nnx-ppo's order).

    Attributes:
      next_state: carry for the next step; leaves ``[B, ...]``; ``()`` when the
        module has no state.
      output: the module's output; leaves ``[B, ...]``.
      regularization_loss: scalar added to the training loss (already weighted
        and averaged over the batch), e.g. an entropy bonus or a KL term.
      metrics: scalars to log (averaged over steps by the trainer).
      rollout_extras: data recorded during the rollout and fed back to the
        module in the loss replay (and to ``update_statistics``); leaves
        ``[B, ...]``. ``None`` when the module records nothing.
    """

    next_state: ModuleState
    output: Any
    regularization_loss: jax.Array | float = 0.0
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    rollout_extras: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PPONetworkOutput(JaxDataclass):
    """The output a network trained by PPO must produce.

    Fields by keyword or by position, in the order below (the original's).

    Attributes:
      actions: actions sent to the environment, ``[B, ...]`` (a pytree when
        the action space is a dict).
      loglikelihoods: log-probability of ``actions`` under the policy, ``[B]``
        (same tree as ``actions``' top level when several samplers are mapped).
      value_estimates: state-value estimates, ``[B]`` (or a dict of ``[B]``
        for pytree rewards).
    """

    actions: Any
    loglikelihoods: Any
    value_estimates: Any


class StatefulModule(nnx.Module):
    """Base class for every network piece: an NNX module with an explicit carry.

    Subclasses implement ``__call__`` and, when they have state,
    ``initialize_state`` and ``reset_state``. Modules with running statistics
    implement ``update_statistics``. Defaults describe a stateless module whose
    carry is ``()``.
    """

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        """One step on a ``[B, ...]`` batch. See the module docstring."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def initialize_state(self, batch_size: int) -> Any:
        """Return the carry for ``batch_size`` fresh envs (leaves ``[B, ...]``)."""
        return ()

    def reset_state(self, prev_state: Any) -> Any:
        """Return the carry for envs that start a new episode.

        Batched in, batched out: the trainer calls this on the whole batch and
        keeps the result only where an episode ended. The default re-initializes.
        """
        if not jax.tree.leaves(prev_state):
            return prev_state
        return self.initialize_state(batch_size_of(prev_state))

    def update_statistics(self, rollout_extras: Any) -> None:
        """Fold a rollout's ``[T, B, ...]`` extras into running statistics."""
        return None

    def replay_sequence(self, carry: Any, xs: Any, rollout_extras: Any, reset: jax.Array,
                        stored_carry: Any) -> "SequenceOutput":
        """Re-run a whole ``[T, M]`` stretch of a rollout (the loss replay).

        Args:
          carry: the carry entering the first step, leaves ``[M, ...]``.
          xs: inputs at every step, leaves ``[T, M, ...]``.
          rollout_extras: what this module emitted in the rollout, ``[T, M, ...]``
            (``None`` if nothing).
          reset: ``[T, M]`` bool, the carry was reset before step ``t``.
          stored_carry: the rollout's carry entering each step, ``[T, M, ...]``.

        It must equal calling ``__call__`` step by step with resets (what
        :func:`replay_in_time` does, the default). A module without carry
        leaves runs once on the flattened ``[T * M]`` batch instead, and
        containers replay each child separately, so stateless stretches of a
        network need no scan over time. Override it only to go faster.
        """
        if not jax.tree.leaves(carry):
            return replay_flat(self, carry, xs, rollout_extras, reset, stored_carry)
        return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)


def batch_size_of(tree: Any) -> int:
    """The leading-axis size shared by the leaves of ``tree`` (an int, or a
    symbolic dimension while ``jax.export`` traces for any batch size)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError("cannot infer a batch size from an empty tree")
    return jnp.shape(leaves[0])[0]


def as_rngs(rngs: Any) -> nnx.Rngs:
    """``rngs`` itself, or ``nnx.Rngs(rngs)`` for an int seed."""
    return rngs if isinstance(rngs, nnx.Rngs) else nnx.Rngs(rngs)


def split_key_carry(owner: str, keys: Any, batch_size: int, name: str = "state") -> tuple[jax.Array, jax.Array]:
    """Check a per-env key carry and split it: ``[B]`` typed keys ->
    (next keys ``[B]``, sample keys ``[B]``). Errors name ``owner`` and ``name``."""
    if not (hasattr(keys, "dtype") and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)):
        raise ValueError(f"{owner}: {name} must be a typed PRNG key array of shape (B,) "
                         f"(from initialize_state), got {keys!r}")
    if tuple(keys.shape) != (batch_size,):
        raise ValueError(f"{owner}: {name} has shape {tuple(keys.shape)}, expected "
                         f"({batch_size},) (one key per env, B from x)")
    both = jax.vmap(jax.random.split)(keys)  # [B, 2]
    return both[:, 0], both[:, 1]
