"""Many seeds in one compiled program.

:func:`train_seeds` builds one network and one training state per seed,
stacks the states on a leading seed axis ``[S, ...]`` (parameters, optimizer
state, env states, carries, keys) and runs the PPO iteration over it, vmapped
or one seed after another (``TrainConfig.seed_batching``, see
:func:`~nnx_ppo.algorithms.ppo.over_seeds`), through the same compiled
iteration and :class:`~nnx_ppo.algorithms.driver.Driver` loop as
:func:`~nnx_ppo.algorithms.ppo.train_ppo`. One compile serves every seed. On
several devices the batch is sharded like one seed's training (by env), or by
seed (``TrainConfig.shard_seeds``), see :mod:`nnx_ppo.algorithms.sharding`;
with both, each device runs its own seeds, which is how several CPU devices
(one per core) train many seeds fastest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo.algorithms.driver import Driver, Hooks
from nnx_ppo.algorithms.evaluation import episode_metrics, run_episodes
from nnx_ppo.algorithms.functional import NetworkFn, copy_leaf, donatable
from nnx_ppo.algorithms.ppo import TrainResult, checkpoint_hook, make_train_fn, new_training_state, resume_state
from nnx_ppo.algorithms.sharding import local_devices, place, replicated
from nnx_ppo.envs.registry import as_env

__all__ = ["train_seeds", "stack_trees", "seed_slice"]


def stack_trees(trees: Sequence[Any]) -> Any:
    """Stack equally shaped pytrees on a new leading axis (PRNG keys included)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def seed_slice(tree: Any, index: int) -> Any:
    """The ``index``-th entry of every leaf's leading (seed) axis."""
    return jax.tree.map(lambda x: x[index], tree)


def _per_seed(row: dict[str, Any], index: int) -> dict[str, float]:
    return {k: float(v[index]) if np.ndim(v) else float(v) for k, v in row.items()}


def _eval_hook(config: TrainConfig, network, eval_env, seeds: list[int], mesh=None) -> Callable[[Any, int], dict]:
    """Every seed evaluated in ``network``'s eval mode, vmapped; a seed's key
    is the one :func:`train_ppo` uses for that seed. With a ``mesh`` the
    per-seed metrics come back replicated (readable by every process)."""
    graphdef = NetworkFn.of(network, config.eval.deterministic).graphdef
    ev = config.eval

    def evaluate_all(params, rest, keys):
        one = lambda p, r, k: episode_metrics(run_episodes(eval_env, NetworkFn(graphdef, p, r), k, ev.n_envs,
                                                           ev.max_episode_length))
        return jax.vmap(one)(params, rest, keys)

    evaluate = jax.jit(evaluate_all) if mesh is None else jax.jit(
        evaluate_all, out_shardings=NamedSharding(mesh, PartitionSpec()))

    def hook(state, steps: int) -> dict[str, np.ndarray]:
        keys = jnp.stack([jax.random.fold_in(jax.random.key(s + 1), steps) for s in seeds])
        return {k: np.asarray(v, np.float64) for k, v in evaluate(state.params, state.rest, keys).items()}

    return hook


