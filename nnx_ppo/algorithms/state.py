"""What training carries from call to call (:class:`TrainingState`), how
PPO's starts (:func:`new_training_state`), and what a training run returns
(:class:`TrainResult`)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.driver import Failure
from nnx_ppo.algorithms.footprint import check_footprint
from nnx_ppo.algorithms.functional import NetworkFn, copy_tree
from nnx_ppo.algorithms.network_checks import check_network_matches_env
from nnx_ppo.algorithms.optimization import make_optimizer
from nnx_ppo.algorithms.reward_scaling import ReturnStatistics, initial_return_statistics
from nnx_ppo.algorithms.rollout import RolloutState
from nnx_ppo.envs.registry import as_env

__all__ = ["TrainingState", "TrainResult"]  # new_training_state: public as nnx_ppo.algorithms.ppo.new_training_state


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingState:
    """Everything that changes during training (a pytree; donated each call).

    Attributes:
      params: the network's ``nnx.Param`` state.
      rest: every other network variable (normalizer statistics, RNG streams).
      opt_state: optax state.
      rollout: env states, network carries and running episode statistics.
      key: the training PRNG key (env resets, minibatch shuffling).
      iteration: completed iterations (int32 scalar).
      return_stats: running discounted-return statistics (used with
        ``PPOConfig.normalize_rewards``).
      member: a population member's own hyperparameters, score and parent
        (a :class:`~nnx_ppo.algorithms.hyperparameters.MemberState`); None
        outside a population (one run, a seed batch: the config's numbers).
    """

    params: Any
    rest: Any
    opt_state: Any
    rollout: RolloutState
    key: jax.Array
    iteration: jax.Array
    return_stats: ReturnStatistics
    member: Any = None

    def next(self, *, network: Any, opt_state: Any, rollout: RolloutState, key: jax.Array,
             return_stats: ReturnStatistics | None = None) -> "TrainingState":
        """The state after one more iteration: ``network``'s (a
        :class:`~nnx_ppo.algorithms.functional.NetworkFn`) parameters and
        other variables, the new optimizer and rollout states and key, the
        iteration count plus one (``return_stats`` unchanged when None)."""
        return dataclasses.replace(
            self, params=network.params, rest=network.rest, opt_state=opt_state, rollout=rollout, key=key,
            iteration=self.iteration + 1,
            return_stats=self.return_stats if return_stats is None else return_stats,
        )


@dataclasses.dataclass
class TrainResult:
    """What :func:`~nnx_ppo.algorithms.ppo.train_ppo` returns (and
    :func:`~nnx_ppo.algorithms.population.train_seeds` per seed).

    Attributes:
      state: the final :class:`TrainingState` (the network was updated in
        place too); for a failed seed, the state of its last healthy iteration.
      metrics: metrics of the last iteration.
      eval_history: ``(env_steps, eval metrics)`` of every evaluation.
      total_steps: env steps trained (a failed seed's: up to its last healthy iteration).
      total_iterations: iterations run (likewise).
      compile_seconds: time of the first (compiling) call.
      failure: for a seed of a batch whose health failed (non-finite values or a
        replay mismatch), where and why (a :class:`~nnx_ppo.algorithms.driver.Failure`);
        None when it trained to the end.
      network: the trained network (the one given, updated in place; or the
        one the trainer built: a seed's from ``make_network``, or from a
        network named by a string).
    """

    state: TrainingState
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    total_steps: int
    total_iterations: int
    compile_seconds: float
    failure: Failure | None = None
    network: Any = None


def new_training_state(env, network, config: TrainConfig) -> TrainingState:
    """Initial training state: resets ``config.ppo.n_envs`` envs (and
    de-synchronizes their time limits where the env asks for it, see
    :meth:`nnx_ppo.envs.TimeLimit.desynchronize`), initializes the network
    carry and the optimizer. Works on copies: ``network`` is not modified,
    and training never donates its arrays."""
    ppo = config.ppo
    env = as_env(env)
    check_network_matches_env(env, network, ppo)
    check_footprint(env, network, ppo, warn=False)  # (before anything of n_envs' size is allocated)
    key = jax.random.key(config.seed)
    key, reset_key, sync_key = jax.random.split(key, 3)

    def initial_envs(reset_key, sync_key):
        states = jax.vmap(env.reset)(jax.random.split(reset_key, ppo.n_envs))
        if hasattr(env, "desynchronize"):
            states = jax.vmap(env.desynchronize)(states, jax.random.split(sync_key, ppo.n_envs))
        return states

    env_state = jax.jit(initial_envs)(reset_key, sync_key)
    net = copy_tree(NetworkFn.of(network))
    carry, net, opt_state, return_stats = _fresh_state(net, ppo)
    rollout = RolloutState(
        env_state=env_state,
        carry=carry,
        episode_return=jnp.zeros((ppo.n_envs,), jnp.float32),
        episode_length=jnp.zeros((ppo.n_envs,), jnp.int32),
        fresh=jnp.ones((ppo.n_envs,), bool),
    )
    return TrainingState(
        params=net.params,
        rest=net.rest,
        opt_state=opt_state,
        rollout=rollout,
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        return_stats=return_stats,
    )


def _fresh_state(net: NetworkFn, ppo: PPOConfig):
    """The network's initial carry ``[n_envs, ...]`` (it may draw from the
    network's Rngs: the view returned has them advanced), the optimizer's
    and the return statistics' initial states, in one compiled call
    (instead of a compile per array shape), compiled once per network
    structure and config where both can be hashed."""
    try:
        fresh = _fresh_program(net.graphdef, ppo)
    except TypeError:  # a graphdef or config that cannot be hashed: compiled for this call
        fresh = _fresh_program.__wrapped__(net.graphdef, ppo)
    return fresh(net.params, net.rest)


@functools.lru_cache(maxsize=16)
def _fresh_program(graphdef, ppo: PPOConfig):
    def fresh(params, rest):
        carry, net = NetworkFn(graphdef, params, rest).initialize(ppo.n_envs)
        return carry, net, make_optimizer(ppo).init(net.params), initial_return_statistics(ppo.n_envs)

    return jax.jit(fresh)
