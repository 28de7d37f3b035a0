"""Checkers users run on their own modules and environments.

* :func:`check_env`: catch common mistakes in an :class:`~nnx_ppo.envs.RLEnv`
  (it steps the env; the shape-only checks training makes before compiling
  are in :mod:`nnx_ppo.envs.types`).
* :func:`check_replay_consistency`: check that a network replays its rollout
  exactly (the library's guarantee).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.algorithms._replay_diagnosis import diagnose_replay
from nnx_ppo.envs import spaces as _spaces
from nnx_ppo.envs.registry import as_env
from nnx_ppo.envs.types import (
    EnvCheckError,
    EnvState,
    check_scalar_per_env,
    compare_structure,
    dtype_of,
    fail,
    leaves_with_paths,
    path_name,
)

__all__ = ["check_replay_consistency", "ReplayReport", "check_env", "EnvCheckError", "EnvCheckReport"]


# --------------------------------------------------------------------------- check_env


@dataclasses.dataclass
class EnvCheckReport:
    """What ``check_env`` observed; arrays have shape ``(n_steps, n_envs)``.

    ``reset_state`` and ``last_state`` are the batched first and last states.
    """

    n_envs: int
    n_steps: int
    reward: np.ndarray
    done: np.ndarray
    truncated: np.ndarray
    reset_state: EnvState | None = None
    last_state: EnvState | None = None


def _looks_like_key(x) -> bool:
    dt = getattr(x, "dtype", None)
    if dt is None:
        return False
    if jnp.issubdtype(dt, jax.dtypes.prng_key):
        return True
    return dt == jnp.uint32 and x.ndim >= 1 and x.shape[-1] == 2


def _require_finite(name, tree):
    for k, x in leaves_with_paths(tree, name).items():
        if jnp.issubdtype(dtype_of(x), jnp.inexact) and not bool(jnp.all(jnp.isfinite(x))):
            fail(f"{k}: contains NaN or inf")


def _check_obs_space(obs, space):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(space, is_leaf=_spaces.is_space)
    try:
        obs_leaves = treedef.flatten_up_to(obs)
    except (ValueError, TypeError) as e:
        fail(f"obs: structure does not match observation_space ({e})")
    for (p, s), x in zip(leaves, obs_leaves):
        k = path_name("obs", p)
        if np.shape(x)[1:] != s.shape:
            fail(f"{k}: shape {np.shape(x)[1:]} does not match observation_space shape {s.shape}")
        if dtype_of(x) != s.dtype:
            fail(f"{k}: dtype {dtype_of(x)} does not match observation_space dtype {s.dtype}")


def _check_state(state, n_envs, obs_space, what):
    if not isinstance(state, EnvState):
        fail(f"{what} must return an EnvState, got {type(state).__name__}")
    if not isinstance(state.info, dict) or "truncated" not in state.info:
        fail(f'info["truncated"]: missing from the {what} state (set it to 0.0 at reset, 1.0 on time-limit ends)')
    check_scalar_per_env("reward", state.reward, n_envs)
    check_scalar_per_env("done", state.done, n_envs)
    check_scalar_per_env("info['truncated']", state.info["truncated"], n_envs)
    for k, x in leaves_with_paths(state.metrics, "metrics").items():
        if np.shape(x) != (n_envs,):
            fail(f"{k}: metrics must be scalars per environment, got per-env shape {np.shape(x)[1:]}")
    _check_obs_space(state.obs, obs_space)
    _require_finite("obs", state.obs)
    _require_finite("reward", state.reward)
    d, t = np.asarray(state.done), np.asarray(state.info["truncated"])
    for name, x in (("done", d), ("info['truncated']", t)):
        if not np.all((x == 0) | (x == 1)):
            fail(f"{name}: must be 0.0 or 1.0, got {x}")
    if np.any(t > d):
        fail("info['truncated']: set to 1 on a step where done is 0 (truncated implies done)")


def _stored_keys(state, in_data):
    trees = {"data": state.data, "info": state.info} if in_data else {"info": state.info}
    found = {k: x for name, tree in trees.items() for k, x in leaves_with_paths(tree, name).items()}
    return {k: x for k, x in found.items() if _looks_like_key(x)}


def _key_bits(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def check_env(env, *, n_envs: int = 4, n_steps: int = 8, seed: int = 0, check_keys: bool = True) -> EnvCheckReport:
    """Reset and step ``env`` under ``jax.jit(jax.vmap(...))`` with random valid actions.

    Raises :class:`EnvCheckError` naming the offending field when:

    * reset/step return something other than an EnvState, or states whose
      pytree structure, leaf shapes or dtypes differ (the differing keys are named);
    * obs does not match ``observation_space`` (shape/dtype), or contains NaN/inf;
    * reward, done or ``info["truncated"]`` are not float32 scalars per env, or
      ``info["truncated"]`` is missing; done/truncated not 0/1, truncated without done;
    * metrics are not scalars;
    * reward contains NaN/inf;
    * (``check_keys``) a PRNG key stored in ``data`` or ``info`` (a typed key, or a
      uint32 array whose last axis is 2) is identical before and after a step in
      every env: a stochastic env that never advances its key repeats its "noise".
      Keys in ``data`` are skipped for adapters of third-party envs
      (``env.unwrapped.check_keys_in_data = False``).

    ``env`` goes through :func:`~nnx_ppo.envs.as_env` first, as in training:
    a raw Playground, Brax or gymnax env, or one written for the original
    nnx-ppo, is checked as the adapter the trainer would use.

    Returns an :class:`EnvCheckReport` with the rewards/dones/truncations seen.
    """
    env = as_env(env)
    key = jax.random.PRNGKey(seed)
    key, reset_key, act_key = jax.random.split(key, 3)
    obs_space, act_space = env.observation_space, env.action_space

    reset_fn = jax.jit(jax.vmap(env.reset))
    step_fn = jax.jit(jax.vmap(env.step))
    sample_fn = jax.jit(jax.vmap(lambda k: _spaces.sample(act_space, k)))

    s0 = reset_fn(jax.random.split(reset_key, n_envs))
    _check_state(s0, n_envs, obs_space, "reset")

    rewards, dones, truncs = [], [], []
    state = s0
    for t in range(n_steps):
        act_key, k = jax.random.split(act_key)
        action = sample_fn(jax.random.split(k, n_envs))
        try:
            nxt = step_fn(state, action)
        except (TypeError, ValueError) as e:
            fail(f"step failed on a state returned by {'reset' if t == 0 else 'step'}: {type(e).__name__}: {e}")
        if not isinstance(nxt, EnvState):
            fail(f"step must return an EnvState, got {type(nxt).__name__}")
        compare_structure("state", s0, nxt)
        _check_state(nxt, n_envs, obs_space, "step")
        if check_keys and t == 0:
            in_data = getattr(env.unwrapped, "check_keys_in_data", True)
            before, after = _stored_keys(state, in_data), _stored_keys(nxt, in_data)
            for k, x in before.items():
                if k in after and np.array_equal(_key_bits(x), _key_bits(after[k])):
                    fail(
                        f"{k}: PRNG key stored in the state never changes after a step; split it "
                        "on every step (or pass check_keys=False if it is only used at reset)"
                    )
        rewards.append(np.asarray(jax.tree_util.tree_leaves(nxt.reward)[0]))
        dones.append(np.asarray(nxt.done))
        truncs.append(np.asarray(nxt.info["truncated"]))
        state = nxt

    # A second reset must also agree with step states (e.g. not depend on Python state).
    compare_structure("state", reset_fn(jax.random.split(key, n_envs)), state)
    return EnvCheckReport(
        n_envs=n_envs,
        n_steps=n_steps,
        reward=np.stack(rewards) if rewards else np.zeros((0, n_envs), np.float32),
        done=np.stack(dones) if dones else np.zeros((0, n_envs), np.float32),
        truncated=np.stack(truncs) if truncs else np.zeros((0, n_envs), np.float32),
        reset_state=s0,
        last_state=state,
    )


# --------------------------------------------------------------------------- check_replay_consistency


@dataclasses.dataclass
class ReplayReport:
    """Result of :func:`check_replay_consistency`.

    Attributes:
      max_abs_log_ratio: largest ``|log pi_replay - log pi_rollout|``.
      max_value_difference: largest ``|V_replay - V_rollout|``.
      passed: both within ``tolerance``.
      tolerance: the bound used.
      first_divergence: where the replay first departed from the rollout, as
        ``"step t, carry leaf <path> of module layers/1 (MyCell): ..."``
        (the module whose ``initialize_state`` made that carry leaf, by path
        in the network and class), or ``None``.
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


