"""Stochastic activation layers with per-env PRNG keys in the carry.

:class:`GaussianNoise`, :class:`DropoutMask` and :class:`BernoulliGate` all
follow the randomness rule of ``docs/custom_modules.md``:

* The carry is a typed PRNG key array of shape ``[B]``, one key per env,
  seeded in :meth:`initialize_state` with ``jax.random.split(self.rngs(), B)``
  from the construction-time ``nnx.Rngs``.
* ``__call__`` splits each env's key locally into (next key, sample key) and
  never reads the class-level ``nnx.Rngs``; the output is a pure function of
  ``(x, carry)``. Running a batch or any split of it into sub-batches gives the
  same per-env results, which is what the loss replay and minibatching need.
* ``reset_state`` keeps the key chain (``fresh_keys_on_reset=False``, the
  default) or draws fresh keys from the class-level ``nnx.Rngs``
  (``fresh_keys_on_reset=True``).
* Each layer has a ``deterministic`` attribute (default ``False``).
  ``module.eval()`` (``nnx``'s ``set_attributes(deterministic=True)``) turns the
  noise off for evaluation; ``module.train()`` turns it back on. The key chain
  still advances in deterministic mode, so switching modes does not shift which
  random numbers later steps see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.feedforward import check_argument
from nnx_ppo.networks.types import (
    StatefulModule,
    StatefulModuleOutput,
    as_rngs,
    batch_size_of,
    has_fast_replay,
    replay_in_time,
    replay_key_chain,
    split_key_carry,
)

__all__ = ["GaussianNoise", "DropoutMask", "BernoulliGate"]


class _PerEnvKeyModule(StatefulModule):
    """Carry handling shared by the stochastic layers (carry: keys ``[B]``).

    ``__call__`` splits the keys and hands the sample keys to the subclass's
    :meth:`_transform`, which maps ``x`` to ``(output, metrics)``.
    """

    def __init__(self, rngs: nnx.Rngs, fresh_keys_on_reset: bool, deterministic: bool):
        self.rngs = as_rngs(rngs)
        self.fresh_keys_on_reset = bool(fresh_keys_on_reset)
        self.deterministic = bool(deterministic)

    def initialize_state(self, batch_size: int) -> jax.Array:
        return jax.random.split(self.rngs(), batch_size)

    def reset_state(self, prev_state: jax.Array) -> jax.Array:
        if self.fresh_keys_on_reset:
            return jax.random.split(self.rngs(), batch_size_of(prev_state))
        return prev_state

    def __call__(self, state: jax.Array, x: jax.Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        name = type(self).__name__
        if jnp.ndim(x) < 1:
            raise ValueError(f"{name}: x has shape {tuple(jnp.shape(x))}, expected (B, ...)")
        next_keys, sample_keys = split_key_carry(name, state, x.shape[0])  # [B] keys -> next keys, sample keys
        output, metrics = self._transform(x, sample_keys)
        return StatefulModuleOutput(next_state=next_keys, output=output, metrics=metrics)

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Loss replay: the key chain alone scans time, the draws run for all
        steps at once (:func:`~nnx_ppo.networks.types.replay_key_chain`); a
        subclass that overrides ``__call__`` is replayed step by step."""
        if not has_fast_replay(self, _PerEnvKeyModule):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        return replay_key_chain(self, carry, xs, rollout_extras, reset, stored_carry)

    def _transform(self, x: jax.Array, sample_keys: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(output, metrics)`` for input ``x`` ``[B, ...]`` and one sample key per env."""
        raise NotImplementedError

    @staticmethod
    def _per_env(draw: Callable[[jax.Array, tuple[int, ...]], jax.Array], sample_keys: jax.Array,
                 x: jax.Array) -> jax.Array:
        """``[B, ...]`` samples: ``draw(key, x.shape[1:])`` with each env's key."""
        return jax.vmap(lambda k: draw(k, x.shape[1:]))(sample_keys)


class GaussianNoise(_PerEnvKeyModule):
    """Additive Gaussian noise, e.g. a noisy neuron population::

        y = x + stddev * eps,   eps ~ N(0, I) per env and step (from the carry key)
        y = x                   when deterministic

    Args:
      stddev: noise standard deviation, ``>= 0``.
      rngs: ``nnx.Rngs`` (or an int seed) used only to seed / re-seed the per-env keys.
      fresh_keys_on_reset: draw fresh keys on reset instead of keeping the chain.
      deterministic: start in evaluation (noise-free) mode.
    """

    def __init__(self, stddev: float, rngs: nnx.Rngs, *, fresh_keys_on_reset: bool = False,
                 deterministic: bool = False):
        check_argument(type(self).__name__, "stddev", stddev, stddev >= 0, ">= 0")
        super().__init__(rngs, fresh_keys_on_reset, deterministic)
        self.stddev = float(stddev)

    def _transform(self, x, sample_keys):
        if self.deterministic or self.stddev == 0.0:
            return x, {}
        eps = self._per_env(lambda k, shape: jax.random.normal(k, shape, dtype=x.dtype), sample_keys, x)
        return x + self.stddev * eps, {}


class DropoutMask(_PerEnvKeyModule):
    """Inverted dropout with a fresh mask per env and step::

        m ~ Bernoulli(1 - rate)  elementwise, from the carry key
        y = m * x / (1 - rate)
        y = x                    when deterministic (or rate == 0)

    Args:
      rate: drop probability, in ``[0, 1)``.
      rngs: ``nnx.Rngs`` (or an int seed) used only to seed / re-seed the per-env keys.
      fresh_keys_on_reset: draw fresh keys on reset instead of keeping the chain.
      deterministic: start in evaluation (no-dropout) mode.
    """

    def __init__(self, rate: float, rngs: nnx.Rngs, *, fresh_keys_on_reset: bool = False,
                 deterministic: bool = False):
        check_argument(type(self).__name__, "rate", rate, 0.0 <= rate < 1.0, "in [0, 1)")
        super().__init__(rngs, fresh_keys_on_reset, deterministic)
        self.rate = float(rate)

    def _transform(self, x, sample_keys):
        if self.deterministic or self.rate == 0.0:
            return x, {}
        keep = 1.0 - self.rate
        mask = self._per_env(lambda k, shape: jax.random.bernoulli(k, keep, shape), sample_keys, x)
        return jnp.where(mask, x / keep, jnp.zeros_like(x)), {}


class BernoulliGate(_PerEnvKeyModule):
    """A stochastic binary gate: ``x`` are logits, the output is a 0/1 sample.

    Forward value (elementwise, ``u ~ Uniform(0, 1)`` from the carry key and
    ``ℓ = log u - log(1 - u)`` logistic noise)::

        g = 1[x + ℓ > 0]          # exactly a Bernoulli(sigmoid(x)) sample
        g = 1[sigmoid(x) > 0.5]   # when deterministic (i.e. 1[x > 0])

    The value is always the hard 0/1 gate; the gradient is that of a smooth
    surrogate ``s`` (``g + s - stop_gradient(s)``), chosen by ``estimator``:

    * ``"straight_through"`` (default): ``s = sigmoid(x / temperature)``; with
      ``temperature=1`` the gradient is exactly that of ``sigmoid(x)``. Smaller
      temperatures give the slope-annealed variant.
    * ``"gumbel_straight_through"``: ``s = sigmoid((x + ℓ) / temperature)``, the
      relaxed-Bernoulli (binary Concrete) surrogate with the same noise as the
      hard sample. In deterministic mode ``ℓ = 0``.

    ``metrics = {"gate_open_fraction": mean(g)}``.

    Args:
      rngs: ``nnx.Rngs`` (or an int seed) used only to seed / re-seed the per-env keys.
      temperature: surrogate temperature, ``> 0``.
      estimator: ``"straight_through"`` or ``"gumbel_straight_through"``.
      fresh_keys_on_reset: draw fresh keys on reset instead of keeping the chain.
      deterministic: start in evaluation mode (gate = ``sigmoid(x) > 0.5``).
    """

    ESTIMATORS = ("straight_through", "gumbel_straight_through")

    def __init__(self, rngs: nnx.Rngs, *, temperature: float = 1.0,
                 estimator: str = "straight_through", fresh_keys_on_reset: bool = False,
                 deterministic: bool = False):
        check_argument(type(self).__name__, "temperature", temperature, temperature > 0, "> 0")
        if estimator not in self.ESTIMATORS:
            raise ValueError(f"BernoulliGate: estimator must be one of {self.ESTIMATORS}, "
                             f"got {estimator!r}")
        super().__init__(rngs, fresh_keys_on_reset, deterministic)
        self.temperature = float(temperature)
        self.estimator = estimator

    def _transform(self, x, sample_keys):
        if self.deterministic:
            noise = jnp.zeros_like(x)
        else:
            noise = self._per_env(lambda k, shape: jax.random.logistic(k, shape, dtype=x.dtype), sample_keys, x)
        hard = (x + noise > 0).astype(x.dtype)
        if self.estimator == "straight_through":
            soft = jax.nn.sigmoid(x / self.temperature)
        else:
            soft = jax.nn.sigmoid((x + jax.lax.stop_gradient(noise)) / self.temperature)
        gate = hard + (soft - jax.lax.stop_gradient(soft))
        return gate, {"gate_open_fraction": jnp.mean(hard)}
