"""The optimizer and the update epochs: what every trainer's iteration does
after its rollout.

:func:`make_optimizer` builds optax's Adam from a :class:`PPOConfig`;
:func:`update_epochs` runs ``n_epochs`` passes of ``n_minibatches``
gradient steps of any loss over ``[T, B, ...]`` data (PPO's clipped loss by
default, distillation's negative log-likelihood), each minibatch a group of
whole env sequences replayed from their stored carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.losses import ppo_loss, split_minibatches
from nnx_ppo.algorithms.rollout import count_nonfinite

__all__ = ["make_optimizer", "learning_rate_schedule", "update_epochs"]


def learning_rate_schedule(config: PPOConfig) -> Any:
    """The learning rate :func:`make_optimizer` gives optax: ``config.learning_rate``
    (a number or a schedule), or with ``learning_rate_decay`` the linear decay
    from it to 0 over the run's :attr:`~PPOConfig.total_updates`."""
    if config.learning_rate_decay:
        return optax.linear_schedule(config.learning_rate, 0.0, config.total_updates)
    return config.learning_rate


def _learning_rate_now(config: PPOConfig, opt_state: Any) -> jax.Array | None:
    """The rate the next update of ``opt_state`` takes (a schedule is read at
    its update count); None for an optimizer state without that count."""
    schedule = learning_rate_schedule(config)
    if not callable(schedule):
        return jnp.asarray(schedule, jnp.float32)
    is_count = lambda x: isinstance(x, optax.ScaleByScheduleState)
    counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=is_count) if is_count(s)]
    return jnp.asarray(schedule(counts[0]), jnp.float32) if counts else None


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Adam (AdamW with ``weight_decay``), optional global-norm clipping and
    linear learning-rate decay to zero over ``total_steps``.

    A ``config.learning_rate`` schedule (a callable, e.g. from
    ``optax.schedules``) is passed to optax as it is: it is called with the
    optimizer's update count, which advances once per minibatch update, so a
    training run makes ``n_iterations * n_epochs * n_minibatches`` updates
    (the count is part of the optimizer state: a resumed run continues it,
    and each seed of :func:`~nnx_ppo.algorithms.population.train_seeds` has its
    own)."""
    lr = learning_rate_schedule(config)
    adam = optax.adamw(lr, weight_decay=config.weight_decay) if config.weight_decay else optax.adam(lr)
    if config.gradient_clipping is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.gradient_clipping), adam)


def update_epochs(network: NetworkFn, optimizer: optax.GradientTransformation, opt_state: Any,
                  data: Any, key: jax.Array, config: PPOConfig,
                  loss_fn: Callable | None = None) -> tuple[NetworkFn, Any, dict]:
    """``n_epochs`` passes of ``n_minibatches`` gradient steps (nested scans).

    ``data`` leaves are ``[T, B, ...]`` (a :class:`~nnx_ppo.algorithms.losses.Minibatch`
    for PPO); each epoch permutes the env axis and splits it into
    ``[n_minibatches, T, B / n_minibatches, ...]`` whole env sequences
    (:func:`~nnx_ppo.algorithms.losses.split_minibatches`). ``loss_fn(params,
    network, minibatch) -> (loss, metrics)`` defaults to :func:`ppo_loss`
    with ``config`` (distillation passes its own). Returns the network with
    new ``params``, the optimizer state and the mean metrics (``replay/...``
    metrics: those of the first minibatch, before any update;
    ``train/learning_rate``: the mean rate of the updates made). With
    ``config.target_kl`` the updates stop early once a minibatch's
    ``policy/approx_kl`` exceeds ``1.5 * target_kl``.
    """
    if loss_fn is None:
        loss_fn = lambda params, net, batch: ppo_loss(params, net, batch, config)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def minibatch_step(carry, batch):
        params, opt_state, stopped = carry
        with jax.named_scope("loss"):
            (_, metrics), grads = grad_fn(params, network, batch)
        rate = _learning_rate_now(config, opt_state)  # (logged only: the update below computes its own)
        if rate is not None:
            metrics["train/learning_rate"] = rate
        with jax.named_scope("optimizer"):
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            metrics["optimizer/grad_norm"] = optax.tree.norm(grads)
            metrics["health/nonfinite_gradients"] = count_nonfinite(grads)
        if config.target_kl is None or "policy/approx_kl" not in metrics:
            return (new_params, new_opt_state, stopped), metrics
        # Early stop: this minibatch's policy already moved too far; skip its update and the rest.
        stopped = stopped | (metrics["policy/approx_kl"] > 1.5 * config.target_kl)
        keep = lambda new, old: jnp.where(stopped, old, new)
        metrics["optimizer/updates_skipped"] = stopped.astype(jnp.float32)
        return (jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt_state, opt_state), stopped), metrics

    def epoch(carry, epoch_key):
        with jax.named_scope("minibatch_gather"):
            batches = split_minibatches(epoch_key, data, config.n_minibatches, config.shuffle_blocks)
        return jax.lax.scan(minibatch_step, carry, batches)

    keys = jax.random.split(key, config.n_epochs)
    (params, opt_state, _), metrics = jax.lax.scan(epoch, (network.params, opt_state, jnp.asarray(False)), keys)
    # replay/*: measured on the first minibatch, before any update (must be ~0).
    rates = metrics.pop("train/learning_rate", None)
    skipped = metrics.get("optimizer/updates_skipped")
    metrics = {k: v[0, 0] if k.startswith("replay/") else jnp.sum(v) if k.startswith("health/") else jnp.mean(v)
               for k, v in metrics.items()}
    if rates is not None:
        metrics["train/learning_rate"] = _mean_rate(rates, skipped)
    return network.with_state(params=params), opt_state, metrics


def _mean_rate(rates: jax.Array, skipped: jax.Array | None) -> jax.Array:
    """The mean learning rate of the updates made (``[n_epochs, n_minibatches]``
    rates; with ``target_kl``, those not ``skipped``; the first's when none was made)."""
    if skipped is None:
        return jnp.mean(rates)
    made = 1.0 - skipped
    return jnp.where(jnp.sum(made) > 0, jnp.sum(rates * made) / jnp.maximum(jnp.sum(made), 1.0), rates[0, 0])
