"""Loss replay and the PPO loss.

The replay re-runs a minibatch of whole env sequences ``[T, M]`` from the
carry stored at the rollout's start, feeding back each step's stored
``rollout_extras`` and resetting carries exactly where the rollout did. Where
the rollout reset a carry, the replay takes the *stored* post-reset carry as
its value (so a ``reset_state`` that draws fresh keys from a class-level
``nnx.Rngs`` is reproduced exactly) while gradients flow through a
recomputed ``reset_state`` (so a trainable initial state still learns).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.layout import Layout, with_layout_constraint

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.gae import trajectory_gae
from nnx_ppo.algorithms.rollout import Trajectory, sum_leaves
from nnx_ppo.networks.types import PPONetworkOutput

__all__ = ["Minibatch", "minibatch_indices", "split_minibatches", "largest_difference",
           "replay_error", "normalize_advantages", "check_scalar_regularization", "ppo_loss"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Minibatch:
    """A slice of whole env sequences: ``trajectory`` leaves ``[T, M, ...]``,
    ``advantages`` and ``returns`` ``[T, M]`` (pytrees for dict rewards),
    ``last_values`` ``[1, M]``: the rollout's values of the observations after
    its last step (kept ``[1, ...]`` so that every leaf splits along axis 1)."""

    trajectory: Trajectory
    advantages: Any
    returns: Any
    last_values: Any = None


def minibatch_indices(key: jax.Array, n_envs: int, n_minibatches: int, n_blocks: int = 1) -> jax.Array:
    """One epoch's random partition of the env axis into minibatches of whole env sequences.

    Returns int32 ``[n_minibatches, n_blocks, n_envs // (n_blocks * n_minibatches)]``:
    minibatch ``k`` takes, from each block ``g`` (a contiguous ``n_envs /
    n_blocks`` of the envs), the envs ``index[k, g]`` counted within the
    block. With one block it is a random permutation of the envs cut into
    ``n_minibatches`` parts; with ``n_blocks > 1`` the envs are permuted
    within each block and every minibatch takes an equal share of each (so
    under sharding over ``n_blocks`` devices no env sequence moves between
    devices). :func:`split_minibatches` gathers them.
    """
    per_block = n_envs // n_blocks
    if n_blocks == 1:
        perms = jax.random.permutation(key, n_envs)[None]
    else:
        perms = jax.vmap(lambda k: jax.random.permutation(k, per_block))(jax.random.split(key, n_blocks))
    return jnp.swapaxes(jnp.reshape(perms, (n_blocks, n_minibatches, per_block // n_minibatches)), 0, 1)


def _take_minibatch(data: Any, index: jax.Array) -> Any:
    """The minibatch ``index`` (``[n_blocks, M / n_blocks]``, one entry of
    :func:`minibatch_indices`) of ``data`` (a :class:`Minibatch` or any pytree
    of ``[T, B, ...]`` leaves): leaves ``[T, M, ...]``, block by block."""
    n_blocks, per_minibatch = index.shape

    def take(x):
        if n_blocks == 1:
            return x.at[:, index[0]].get(mode="promise_in_bounds")
        T, B = x.shape[:2]
        blocks = jnp.reshape(x, (T, n_blocks, B // n_blocks) + x.shape[2:])
        taken = jax.vmap(lambda block, i: block.at[:, i].get(mode="promise_in_bounds"), in_axes=(1, 0),
                         out_axes=1)(blocks, index)
        return jnp.reshape(taken, (T, n_blocks * per_minibatch) + x.shape[2:])

    return jax.tree.map(take, data)


def split_minibatches(key: jax.Array, data: Any, n_minibatches: int, n_blocks: int = 1) -> Any:
    """One epoch's minibatches: ``data`` (a :class:`Minibatch` or any pytree)
    leaves ``[T, B, ...]`` become ``[n_minibatches, T, B // n_minibatches,
    ...]`` (the partition of :func:`minibatch_indices`); scan over the
    leading axis for one epoch.

    They are laid out row-major in memory (minibatch, then time, then env
    major) whatever layout the gather would prefer, so that the replay reads
    each step's rows contiguously; left to itself, a TPU's compiler gave the
    gathered data an env-major layout (``bench/README.md``, "Where an
    iteration's time goes on the chip")."""
    B = jax.tree.leaves(data)[0].shape[1]
    indices = minibatch_indices(key, B, n_minibatches, n_blocks)
    batches = jax.vmap(lambda index: _take_minibatch(data, index))(indices)
    return jax.tree.map(_row_major, batches)


def _row_major(x: jax.Array) -> jax.Array:
    """``x`` laid out row-major in memory (minibatch, then time, then env
    major), whatever layout the gather that made it prefers; PRNG keys as they are."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return x
    return with_layout_constraint(x, Layout(major_to_minor=tuple(range(x.ndim))))


def largest_difference(a: Any, b: Any) -> jax.Array:
    """The largest ``|a - b|`` over all leaves of two trees of the same structure."""
    return jnp.max(jnp.stack([jnp.max(jnp.abs(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]))


def normalize_advantages(advantages: jax.Array) -> jax.Array:
    """Standardize over the minibatch; a single element (or constant
    advantages) gives zeros rather than NaN."""
    centered = advantages - jnp.mean(advantages)
    return centered / (jnp.std(advantages) + 1e-8)


def _policy_advantages(advantages, loglikelihoods, config: PPOConfig):
    """The advantages the surrogate uses, ``[T, M]`` leaves.

    A dict (one advantage per action key) when advantages and
    log-likelihoods are dicts with the same keys and ``combine_advantages`` is
    off; otherwise one array, the sum over reward keys, for the joint
    log-likelihood of all actions.
    """
    if (
        isinstance(advantages, dict)
        and isinstance(loglikelihoods, dict)
        and set(advantages) == set(loglikelihoods)
        and not config.combine_advantages
    ):
        return {k: advantages[k] for k in advantages}
    return sum_leaves(advantages)


def replay_error(replayed: PPONetworkOutput, trajectory: Any) -> jax.Array:
    """The replay measurement (logged as ``replay/max_error``, checked
    against ``PPOConfig.replay_tolerance``): the largest absolute difference
    between the replayed log-likelihoods and values and those the rollout
    recorded in ``trajectory`` (no gradient)."""
    return jax.lax.stop_gradient(jnp.maximum(
        largest_difference(replayed.loglikelihoods, trajectory.loglikelihoods),
        largest_difference(replayed.value_estimates, trajectory.values)))


# graphdefs whose one-step regularization_loss was found scalar (checked once per network structure)
_SCALAR_REGULARIZATION: set = set()


def check_scalar_regularization(network: NetworkFn, trajectory: Any) -> None:
    """Raise a ``ValueError`` naming the module (path and class) whose
    ``regularization_loss`` is not a scalar; the loss adds it to a scalar.

    Checked on one step of ``trajectory`` (its first: carry, obs and extras;
    leaves ``[T, M, ...]``) with ``jax.eval_shape`` when the loss is traced,
    once per network structure: nothing runs, and the compiled program is
    unchanged. A module that returns a per-env loss ``[B]`` must average it
    itself (the modules' losses are summed as they are).
    """
    try:
        if network.graphdef in _SCALAR_REGULARIZATION:
            return
    except TypeError:  # an unhashable graphdef: check every time
        pass
    first = jax.tree.map(lambda x: x[0], (trajectory.carry, trajectory.obs, trajectory.extras))
    shapes = []

    def one_step(params, rest, step_inputs):
        module = nnx.merge(network.graphdef, params, rest)
        shapes.append(jnp.shape(module(*step_inputs).regularization_loss))

    try:
        jax.eval_shape(one_step, network.params, network.rest, first)
    except Exception:  # noqa: BLE001 -- not this check's to report: the replay below runs the same step and names it
        return
    if shapes[0] == ():
        try:
            _SCALAR_REGULARIZATION.add(network.graphdef)
        except TypeError:
            pass
        return
    raise ValueError(_non_scalar_regularization_message(network, first, shapes[0]))


def _non_scalar_regularization_message(network: NetworkFn, first: Any, shape: tuple) -> str:
    """The message naming the innermost module whose regularization_loss is
    not a scalar, found by tracing one step with every module's ``__call__``
    recorded (only here, to name it)."""
    from nnx_ppo.networks.types import StatefulModule

    finished = []  # ((path, module), shape), in the order the calls return: inner modules first

    def one_step(params, rest, step_inputs):
        module = nnx.merge(network.graphdef, params, rest)
        owners = {id(m): (path, m) for path, m in nnx.iter_modules(module) if isinstance(m, StatefulModule)}
        defining = {next((c for c in type(m).__mro__ if "__call__" in vars(c)), None) for _, m in owners.values()}
        originals = {c: vars(c)["__call__"] for c in defining if c is not None}

        def recorded(call):
            @functools.wraps(call)
            def wrapper(self, *args, **kwargs):
                out = call(self, *args, **kwargs)
                if id(self) in owners:
                    finished.append((owners[id(self)], jnp.shape(getattr(out, "regularization_loss", 0.0))))
                return out

            return wrapper

        for cls, call in originals.items():
            cls.__call__ = recorded(call)
        try:
            module(*step_inputs)
        finally:
            for cls, call in originals.items():
                cls.__call__ = call

    try:
        jax.eval_shape(one_step, network.params, network.rest, first)
    except Exception:  # noqa: BLE001 -- the message then names the network only
        finished.clear()
    culprit = next(((owner, s) for owner, s in finished if s != ()), None)
    if culprit is None:
        where, shape_seen = "the network", shape
    else:
        (path, module), shape_seen = culprit
        name = "/".join(str(k) for k in path) or "(the network itself)"
        where = f"module {name} ({type(module).__module__}.{type(module).__qualname__})"
    return (
        f"{where} returns a regularization_loss of shape {tuple(shape_seen)}; regularization_loss must be a "
        "scalar (the loss sums the modules' terms as they are): average a per-env term over the batch in the "
        "module, e.g. jnp.mean(...)"
    )


def ppo_loss(params, network: NetworkFn, batch: Minibatch, config: PPOConfig):
    """Clipped-surrogate PPO loss on one minibatch (differentiable in ``params``).

    The minibatch's ``[T, M]`` env sequences are replayed by ``network`` with
    ``params`` (:meth:`NetworkFn.replay`: from the stored start carry, with the
    stored extras and resets; updates to other variables are discarded).

    ``total = policy_loss + critic_loss_weight * value_loss +
    regularization_weight * regularization`` where regularization is the sum of the modules' ``regularization_loss``
    (entropy bonus, KL, ...), averaged over steps. With
    ``config.recompute_advantages`` the advantages and value targets are
    recomputed by GAE from the replayed (current) values of this minibatch
    instead of the rollout's. Returns ``(total, metrics)``. A module whose
    ``regularization_loss`` is not a scalar is a ``ValueError`` naming it
    (:func:`check_scalar_regularization`, when the loss is traced).
    """
    traj = batch.trajectory
    check_scalar_regularization(network.with_state(params=params), traj)
    replay = network.with_state(params=params).replay(traj, config.scan_unroll(jax.default_backend()))
    new = replay.output

    advantages, returns = batch.advantages, batch.returns
    if config.recompute_advantages:
        last_values = jax.tree.map(lambda v: v[0], batch.last_values)
        advantages, returns = jax.lax.stop_gradient(trajectory_gae(traj, new.value_estimates, last_values, config))
    advantages = _policy_advantages(advantages, new.loglikelihoods, config)
    if isinstance(advantages, dict):
        new_ll, old_ll = new.loglikelihoods, traj.loglikelihoods
    else:
        new_ll, old_ll = sum_leaves(new.loglikelihoods), sum_leaves(traj.loglikelihoods)
    if config.normalize_advantages:
        advantages = jax.tree.map(normalize_advantages, advantages)

    def surrogate(adv, ll_new, ll_old):
        log_ratio = ll_new - ll_old
        ratio = jnp.exp(log_ratio)
        clipped = jnp.clip(ratio, 1.0 - config.clip_range, 1.0 + config.clip_range)
        loss = -jnp.mean(jnp.minimum(ratio * adv, clipped * adv))
        approx_kl = jnp.mean((ratio - 1.0) - log_ratio)
        clip_fraction = jnp.mean((jnp.abs(ratio - 1.0) > config.clip_range).astype(jnp.float32))
        return loss, approx_kl, clip_fraction

    parts = jax.tree.map(surrogate, advantages, new_ll, old_ll)
    parts = jax.tree.leaves(parts, is_leaf=lambda x: isinstance(x, tuple))
    policy_loss = sum(p[0] for p in parts)
    approx_kl = sum(p[1] for p in parts) / len(parts)
    clip_fraction = sum(p[2] for p in parts) / len(parts)

    def value_error(v_new, v_old, ret):
        error = (v_new - ret) ** 2
        if config.value_clip_range is not None:
            v_clipped = v_old + jnp.clip(v_new - v_old, -config.value_clip_range, config.value_clip_range)
            error = jnp.maximum(error, (v_clipped - ret) ** 2)
        return 0.5 * jnp.mean(error)

    value_loss = sum_leaves(jax.tree.map(value_error, new.value_estimates, traj.values, returns))
    regularization = config.regularization_weight * replay.regularization_loss
    total = policy_loss + config.critic_loss_weight * value_loss + regularization
    metrics = {
        "replay/max_error": replay_error(new, traj),
        "loss/total": total,
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "loss/regularization": replay.regularization_loss,
        "policy/approx_kl": approx_kl,
        "policy/clip_fraction": clip_fraction,
    }
    return total, metrics