def train_seeds(
    env,
    make_network: Callable[[nnx.Rngs], Any],
    config: TrainConfig,
    seeds: Sequence[int],
    *,
    log_fn: Callable[[dict[str, float], int, int], None] | None = None,
    eval_env=None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    checkpoint_metadata: dict | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[TrainResult]:
    """Train one network per seed, all seeds in one compiled program.

    Like :func:`train_ppo`, it runs on ``config.n_devices`` local devices
    (None: all): by default every seed's envs are split over the devices
    (``n_envs`` divisible by their number); with ``config.shard_seeds`` the
    seeds are (their number divisible by the devices'), so that each device
    trains whole seeds.

    Args:
      env: the training env.
      make_network: ``make_network(nnx.Rngs(seed))`` builds one seed's network;
        every seed must get the same architecture.
      config: the :class:`TrainConfig`; its ``seed`` is replaced by each seed.
      seeds: the seeds (at least one).
      log_fn: called as ``log_fn(metrics, env_steps, seed)`` for every
        iteration and evaluation of every seed.
      eval_env: env for evaluation (default ``env``).
      checkpoint_dir: save the whole seed batch here (one checkpoint holds
        every seed's state on a leading axis ``[S, ...]``; its metadata lists
        the ``"seeds"``) every ``config.checkpoint_every_steps`` and at the end.
      resume_from: continue the seed batch from this checkpoint directory
        (the same seeds, in the same order; exact, as for one seed).
      checkpoint_metadata: JSON-serializable data saved with each checkpoint.
      should_stop: polled between compiled calls; True ends training early.

    A seed's network loads from such a checkpoint with
    ``checkpointing.load_network(directory, network, seed=s)``.

    Returns one :class:`TrainResult` per seed, in order; the result for seed
    ``s`` matches ``train_ppo(env, make_network(nnx.Rngs(s)),
    dataclasses.replace(config, seed=s))`` up to float rounding (vmapped
    matrix products may round differently). The networks built by
    ``make_network`` are trained in place but not returned; take a seed's
    parameters from its result's ``state``.
    """
    env = as_env(env)
    eval_env = None if eval_env is None else as_env(eval_env)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("train_seeds: seeds must name at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"train_seeds: seeds must be distinct, got {seeds}")
    devices = local_devices(config.n_devices, config.ppo.n_envs, len(seeds) if config.shard_seeds else None)
    networks = [make_network(nnx.Rngs(s)) for s in seeds]
    graphdef = NetworkFn.of(networks[0], deterministic=False).graphdef
    for s, net in zip(seeds[1:], networks[1:]):
        if NetworkFn.of(net, deterministic=False).graphdef != graphdef:
            raise ValueError(f"train_seeds: make_network(nnx.Rngs({s})) built a network whose structure differs "
                             f"from seed {seeds[0]}'s; every seed must build the same architecture")
    states = [new_training_state(env, net, dataclasses.replace(config, seed=s)) for s, net in zip(seeds, networks)]
    ppo = config.ppo
    state = stack_trees(states)
    metadata = {**(checkpoint_metadata or {}), "seeds": seeds}
    if resume_from is not None:
        from nnx_ppo.algorithms import checkpointing

        saved = (checkpointing.load_metadata(resume_from) or {}).get("seeds")
        if saved != seeds:
            raise ValueError(f"train_seeds: cannot resume seeds {seeds} from {str(resume_from)!r}, which holds "
                             f"{'seeds ' + str(saved) if saved else 'a single-seed run'}; resume with its seeds")
        state = resume_state(resume_from, checkpoint_dir, state, ppo)
    state = donatable(state)
    start_iteration = int(np.max(np.asarray(state.iteration)))  # read before the state spans other processes
    state, ppo, shardings, mesh = place(state, ppo, devices, seed_batch=True, by_seed=config.shard_seeds)

    def log(row: dict[str, Any], steps: int) -> None:
        for i, s in enumerate(seeds):
            log_fn(_per_seed(row, i), steps, s)

    driver = Driver(
        make_train_fn(env, graphdef, ppo, config.iterations_per_call, batched_seeds=True, shardings=shardings,
                      seed_batching=config.seed_batching),
        state,
        start_iteration=start_iteration, total_iterations=ppo.n_iterations,
        iterations_per_call=config.iterations_per_call, steps_per_iteration=ppo.steps_per_iteration,
        hooks=Hooks(log=log if log_fn is not None else None,
                    evaluate=_eval_hook(config, networks[0], env if eval_env is None else eval_env, seeds, mesh)
                    if config.eval.enabled else None,
                    eval_every_steps=config.eval.every_steps,
                    checkpoint=checkpoint_hook(config, checkpoint_dir, metadata) if checkpoint_dir else None,
                    checkpoint_every_steps=config.checkpoint_every_steps,
                    should_stop=should_stop),
    )
    try:
        result = driver.run()
    finally:
        latest = (driver.state.params, driver.state.rest)
        if not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(latest)):
            latest = replicated(latest, mesh)
            for i, net in enumerate(networks):
                nnx.update(net, *jax.tree.map(copy_leaf, seed_slice(latest, i)))
    final = replicated(result.state, mesh)
    return [
        TrainResult(
            state=seed_slice(final, i),
            metrics=_per_seed(result.metrics, i),
            eval_history=[(steps, _per_seed(row, i)) for steps, row in result.eval_history],
            total_steps=result.iterations * ppo.steps_per_iteration,
            total_iterations=result.iterations,
            compile_seconds=result.compile_seconds,
        )
        for i in range(len(seeds))
    ]
