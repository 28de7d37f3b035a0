"""Action samplers: the last layer of a policy.

A sampler turns distribution parameters ``[B, P]`` into a sampler dict
``{"action": [B, ...], "log_likelihood": [B]}``.

* Rollout (``rollout_extras=None``): sample from the ``action`` stream of
  the module's own ``nnx.Rngs``, ``self.rng`` (the one place a class-level
  RNG is allowed) and emit the raw sample in ``rollout_extras``.
* Loss replay (``rollout_extras`` given): no sampling; the log-likelihood is
  computed for the stored raw action, so the ratio compares the action that
  was actually taken.
* ``deterministic=True`` (set by ``network.eval()``, cleared by
  ``network.train()``): take the mode/mean instead of sampling.

The entropy bonus is returned as ``regularization_loss = -entropy_weight * mean entropy``.
"""

from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
from flax import nnx

from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

__all__ = ["ActionSampler", "NormalTanhSampler", "NormalSampler", "CategoricalSampler"]

_CHOICES: list[int] | None = None


@contextlib.contextmanager
def categorical_choices():
    """``with categorical_choices() as seen:`` collects, in ``seen``, how many
    actions each :class:`CategoricalSampler` called inside chooses among (the
    width of its logits), e.g. under ``jax.eval_shape``, so that a trainer can
    check them against the env's ``Discrete(n)``."""
    global _CHOICES
    outer, _CHOICES = _CHOICES, []
    try:
        yield _CHOICES
    finally:
        _CHOICES = outer


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class ActionSampler(StatefulModule):
    """Base class of samplers. Subclasses implement ``distribution_size`` and
    ``_sample_and_score``; the carry is ``()``."""

    deterministic: bool = False

    def __init__(self, rng: nnx.Rngs, entropy_weight: float = 0.0):
        """Args:
          rng: the ``nnx.Rngs`` whose ``action`` stream the rollout samples
            from (kept as ``self.rng``).
          entropy_weight: weight of the entropy bonus, ``>= 0``.
        """
        if entropy_weight < 0:
            raise ValueError(f"{type(self).__name__}: entropy_weight must be >= 0, got {entropy_weight}")
        self.rng = rng
        self.entropy_weight = float(entropy_weight)
        self.deterministic = False

    def _check_input(self, x: jax.Array) -> None:
        raise NotImplementedError

    def _sample_and_score(self, x, raw_action):
        """Returns ``(raw_action, action, log_likelihood [B], entropy [B], metrics)``;
        ``raw_action`` is ``None`` when it must be drawn here."""
        raise NotImplementedError

    def raw_from_action(self, action: jax.Array) -> jax.Array:
        """The ``rollout_extras`` under which a replay scores ``action``
        ``[B, ...]`` (an action as this sampler outputs it): replaying with
        them gives the log-likelihood of ``action`` (used by distillation to
        score a teacher's actions)."""
        return jax.lax.stop_gradient(action)

    def __call__(self, state, x, rollout_extras=None):
        self._check_input(x)
        raw, action, loglik, entropy, metrics = self._sample_and_score(x, rollout_extras)
        return StatefulModuleOutput(next_state=(), output={"action": action, "log_likelihood": loglik},
                                    regularization_loss=-self.entropy_weight * jnp.mean(entropy),
                                    metrics={"entropy": jnp.mean(entropy), **metrics},
                                    rollout_extras=jax.lax.stop_gradient(raw))


def _normal_logpdf(x, mean, std):
    z = (x - mean) / std
    return -0.5 * z * z - jnp.log(std) - _HALF_LOG_2PI


def _log_one_minus_tanh_sq(x):
    """``log(1 - tanh(x)**2)``, stable for large ``|x|``."""
    return 2.0 * (math.log(2.0) - x - jax.nn.softplus(-2.0 * x))


