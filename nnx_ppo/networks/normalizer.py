"""Running mean/variance input normalisation: :class:`Normalizer`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.feedforward import check_argument
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["Normalizer", "NormalizerStatistics", "merge_moments"]


def merge_moments(count_a: jax.Array, mean_a: jax.Array, m2_a: jax.Array, count_b: jax.Array, mean_b: jax.Array,
                  m2_b: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Merge the moments of two samples (Chan et al.'s parallel formula).

    Each sample is given by its size ``count``, its ``mean`` and its sum of
    squared deviations from the mean ``m2`` (``variance * count``); returns
    those of the union, ``(count, mean, m2)``. Exact for any split of the
    data and accurate for large counts. Used by :class:`Normalizer` and by
    the trainer's reward scaling."""
    total = count_a + count_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / total)
    m2 = m2_a + m2_b + jnp.square(delta) * (count_a * count_b / total)
    return total, mean, m2


class NormalizerStatistics(nnx.Variable):
    """Running statistics of a :class:`Normalizer`.

    A separate variable type (not ``nnx.Param``): optimizers built on
    ``nnx.Param`` leave it alone, while ``nnx.state(model)`` and checkpoints
    still include it.
    """


def _is_shape(s: Any) -> bool:
    return (isinstance(s, int) and not isinstance(s, bool)) or (
        isinstance(s, tuple) and all(isinstance(d, int) and not isinstance(d, bool) for d in s))


def _as_shape(s: Any) -> tuple[int, ...]:
    shape = (s,) if isinstance(s, int) else tuple(s)
    if any(d < 0 for d in shape):
        raise ValueError(f"Normalizer: shape {s!r} has a negative dimension")
    return shape


# The standard deviation the Normalizer divides by before it has seen any
# data (the original's choice: a first rollout's inputs are scaled down, not
# passed through at whatever scale the environment has).
_PRIOR_STD = 10.0


