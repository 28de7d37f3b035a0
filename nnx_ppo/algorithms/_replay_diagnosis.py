"""Where a network's replay departs from its rollout: the diagnosis behind
:func:`nnx_ppo.testing.check_replay_consistency` and the trainer's
:class:`~nnx_ppo.algorithms.functional.ReplayMismatchError` (which runs it when
its health check finds a mismatch, to name the module).

One rollout of ``network`` on ``env``, replayed minibatch by minibatch
without an update; the log-likelihoods, values and carries of the two are
compared, and the first carry leaf the replay does not reproduce is traced
back to the module whose ``initialize_state`` made it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, module_name, observing_calls, rule_breaking_module_error
from nnx_ppo.algorithms.ppo import Minibatch, collect_rollout, new_training_state, split_minibatches
from nnx_ppo.envs.registry import as_env
from nnx_ppo.networks.feedforward import compute_precision

__all__ = ["diagnose_replay"]


@dataclasses.dataclass(frozen=True)
class ReplayDiagnosis:
    """What :func:`diagnose_replay` found.

    Attributes:
      max_abs_log_ratio: largest ``|log pi_replay - log pi_rollout|``.
      max_value_difference: largest ``|V_replay - V_rollout|``.
      first_divergence: ``"step t, carry leaf <path> of module layers/1
        (MyCell): ..."`` or None (every carry matches).
      n_resets: episode resets inside the rollout.
    """

    max_abs_log_ratio: float
    max_value_difference: float
    first_divergence: str | None
    n_resets: int

    def within(self, tolerance: float) -> bool:
        """Both differences at most ``tolerance`` (a NaN is not)."""
        return self.max_abs_log_ratio <= tolerance and self.max_value_difference <= tolerance


def _key_data(x):
    return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def _max_abs_diff(a, b) -> float:
    diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0)), a, b)
    return max(jax.tree.leaves(diffs), default=0.0)


def _first_carry_divergence(stored, replayed, reset, tolerance) -> tuple[int, str] | None:
    """The earliest step and carry leaf (its jax keystr) where the replay's
    own carry differs from the rollout's, ignoring steps where the carry was reset."""
    keep = ~np.asarray(reset)
    found = []
    for path, s in jax.tree_util.tree_leaves_with_path(stored):
        r = _get(replayed, path)
        diff = np.abs(np.asarray(s, np.float64) - np.asarray(r, np.float64))
        diff = diff.reshape(diff.shape[:2] + (-1,)).max(axis=-1) if diff.ndim > 2 else diff
        bad = (diff > tolerance) & keep
        if bad.any():
            found.append((int(np.argwhere(bad)[0][0]), jax.tree_util.keystr(path)))
    return min(found, key=lambda step_leaf: step_leaf[0], default=None)


def _divergence_text(step: int, leaf: str, owner: str | None) -> str:
    """``first_divergence``: the step, the carry leaf and the module it belongs to."""
    where = f"module {owner}" if owner else "the module holding this carry entry"
    return (f"step {step}, carry leaf {leaf} of {where}: the replay does not reproduce its carry, so it breaks "
            "a rule of docs/custom_modules.md (the randomness rule: one key per env, each env's carry advanced "
            "from its own; e.g. its next carry depends on other envs, or on state outside the carry)")


def _carry_owners(network, batch_size: int) -> dict[str, str]:
    """``{carry leaf path (jax keystr): "layers/1 (MyCell)"}``: the innermost
    :class:`~nnx_ppo.networks.types.StatefulModule` whose ``initialize_state``
    returned each leaf of the network's carry (traced with
    ``jax.eval_shape``; nothing runs). A leaf a container builds itself is
    put on the container; ``{}`` if the network's ``initialize_state`` does
    not trace this way."""
    view = NetworkFn.of(network)
    owners: dict[str, str] = {}

    def initialize(params, rest):
        module = nnx.merge(view.graphdef, params, rest)
        made: dict[int, tuple] = {}  # id(leaf) -> (leaf, module name); the leaf is kept so its id stays its own

        def observe(path, owner, call):
            result = call()
            for leaf in jax.tree.leaves(result):
                made.setdefault(id(leaf), (leaf, module_name(path, owner)))  # inner calls return first
            return result

        with observing_calls(module, "initialize_state", observe):
            carry = module.initialize_state(batch_size)
        for path, leaf in jax.tree_util.tree_leaves_with_path(carry):
            if id(leaf) in made:
                owners[jax.tree_util.keystr(path)] = made[id(leaf)][1]
        return carry

    try:
        jax.eval_shape(initialize, view.params, view.rest)
    except Exception:  # noqa: BLE001 -- the report then names the carry leaf only
        return {}
    return owners


