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

* ``__call__`` never writes an NNX variable that changes the forward output;
  running statistics change only in :meth:`StatefulModule.update_statistics`.
* A stochastic module keeps one PRNG key per env in its carry (shape ``[B]``),
  seeded in :meth:`StatefulModule.initialize_state` and split locally in
  ``__call__``. Action samplers are the one exception.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "StatefulModule",
    "StatefulModuleOutput",
    "PPONetworkOutput",
    "batch_size_of",
    "select_where",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class StatefulModuleOutput:
    """What one forward step of a :class:`StatefulModule` returns (a pytree).

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

    next_state: Any
    output: Any
    regularization_loss: jax.Array | float = 0.0
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    rollout_extras: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class PPONetworkOutput:
    """The output a network trained by PPO must produce.

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


def batch_size_of(tree: Any) -> int:
    """The leading-axis size shared by the leaves of ``tree``."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError("cannot infer a batch size from an empty tree")
    return int(jnp.shape(leaves[0])[0])


def select_where(mask: jax.Array, if_true: Any, if_false: Any) -> Any:
    """Per-env select over two trees of ``[B, ...]`` leaves with a ``[B]`` mask.

    Works for float, integer, boolean and typed-PRNG-key leaves.
    """

    def pick(a, b):
        m = jnp.reshape(mask, mask.shape + (1,) * (jnp.ndim(b) - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, if_true, if_false)
