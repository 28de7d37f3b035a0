"""Running a policy for whole episodes: evaluation and recording.

One stepper, :func:`run_episodes`, serves both the periodic evaluation in
training (:func:`make_eval_fn`, :func:`evaluate`) and video recording (with
``record_states``): a compiled scan over steps, one episode per env. Its two
pieces, :func:`start_episodes` and :func:`policy_step`, are shared with
activation recording (:mod:`nnx_ppo.algorithms.recording`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.ppo import sum_leaves
from nnx_ppo.networks.types import StatefulModuleOutput

__all__ = [
    "Episodes",
    "start_episodes",
    "policy_step",
    "run_episodes",
    "make_eval_fn",
    "evaluate",
    "episode_metrics",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class Episodes:
    """What :func:`run_episodes` returns.

    Attributes:
      returns: ``[N]`` return of each env's first episode (summed reward keys).
      lengths: ``[N]`` its length in steps (``max_steps`` if it did not end).
      states: with ``record_states``, the env states ``[max_steps + 1, N, ...]``
        (the reset state first); ``None`` otherwise.
    """

    returns: jax.Array
    lengths: jax.Array
    states: Any = None


def start_episodes(env, network: NetworkFn, key: jax.Array, n_envs: int) -> tuple[Any, Any, NetworkFn]:
    """Reset ``n_envs`` envs (one key each, split from ``key``) and build the
    network's fresh carry (traceable).

    Returns ``(env_state, carry, network)``: env states and carry with leaves
    ``[n_envs, ...]``, and the network view after ``initialize``.
    """
    carry, network = network.initialize(n_envs)
    env_state = jax.vmap(env.reset)(jax.random.split(key, n_envs))
    return env_state, carry, network


def policy_step(env, network: NetworkFn, env_state: Any, carry: Any) -> tuple[StatefulModuleOutput, Any, NetworkFn]:
    """One step of acting (traceable): the network acts on ``env_state.obs``
    and every env steps with its action. Ended envs are not reset here.

    Returns ``(out, stepped, network)``: the network's output
    (``out.output`` a :class:`~nnx_ppo.networks.types.PPONetworkOutput`,
    ``out.next_state`` the carry after the step), the stepped env states
    ``[B, ...]`` and the network view after ``apply``.
    """
    out, network = network.apply(carry, env_state.obs)
    stepped = jax.vmap(env.step)(env_state, out.output.actions)
    return out, stepped, network


def run_episodes(env, network: NetworkFn, key: jax.Array, n_envs: int, max_steps: int,
                 record_states: bool = False) -> Episodes:
    """Reset ``n_envs`` envs and step them with ``network`` for ``max_steps``
    steps (traceable; jit it). Each env's first episode is measured; steps
    after it ended are not counted (an ended env may hold NaN)."""
    env_state, carry, network = start_episodes(env, network, key, n_envs)

    def step(c, _):
        network, env_state, carry, ret, length, alive = c
        out, env_state, network = policy_step(env, network, env_state, carry)
        ret = ret + jnp.where(alive > 0, sum_leaves(env_state.reward), 0.0)
        length = length + alive
        alive = alive * (1.0 - (env_state.done > 0))
        return (network, env_state, out.next_state, ret, length, alive), (env_state if record_states else None)

    zeros = jnp.zeros((n_envs,), jnp.float32)
    init = (network, env_state, carry, zeros, zeros, jnp.ones((n_envs,), jnp.float32))
    (_, _, _, ret, length, _), states = jax.lax.scan(step, init, None, length=max_steps)
    if record_states:
        states = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), env_state, states)
    return Episodes(returns=ret, lengths=length, states=states)


def episode_metrics(episodes: Episodes) -> dict[str, jax.Array]:
    """``eval/episode_return`` (mean), its std/min/max and ``eval/episode_length``."""
    ret = episodes.returns
    return {
        "eval/episode_return": jnp.mean(ret),
        "eval/episode_return_std": jnp.std(ret),
        "eval/episode_return_min": jnp.min(ret),
        "eval/episode_return_max": jnp.max(ret),
        "eval/episode_length": jnp.mean(episodes.lengths),
    }


def make_eval_fn(env, n_envs: int, max_episode_length: int) -> Callable[[NetworkFn, jax.Array], dict]:
    """Compiled ``fn(network, key) -> metrics`` (see :func:`episode_metrics`):
    one episode per env, up to ``max_episode_length`` steps."""
    return jax.jit(lambda network, key: episode_metrics(run_episodes(env, network, key, n_envs, max_episode_length)))


def evaluate(env, network, *, n_envs: int = 16, max_episode_length: int = 1000, seed: int = 0,
             deterministic: bool = True) -> dict[str, float]:
    """Run ``n_envs`` episodes with ``network`` (an NNX module; mode/mean
    actions when ``deterministic``) and return return/length statistics."""
    fn = make_eval_fn(env, n_envs, max_episode_length)
    metrics = fn(NetworkFn.of(network, deterministic), jax.random.key(seed))
    return {k: float(v) for k, v in metrics.items()}