def _batch_dependence(network, env, n_envs: int, seed: int, tolerance: float) -> str | None:
    """``first_divergence`` for a network whose outputs depend on the other
    envs of its batch, or None: one step from the initial carry on
    ``n_envs`` envs, and again with the envs in reverse order; the first
    module call (inner ones first) whose result for an env differs is named."""
    if n_envs < 2:
        return None
    view = NetworkFn.of(network)
    obs = jax.vmap(as_env(env).reset)(jax.random.split(jax.random.key(seed), n_envs)).obs
    carry, _ = view.initialize(n_envs)
    batched = lambda x: getattr(x, "ndim", 0) and x.shape[0] == n_envs  # noqa: E731

    def step(reverse: bool) -> list[tuple[str, object]]:
        calls: list[tuple[str, object]] = []
        module = nnx.merge(view.graphdef, view.params, view.rest)

        def observe(path, owner, call):
            result = call()
            calls.append((module_name(path, owner), result))
            return result

        order = (lambda x: x[::-1] if batched(x) else x) if reverse else (lambda x: x)
        with observing_calls(module, "__call__", observe):
            module(jax.tree.map(order, carry), jax.tree.map(order, obs))
        return calls

    try:
        forward, backward = step(False), step(True)
    except Exception:  # noqa: BLE001 -- a best-effort probe; the mismatch itself stands
        return None
    for (name, one), (_, other) in zip(forward, backward):
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(other)):
            if not (batched(a) and batched(b)):
                continue
            a, b = _key_data(a), _key_data(b)
            if float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b[::-1], jnp.float32)))) > tolerance:
                return (f"module {name}: its output for an env depends on the other envs of the batch (the same "
                        f"{n_envs} envs in reverse order get other outputs), so a minibatch replay cannot "
                        "reproduce it; it breaks the randomness rule of docs/custom_modules.md: e.g. it draws "
                        "from one key shared by all envs (draw from each env's own key in its carry), or mixes "
                        "envs (a reduction over the batch axis)")
    return None


def _get(tree, path):
    for entry in path:
        if isinstance(entry, jax.tree_util.SequenceKey):
            tree = tree[entry.idx]
        elif isinstance(entry, jax.tree_util.DictKey):
            tree = tree[entry.key]
        else:
            tree = getattr(tree, entry.name)
    return tree


def diagnose_replay(network, env, *, n_envs: int = 8, rollout_length: int = 32, n_minibatches: int = 2,
                    seed: int = 0, tolerance: float = 1e-5, precision: str = "default",
                    replay_unroll: int | None = None) -> ReplayDiagnosis:
    """One rollout of ``n_envs`` x ``rollout_length`` steps, replayed in
    ``n_minibatches`` minibatches, compared (``network`` is not modified),
    both at ``precision`` (``PPOConfig.precision``), the replay unrolled as
    the trainer unrolls it with ``PPOConfig.replay_unroll``. A module that writes a
    variable its output depends on raises
    :class:`~nnx_ppo.algorithms.functional.ReplayMismatchError` naming it."""
    env = as_env(env)
    ppo = PPOConfig(n_envs=n_envs, rollout_length=rollout_length, n_minibatches=n_minibatches, total_steps=1,
                    precision=precision, replay_unroll=replay_unroll)
    state = new_training_state(env, network, TrainConfig(ppo=ppo, seed=seed))
    graphdef = NetworkFn.of(network).graphdef

    @jax.jit
    def run(state):
        key_rollout, key_perm = jax.random.split(state.key)
        net = NetworkFn(graphdef, state.params, state.rest)
        with compute_precision(precision):
            rollout = collect_rollout(env, net, state.rollout, key_rollout, rollout_length, True,
                                      every_carry=True)
            traj = rollout.trajectory
            dummy = jax.tree.map(jnp.zeros_like, traj.values)
            batches = split_minibatches(
                key_perm, Minibatch(trajectory=traj, advantages=dummy, returns=dummy), n_minibatches
            )
            unroll = ppo.scan_unroll(jax.default_backend())
            replayed = jax.lax.map(lambda b: rollout.network.replay(b.trajectory, unroll), batches)
        # keys as their data, so that everything below runs on the host: the
        # outputs carry the minibatch layout (losses.split_minibatches), which
        # eager ops on a TPU refuse
        return jax.tree.map(_key_data, (batches.trajectory, replayed))

    try:
        traj, replay = jax.device_get(run(state))
    except flax_errors.TraceContextError as err:
        raise rule_breaking_module_error(err, network) from None
    log_ratio = _max_abs_diff(replay.output.loglikelihoods, traj.loglikelihoods)
    value_diff = _max_abs_diff(replay.output.value_estimates, traj.values)
    divergence = None
    if jax.tree.leaves(traj.carry):
        # [n_minibatches, T, M, ...] -> [T, n_minibatches * M, ...]
        to_tb = lambda x: np.reshape(np.swapaxes(x, 0, 1), (rollout_length, n_envs) + x.shape[3:])
        first = _first_carry_divergence(
            jax.tree.map(to_tb, traj.carry), jax.tree.map(to_tb, replay.carry), to_tb(traj.reset), tolerance
        )
        if first is not None:
            divergence = _divergence_text(*first, _carry_owners(network, n_envs).get(first[1]))
    if divergence is None and max(log_ratio, value_diff) > tolerance:
        divergence = _batch_dependence(network, env, n_envs, seed, tolerance)
    return ReplayDiagnosis(max_abs_log_ratio=log_ratio, max_value_difference=value_diff,
                           first_divergence=divergence, n_resets=int(np.asarray(traj.reset).sum()))