def check_replay_consistency(
    network,
    env,
    *,
    n_envs: int = 8,
    rollout_length: int = 32,
    n_minibatches: int = 2,
    seed: int = 0,
    tolerance: float = 1e-5,
    precision: str = "default",
    replay_unroll: int | None = None,
) -> ReplayReport:
    """Run one rollout, then replay it minibatch by minibatch without updating,
    and compare log-likelihoods and values.

    A module that follows the rules (per-env keys in the carry, no write in
    ``__call__`` that changes its output, samplers replaying the stored
    action) passes with errors around 1e-7; one that draws from a
    class-level RNG inside ``__call__`` raises
    :class:`~nnx_ppo.algorithms.functional.ReplayMismatchError` naming it (its
    path in the network and its class), with or without a carry; one whose
    carry the replay does not reproduce fails, and ``first_divergence`` names
    it.
    Writes that leave the output unchanged, such as a call counter, pass.
    Does not modify ``network``. Use an env with episodes shorter than
    ``rollout_length`` so that resets happen inside the rollout.
    ``precision`` is ``PPOConfig.precision``: rollout and replay at it;
    ``replay_unroll`` is ``PPOConfig.replay_unroll`` (None: the default of
    the backend, as the trainer replays).
    """
    found = diagnose_replay(network, env, n_envs=n_envs, rollout_length=rollout_length,
                            n_minibatches=n_minibatches, seed=seed, tolerance=tolerance, precision=precision,
                            replay_unroll=replay_unroll)
    passed = found.within(tolerance)
    divergence = found.first_divergence
    if not passed and divergence is None:
        divergence = "outputs differ but every carry matches: a module's output depends on state outside its carry"
    return ReplayReport(
        max_abs_log_ratio=found.max_abs_log_ratio,
        max_value_difference=found.max_value_difference,
        passed=passed,
        tolerance=tolerance,
        first_divergence=divergence,
        n_resets=found.n_resets,
    )
