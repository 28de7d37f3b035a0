"""Check that a network replays its rollout exactly (the library's guarantee)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.driver import rule_breaking_module_error
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.losses import Minibatch, split_minibatches
from nnx_ppo.algorithms.ppo import new_training_state
from nnx_ppo.algorithms.rollout import collect_rollout
from nnx_ppo.envs.registry import as_env

__all__ = ["ReplayReport", "check_replay_consistency"]


@dataclasses.dataclass
class ReplayReport:
    """Result of :func:`check_replay_consistency`.

    Attributes:
      max_abs_log_ratio: largest ``|log pi_replay - log pi_rollout|``.
      max_value_difference: largest ``|V_replay - V_rollout|``.
      passed: both within ``tolerance``.
      tolerance: the bound used.
      first_divergence: where the replay first departed from the rollout, as
        ``"step t, carry leaf <path>"`` (the path names the module holding
        that carry), or ``None``.
      n_resets: episode resets inside the rollout (the check is stronger
        with some).
    """

    max_abs_log_ratio: float
    max_value_difference: float
    passed: bool
    tolerance: float
    first_divergence: str | None
    n_resets: int

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        text = (
            f"replay consistency {verdict}: max |log ratio| = {self.max_abs_log_ratio:.3g}, "
            f"max |value difference| = {self.max_value_difference:.3g} (tolerance {self.tolerance:g}); "
            f"{self.n_resets} resets in the rollout"
        )
        if self.first_divergence:
            text += f"; first divergence: {self.first_divergence}"
        return text


def _max_abs_diff(a, b) -> float:
    diffs = jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)
    return max(jax.tree.leaves(diffs), default=0.0)


def _first_carry_divergence(stored, replayed, reset, tolerance) -> str | None:
    """The earliest step (and carry leaf) where the replay's own carry differs
    from the rollout's, ignoring steps where the carry was reset."""
    keep = ~np.asarray(reset)
    best = None
    for path, s in jax.tree_util.tree_leaves_with_path(stored):
        r = _get(replayed, path)
        if jnp.issubdtype(s.dtype, jax.dtypes.prng_key):
            s, r = jax.random.key_data(s), jax.random.key_data(r)
        diff = np.abs(np.asarray(s, np.float64) - np.asarray(r, np.float64))
        diff = diff.reshape(diff.shape[:2] + (-1,)).max(axis=-1) if diff.ndim > 2 else diff
        bad = (diff > tolerance) & keep
        if bad.any():
            t = int(np.argwhere(bad)[0][0])
            if best is None or t < best[0]:
                best = (t, jax.tree_util.keystr(path))
    if best is None:
        return None
    return f"step {best[0]}, carry leaf {best[1]} (the module holding this carry entry)"


def _get(tree, path):
    for entry in path:
        if isinstance(entry, jax.tree_util.SequenceKey):
            tree = tree[entry.idx]
        elif isinstance(entry, jax.tree_util.DictKey):
            tree = tree[entry.key]
        else:
            tree = getattr(tree, entry.name)
    return tree


def check_replay_consistency(
    network,
    env,
    *,
    n_envs: int = 8,
    rollout_length: int = 32,
    n_minibatches: int = 2,
    seed: int = 0,
    tolerance: float = 1e-5,
) -> ReplayReport:
    """Run one rollout, then replay it minibatch by minibatch without updating,
    and compare log-likelihoods and values.

    A module that follows the rules (per-env keys in the carry, no write in
    ``__call__`` that changes its output, samplers replaying the stored
    action) passes with errors around 1e-7; one that draws from a
    class-level RNG inside ``__call__`` fails (a module without carry raises
    :class:`~nnx_ppo.algorithms.driver.ReplayMismatchError` naming it).
    Writes that leave the output unchanged, such as a call counter, pass.
    Does not modify ``network``. Use an env with episodes shorter than
    ``rollout_length`` so that resets happen inside the rollout.
    """
    env = as_env(env)
    ppo = PPOConfig(n_envs=n_envs, rollout_length=rollout_length, n_minibatches=n_minibatches, total_steps=1)
    state = new_training_state(env, network, TrainConfig(ppo=ppo, seed=seed))
    graphdef = NetworkFn.of(network).graphdef

    @jax.jit
    def run(state):
        key_rollout, key_perm = jax.random.split(state.key)
        net = NetworkFn(graphdef, state.params, state.rest)
        rollout = collect_rollout(env, net, state.rollout, key_rollout, rollout_length, True)
        traj = rollout.trajectory
        dummy = jax.tree.map(jnp.zeros_like, traj.values)
        batches = split_minibatches(
            key_perm, Minibatch(trajectory=traj, advantages=dummy, returns=dummy), n_minibatches
        )
        replayed = jax.lax.map(lambda b: rollout.network.replay(b.trajectory), batches)
        return batches.trajectory, replayed

    try:
        traj, replay = run(state)
    except flax_errors.TraceContextError as err:
        raise rule_breaking_module_error(err, network) from None
    log_ratio = _max_abs_diff(replay.output.loglikelihoods, traj.loglikelihoods)
    value_diff = _max_abs_diff(replay.output.value_estimates, traj.values)
    divergence = None
    if jax.tree.leaves(traj.carry):
        # [n_minibatches, T, M, ...] -> [T, n_minibatches * M, ...]
        to_tb = lambda x: jnp.reshape(jnp.swapaxes(x, 0, 1), (rollout_length, n_envs) + x.shape[3:])
        divergence = _first_carry_divergence(
            jax.tree.map(to_tb, traj.carry), jax.tree.map(to_tb, replay.carry), to_tb(traj.reset), tolerance
        )
    passed = log_ratio <= tolerance and value_diff <= tolerance
    if not passed and divergence is None:
        divergence = "outputs differ but every carry matches: a module's output depends on state outside its carry"
    return ReplayReport(
        max_abs_log_ratio=log_ratio,
        max_value_difference=value_diff,
        passed=passed,
        tolerance=tolerance,
        first_divergence=divergence,
        n_resets=int(np.asarray(traj.reset).sum()),
    )
