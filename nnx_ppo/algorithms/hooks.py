"""The trainer's hooks: what runs between compiled calls besides logging.

:func:`evaluation_hook` evaluates the training state (every seed of a batch
at once), :func:`best_policy_hook` keeps the best evaluated policy of each
seed, :func:`checkpoint_hook` saves the whole training state. The
:class:`~nnx_ppo.algorithms.driver.Driver` calls them on its schedule
(:class:`~nnx_ppo.algorithms.driver.Hooks`).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo.algorithms.distributed import replicated
from nnx_ppo.algorithms.evaluation import episode_metrics, run_episodes
from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.ppo import TrainingState, seed_slice
from nnx_ppo.networks.feedforward import compute_precision

__all__ = ["evaluation_hook", "best_policy_hook", "checkpoint_hook"]


def evaluation_hook(config: TrainConfig, network, eval_env, seeds: list[int] | None, mesh,
                     on_evaluation: Callable[[NetworkFn, int], None] | None) -> Callable[[TrainingState, int], dict]:
    """Evaluation of the state in ``network``'s eval mode (every seed of a
    batch vmapped; metrics ``[S]`` then), a seed's key the same whether it
    trains alone or in a batch; then ``on_evaluation(policy, env_steps)``
    (one run only). With a ``mesh`` the metrics come back replicated
    (readable by every process)."""
    graphdef = NetworkFn.of(network, config.eval.deterministic).graphdef
    ev = config.eval

    def one(params, rest, key):
        policy = NetworkFn(graphdef, params, rest)
        with compute_precision(config.ppo.precision):
            return episode_metrics(run_episodes(eval_env, policy, key, ev.n_envs, ev.max_episode_length))

    out = {} if mesh is None else {"out_shardings": NamedSharding(mesh, PartitionSpec())}
    evaluate = jax.jit(one if seeds is None else jax.vmap(one), **out)

    def hook(state: TrainingState, steps: int) -> dict:
        if seeds is None:
            key = jax.random.fold_in(jax.random.key(config.seed + 1), steps)
            metrics = {k: float(v) for k, v in evaluate(state.params, state.rest, key).items()}
            if on_evaluation is not None:
                on_evaluation(NetworkFn(graphdef, state.params, state.rest), steps)
            return metrics
        keys = jnp.stack([jax.random.fold_in(jax.random.key(s + 1), steps) for s in seeds])
        return {k: np.asarray(v, np.float64) for k, v in evaluate(state.params, state.rest, keys).items()}

    return hook


def best_policy_hook(evaluate: Callable[[TrainingState, int], dict], config: TrainConfig, directory: str,
                      metadata: dict | None, seeds: list[int] | None, mesh,
                      failed: Callable[[], dict]) -> Callable[[TrainingState, int], dict]:
    """``evaluate``, then save each policy (each seed's of a batch, unless
    it failed) whose mean evaluation return is at least its best so far
    (also across a resume) as the best policy
    (:func:`~nnx_ppo.algorithms.checkpointing.best_policy_dir`): parameters
    and statistics only, with the evaluation in its metadata."""
    from nnx_ppo.algorithms import checkpointing

    paths = [checkpointing.best_policy_dir(directory, s) for s in (seeds or [None])]
    base = {k: v for k, v in (metadata or {}).items() if k != "seeds"}

    def saved_return(path) -> float:
        saved = (checkpointing.load_metadata(path) or {}) if checkpointing.latest_checkpoint(path) else {}
        return float(saved.get("eval", {}).get("eval/episode_return", -np.inf))

    best = [saved_return(path) for path in paths]

    def hook(state: TrainingState, steps: int) -> dict:
        metrics = evaluate(state, steps)
        returns = np.atleast_1d(metrics["eval/episode_return"])
        better = [i for i, r in enumerate(returns) if r >= best[i] and i not in failed()]
        variables = (state.params, state.rest) if seeds is None or not better else replicated(
            (state.params, state.rest), mesh)
        for i in better:
            params, rest = variables if seeds is None else seed_slice(variables, i)
            evaluation = {k: float(np.atleast_1d(v)[i]) for k, v in metrics.items()}
            checkpointing.save_policy(paths[i], params, rest, config, step=steps, metadata={
                **base, "eval": evaluation, **({} if seeds is None else {"seed": seeds[i]})})
            best[i] = float(returns[i])
        return metrics

    return hook


def checkpoint_hook(
    config: TrainConfig, directory: str, metadata: dict | None
) -> Callable[[TrainingState, int], None]:
    """Save the whole training state into ``directory`` (a ``RuntimeError``
    in one line if something replaced the directory during the run)."""

    def save(state: TrainingState, steps: int) -> None:
        import os

        from nnx_ppo.algorithms import checkpointing

        if os.path.exists(directory) and not os.path.isdir(directory):
            raise RuntimeError(f"cannot save the checkpoint at {steps} env steps: {directory} is no longer a directory "
                               "(something replaced it during the run); the metrics so far are kept")
        try:
            checkpointing.save_training_state(directory, state, config, step=steps, keep=config.keep_checkpoints,
                                              metadata=metadata)
        except (OSError, ValueError) as err:  # the disk, or the directory changed under the run (orbax's errors)
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise RuntimeError(f"cannot save the checkpoint at {steps} env steps into {directory}: {first}") from err

    return save