class Normalizer(StatefulModule):
    """Normalises inputs with running statistics gathered from rollouts.

    For every leaf, with ``n`` samples seen so far, running mean ``μ`` and sum of
    squared deviations ``M2``::

        σ² = M2 / n            (population variance; σ² = 10² = 100 while n = 0, as in the original)
        y  = (x - μ) / sqrt(σ² + epsilon)
        y  = clip(y, -clip, clip)   if clip is not None

    ``__call__`` only *reads* the statistics (write rule) and emits its input
    ``x`` as ``rollout_extras``; :meth:`update_statistics` folds a rollout's
    ``[T, B, ...]`` stack of those extras into the statistics with the
    parallel (Chan et al.) merge, which stays accurate for large counts.
    The carry is ``()``.

    The statistics are three :class:`NormalizerStatistics` variables, as in
    the original: ``counter`` (a scalar), ``mean`` and ``M2`` (each an array
    of ``shape``, or a pytree of arrays with the structure of ``shape``);
    ``running_mean`` and ``running_variance`` read them.

    Args:
      shape: the per-sample shape: an int, a tuple of ints, or a pytree (e.g. a
        dict) whose leaves are ints / tuples of ints; ``x`` must have the same
        tree structure with leaves ``[B, *shape]``.
      epsilon: added to the variance before the square root.
      clip: if given, the normalised output is clipped to ``[-clip, clip]``.
    """

    def __init__(self, shape: Any, *, epsilon: float = 1e-8, clip: float | None = None):
        shapes, treedef = jax.tree.flatten(shape, is_leaf=_is_shape)
        if not shapes or not all(_is_shape(s) for s in shapes):
            raise ValueError(f"Normalizer: shape must be an int, a tuple of ints or a pytree of "
                             f"those, got {shape!r}")
        check_argument("Normalizer", "epsilon", epsilon, not epsilon < 0, ">= 0")
        check_argument("Normalizer", "clip", clip, clip is None or not clip <= 0, "> 0 or None")
        self._treedef = treedef
        self._shapes = tuple(_as_shape(s) for s in shapes)
        self.epsilon = float(epsilon)
        self.clip = None if clip is None else float(clip)
        self.counter = NormalizerStatistics(jnp.zeros((), jnp.float32))
        self.mean = NormalizerStatistics(self._tree([jnp.zeros(s, jnp.float32) for s in self._shapes]))
        self.M2 = NormalizerStatistics(self._tree([jnp.zeros(s, jnp.float32) for s in self._shapes]))

    def _tree(self, leaves: list[Any]) -> Any:
        """``leaves`` in the structure of ``shape``."""
        return jax.tree.unflatten(self._treedef, leaves)

    # -- statistics ---------------------------------------------------------------

    def _variances(self) -> list[jax.Array]:
        n = self.counter[...]
        return [jnp.where(n > 0, m2 / jnp.maximum(n, 1.0), jnp.full_like(m2, _PRIOR_STD ** 2))
                for m2 in self._treedef.flatten_up_to(self.M2.get_value())]

    @property
    def running_mean(self) -> Any:
        """The current mean, with the structure of ``shape``."""
        return self.mean.get_value()

    @property
    def running_variance(self) -> Any:
        """The current (population) variance, with the structure of ``shape``;
        100 before any data (the Normalizer then divides by 10)."""
        return self._tree(self._variances())

    def _check(self, name: str, tree: Any, n_lead: int, lead: str) -> list[jax.Array]:
        leaves, treedef = jax.tree.flatten(tree)
        if treedef != self._treedef:
            raise ValueError(f"Normalizer: {name} has tree structure {treedef}, expected "
                             f"{self._treedef} (the structure of shape)")
        for i, (leaf, shape) in enumerate(zip(leaves, self._shapes)):
            got = tuple(jnp.shape(leaf))
            if len(got) != n_lead + len(shape) or got[n_lead:] != shape:
                where = "" if len(leaves) == 1 else f" leaf {i}"
                expected = "(" + ", ".join([lead] + [str(d) for d in shape]) + ")"
                raise ValueError(f"Normalizer: {name}{where} has shape {got}, expected {expected} (shape={shape})")
        return leaves

    def update_statistics(self, rollout_extras: Any) -> None:
        """Fold ``[T, B, *shape]`` samples (the emitted inputs) into the statistics."""
        if rollout_extras is None:
            return
        leaves = self._check("rollout_extras", rollout_extras, 2, "T, B")
        if leaves[0].shape[0] * leaves[0].shape[1] == 0:
            return
        n_a = self.counter[...]
        n_b = jnp.asarray(leaves[0].shape[0] * leaves[0].shape[1], jnp.float32)
        means, m2s = [], []
        for leaf, shape, mean_a, m2_a in zip(leaves, self._shapes, self._treedef.flatten_up_to(self.mean.get_value()),
                                             self._treedef.flatten_up_to(self.M2.get_value())):
            data = jnp.reshape(leaf, (-1,) + shape).astype(jnp.float32)
            mean_b = jnp.mean(data, axis=0)
            m2_b = jnp.sum(jnp.square(data - mean_b[None]), axis=0)
            _, mean, m2 = merge_moments(n_a, mean_a, m2_a, n_b, mean_b, m2_b)
            means.append(mean)
            m2s.append(m2)
        self.mean.set_value(self._tree(means))
        self.M2.set_value(self._tree(m2s))
        self.counter[...] = n_a + n_b

    # -- forward -----------------------------------------------------------------------

    def __call__(self, state: Any, x: Any, rollout_extras: Any = None) -> StatefulModuleOutput:
        leaves = self._check("x", x, 1, "B")
        outs = []
        for leaf, mean, var in zip(leaves, self._treedef.flatten_up_to(self.mean.get_value()), self._variances()):
            y = (leaf - mean[None]) / jnp.sqrt(var + self.epsilon)[None]
            if self.clip is not None:
                y = jnp.clip(y, -self.clip, self.clip)
            outs.append(y)
        return StatefulModuleOutput(next_state=(), output=self._tree(outs), rollout_extras=x)