class NormalSampler(ActionSampler):
    """Diagonal Gaussian policy, unsquashed: input ``[B, 2A]`` = mean and a std
    pre-activation; ``std = (softplus(pre) + min_std) * std_scale``.

    Args:
      rng: the ``nnx.Rngs`` sampled from in the rollout (``self.rng``).
      entropy_weight: weight of the entropy bonus, ``>= 0``.
      min_std: floor added to the std, ``>= 0``.
      std_scale: factor on the std, ``> 0``.
    """

    def __init__(self, rng: nnx.Rngs, entropy_weight: float = 0.0, min_std: float = 1e-3, std_scale: float = 1.0):
        super().__init__(rng, entropy_weight)
        if not min_std >= 0 or not std_scale > 0:
            raise ValueError(f"{type(self).__name__}: min_std must be >= 0 and std_scale > 0, got "
                             f"{min_std} and {std_scale}")
        self.min_std = float(min_std)
        self.std_scale = float(std_scale)

    def _check_input(self, x):
        if jnp.ndim(x) != 2 or x.shape[-1] % 2:
            raise ValueError(f"{type(self).__name__}: x has shape {tuple(jnp.shape(x))}, expected "
                             "(B, 2 * action_size) (means then std pre-activations)")

    def _sample_and_score(self, x, stored):
        mean, pre_std = jnp.split(x, 2, axis=-1)
        std = (jax.nn.softplus(pre_std) + self.min_std) * self.std_scale
        if stored is not None:
            raw = stored
        elif self.deterministic:
            raw = mean
        else:
            raw = mean + std * jax.random.normal(self.rng.action(), mean.shape)
        return self._score(mean, std, jax.lax.stop_gradient(raw))

    def _score(self, mean, std, raw):
        """``(raw, action, log_likelihood, entropy, metrics)`` of a raw sample."""
        loglik = jnp.sum(_normal_logpdf(raw, mean, std), axis=-1)
        entropy = jnp.sum(0.5 + _HALF_LOG_2PI + jnp.log(std), axis=-1)
        return raw, raw, loglik, entropy, {"sigma": jnp.mean(std)}


class NormalTanhSampler(NormalSampler):
    """Gaussian squashed by ``tanh`` into ``(-1, 1)``.

    The log-likelihood includes the change of variables,
    ``log N(u; mean, std) - sum log(1 - tanh(u)^2)`` for the raw sample ``u``.

    The entropy (for the bonus and the metric) is the Gaussian's plus the
    expected log-determinant of the squashing, estimated with one sample:
    the raw action written as ``mean + std * noise`` with the noise
    ``(u - mean) / std`` held constant. Its value is the log-determinant at
    ``u``, so the replay reproduces it exactly, and its gradient is the
    reparameterization gradient: the bonus pulls the mean away from the
    saturated ends of ``tanh`` and keeps the std from growing without bound
    (the Gaussian part alone only pushes the std up).
    """

    #: Actions are clipped to ``[-1 + eps, 1 - eps]`` before ``atanh`` in
    #: :meth:`raw_from_action`, so a saturated action has a finite raw value.
    action_eps = 1e-6

    def raw_from_action(self, action):
        """``atanh`` of the (clipped) action."""
        clipped = jnp.clip(action, -1.0 + self.action_eps, 1.0 - self.action_eps)
        return jax.lax.stop_gradient(jnp.arctanh(clipped))

    def _score(self, mean, std, raw):
        raw, _, gaussian_loglik, gaussian_entropy, metrics = super()._score(mean, std, raw)
        noise = jax.lax.stop_gradient((raw - mean) / std)
        log_det = jnp.sum(_log_one_minus_tanh_sq(raw), axis=-1)
        log_det_estimate = jnp.sum(_log_one_minus_tanh_sq(mean + std * noise), axis=-1)
        return raw, jnp.tanh(raw), gaussian_loglik - log_det, gaussian_entropy + log_det_estimate, metrics


class CategoricalSampler(ActionSampler):
    """Categorical policy over ``n`` actions: input logits ``[B, n]``, action
    an ``int32`` index ``[B]``; deterministic mode takes the argmax."""

    def _check_input(self, x):
        if jnp.ndim(x) != 2 or x.shape[-1] < 2:
            raise ValueError(f"CategoricalSampler: x has shape {tuple(jnp.shape(x))}, expected (B, n_actions) "
                             "logits with n_actions >= 2")
        if _CHOICES is not None:
            _CHOICES.append(int(x.shape[-1]))

    def raw_from_action(self, action):
        """The action index as ``int32``."""
        return jnp.asarray(action).astype(jnp.int32)

    def _sample_and_score(self, logits, stored):
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        if stored is not None:
            action = stored.astype(jnp.int32)
        elif self.deterministic:
            action = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:
            action = jax.random.categorical(self.rng.action(), logits, axis=-1).astype(jnp.int32)
        loglik = jnp.take_along_axis(log_probs, action[:, None], axis=-1)[:, 0]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
        return action, action, loglik, entropy, {}
