"""Variational bottlenecks with per-env PRNG keys in the carry.

Both modules follow the randomness rule: the carry holds one typed PRNG key
per env (shape ``[B]``), seeded in :meth:`initialize_state` from the
construction-time ``nnx.Rngs`` and split locally per env in ``__call__``. The
forward pass is therefore a pure function of ``(parameters, carry, x)``: the
loss replay (and any minibatch slicing of the env axis) reproduces the
rollout's samples exactly, while gradients flow through the
reparameterisation ``z = mean + std * eps``.
"""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo import _original_paths
from nnx_ppo.networks.feedforward import check_argument, is_int
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

__all__ = ["VariationalBottleneck", "AR1VariationalBottleneck"]


class VariationalBottleneck(StatefulModule):
    """Samples ``z ~ N(mean, std²)`` with the reparameterisation trick.

    With ``L = latent_size`` and ``x`` of shape ``[B, 2L]``::

        mean = x[:, :L]
        std  = softplus(x[:, L:]) + min_std
        z    = mean + std * eps,         eps ~ N(0, I) drawn from the env's key
        KL_b = sum_l [ 0.5 * (mean² + std² - 1) - log(std) ]     # KL(N(mean, std²) || N(0, I))
        regularization_loss = kl_weight * mean_b(KL_b)
        metrics = {"kl_divergence": mean_b(KL_b)}

    Carry: a typed PRNG key array of shape ``[B]``. Each step splits every
    env's key into (next key, sample key). :meth:`reset_state` keeps the key
    chain (returns ``prev_state``) unless ``fresh_keys_on_reset=True``, in which
    case it draws ``jax.random.split(self.rng(), B)`` from the class-level
    ``nnx.Rngs``. Sampling is always on (there is no deterministic mode).

    Args:
      latent_size: ``L``.
      rng: ``nnx.Rngs`` (or an int seed) used only to seed the per-env keys.
      kl_weight: weight of the KL term in ``regularization_loss`` (default 1.0,
        as in the original nnx-ppo).
      min_std: lower bound added to the softplus standard deviation.
      fresh_keys_on_reset: see above.
    """

    def __init__(self, latent_size: int, rng: nnx.Rngs, kl_weight: float = 1.0, min_std: float = 1e-6,
                 *, fresh_keys_on_reset: bool = False):
        name = type(self).__name__
        check_argument(name, "latent_size", latent_size, is_int(latent_size, 1), "a positive int")
        check_argument(name, "kl_weight", kl_weight, not kl_weight < 0, ">= 0")
        check_argument(name, "min_std", min_std, not min_std < 0, ">= 0")
        self.latent_size = latent_size
        self.rng = as_rngs(rng)
        self.kl_weight = float(kl_weight)
        self.min_std = float(min_std)
        self.fresh_keys_on_reset = bool(fresh_keys_on_reset)

    def _fresh_keys(self, batch_size: int) -> jax.Array:
        return jax.random.split(self.rng(), batch_size)

    def _sample(self, keys: jax.Array, x: jax.Array):
        """Shared maths: returns (next_keys, z, kl per env [B])."""
        latent = self.latent_size
        if len(jnp.shape(x)) != 2 or jnp.shape(x)[1] != 2 * latent:
            raise ValueError(f"{type(self).__name__}: x has shape {tuple(jnp.shape(x))}, expected (B, {2 * latent}) "
                             f"(2 * latent_size, latent_size={latent})")
        mean = x[:, :latent]
        std = jax.nn.softplus(x[:, latent:]) + self.min_std
        next_keys, sample_keys = split_key_carry(type(self).__name__, keys, x.shape[0], "key carry")
        eps = jax.vmap(lambda k: jax.random.normal(k, (latent,), dtype=x.dtype))(sample_keys)
        z = mean + std * eps
        kl = jnp.sum(0.5 * (jnp.square(mean) + jnp.square(std) - 1.0) - jnp.log(std), axis=-1)
        return next_keys, z, kl

    def initialize_state(self, batch_size: int) -> jax.Array:
        return self._fresh_keys(batch_size)

    def reset_state(self, prev_state: jax.Array) -> jax.Array:
        if self.fresh_keys_on_reset:
            return self._fresh_keys(batch_size_of(prev_state))
        return prev_state

    def __call__(self, state: jax.Array, x: jax.Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        next_keys, z, kl = self._sample(state, x)
        kl_mean = jnp.mean(kl)
        return StatefulModuleOutput(next_state=next_keys, output=z, regularization_loss=self.kl_weight * kl_mean,
                                    metrics={"kl_divergence": kl_mean})

    def replay_sequence(self, carry, xs, rollout_extras, reset, stored_carry):
        """Loss replay: the key chain alone scans time, the sampling runs for
        all steps at once (:func:`~nnx_ppo.networks.types.replay_key_chain`);
        a subclass that overrides ``__call__`` is replayed step by step."""
        if not has_fast_replay(self, VariationalBottleneck):
            return replay_in_time(self, carry, xs, rollout_extras, reset, stored_carry)
        return replay_key_chain(self, carry, xs, rollout_extras, reset, stored_carry)


class AR1VariationalBottleneck(VariationalBottleneck):
    """:class:`VariationalBottleneck` plus a first-order smoothness penalty.

    Same sampling and KL as :class:`VariationalBottleneck`. In addition, with
    ``z_t`` the latent of the current step and ``z_{t-1}`` that of the previous
    step *of the same episode*::

        h_b    = 1 if env b already took a step in this episode, else 0
        S_b    = h_b * sum_l (z_t[b, l] - z_{t-1}[b, l])²
        regularization_loss = kl_weight * mean_b(KL_b) + smoothness_weight * mean_b(S_b)
        metrics = {"kl_divergence": mean_b(KL_b), "smoothness": mean_b(S_b)}

    The batch mean runs over all ``B`` envs (envs at the first step of an
    episode contribute 0). Gradients flow into both ``z_t`` and ``z_{t-1}``
    (the replay threads the carry through time).

    Carry: ``{"key": [B] keys, "prev_z": [B, L], "has_previous": [B] bool}``.
    :meth:`reset_state` zeros ``prev_z``, clears ``has_previous`` and keeps the
    key chain (or draws fresh keys when ``fresh_keys_on_reset=True``).

    Args:
      latent_size: ``L``, as for :class:`VariationalBottleneck` (the same
        positions for the first four arguments).
      rng: ``nnx.Rngs`` (or an int seed) used only to seed the per-env keys.
      kl_weight: weight of the KL term in ``regularization_loss`` (default 1.0,
        as in the original nnx-ppo).
      min_std: lower bound added to the softplus standard deviation.
      fresh_keys_on_reset: draw fresh keys in :meth:`reset_state`.
      smoothness_weight: weight of the smoothness penalty; keyword-only, so
        that the original nnx-ppo's positional ``(latent_size, rng, kl_weight,
        min_std, ar1_weight, backprop_through_time)`` is a ``TypeError``
        rather than a silent change of meaning. The original's ``ar1_weight``
        multiplies the *mean* squared difference over the latent axis; this
        one the *sum*: ``smoothness_weight = ar1_weight / latent_size`` gives
        the same penalty (gradients always flow back in time, the original's
        ``backprop_through_time=True``).
    """

    def __init__(self, latent_size: int, rng: nnx.Rngs, kl_weight: float = 1.0, min_std: float = 1e-6, *,
                 smoothness_weight: float, fresh_keys_on_reset: bool = False):
        super().__init__(latent_size, rng, kl_weight, min_std, fresh_keys_on_reset=fresh_keys_on_reset)
        check_argument("AR1VariationalBottleneck", "smoothness_weight", smoothness_weight,
                       not smoothness_weight < 0, ">= 0")
        self.smoothness_weight = float(smoothness_weight)

    def initialize_state(self, batch_size: int) -> dict[str, jax.Array]:
        return {"key": self._fresh_keys(batch_size),
                "prev_z": jnp.zeros((batch_size, self.latent_size), jnp.float32),
                "has_previous": jnp.zeros((batch_size,), jnp.bool_)}

    def reset_state(self, prev_state: dict[str, jax.Array]) -> dict[str, jax.Array]:
        return {"key": super().reset_state(prev_state["key"]),  # the chain kept, or fresh keys
                "prev_z": jnp.zeros_like(prev_state["prev_z"]),
                "has_previous": jnp.zeros_like(prev_state["has_previous"])}

    def __call__(self, state: dict[str, jax.Array], x: jax.Array, rollout_extras: Any = None) -> StatefulModuleOutput:
        if not isinstance(state, dict) or set(state) != {"key", "prev_z", "has_previous"}:
            raise ValueError("AR1VariationalBottleneck: state must be the dict "
                             "{'key', 'prev_z', 'has_previous'} from initialize_state")
        next_keys, z, kl = self._sample(state["key"], x)
        batch = x.shape[0]
        if tuple(state["prev_z"].shape) != (batch, self.latent_size):
            raise ValueError(f"AR1VariationalBottleneck: state['prev_z'] has shape {tuple(state['prev_z'].shape)}, "
                             f"expected ({batch}, {self.latent_size}) (B, latent_size)")
        if tuple(state["has_previous"].shape) != (batch,):
            raise ValueError(f"AR1VariationalBottleneck: state['has_previous'] has shape "
                             f"{tuple(state['has_previous'].shape)}, expected ({batch},)")
        sq = jnp.sum(jnp.square(z - state["prev_z"].astype(z.dtype)), axis=-1)
        smooth = jnp.where(state["has_previous"], sq, jnp.zeros_like(sq))
        kl_mean = jnp.mean(kl)
        smooth_mean = jnp.mean(smooth)
        loss = self.kl_weight * kl_mean + self.smoothness_weight * smooth_mean
        next_state = {"key": next_keys, "prev_z": z, "has_previous": jnp.ones_like(state["has_previous"])}
        return StatefulModuleOutput(next_state=next_state, output=z, regularization_loss=loss,
                                    metrics={"kl_divergence": kl_mean, "smoothness": smooth_mean})


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
