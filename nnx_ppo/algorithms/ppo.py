"""PPO training: one compiled program per call, any stateful network.

Reading order: :func:`train_iteration` (rollout -> advantages -> epochs of
minibatch replay and updates -> statistics; pure, traced once), then
:func:`make_train_fn` (several iterations in one compiled call), then
:func:`train_ppo` (builds the state and hands the compiled function to the
:class:`~nnx_ppo.algorithms.driver.Driver` loop, whose hooks evaluate, log,
checkpoint and stop).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec
from flax import errors as flax_errors
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, check_seed_batching
from nnx_ppo.algorithms.driver import (
    Driver,
    Health,
    Hooks,
    IterationOutput,
    NonFiniteError,
    ReplayMismatchError,
    rule_breaking_module_error,
)
from nnx_ppo.algorithms.evaluation import evaluate, make_eval_fn
from nnx_ppo.algorithms.functional import NetworkFn, copy_leaf, donatable
from nnx_ppo.algorithms.gae import trajectory_gae
from nnx_ppo.algorithms.network_checks import check_network_matches_env
from nnx_ppo.algorithms.losses import Minibatch, ppo_loss, split_minibatches
from nnx_ppo.algorithms.reward_scaling import (
    ReturnStatistics,
    initial_return_statistics,
    scale_rewards,
    update_return_statistics,
)
from nnx_ppo.algorithms.rollout import RolloutState, all_finite, collect_rollout, episode_metrics, sum_leaves
from nnx_ppo.algorithms.state import TrainingState, TrainResult
from nnx_ppo.algorithms.sharding import SEED_AXIS, local_devices, place
from nnx_ppo.envs.registry import as_env

__all__ = [
    "TrainingState",
    "TrainResult",
    "NonFiniteError",
    "ReplayMismatchError",
    "make_optimizer",
    "new_training_state",
    "train_iteration",
    "make_train_fn",
    "compile_iterations",
    "over_seeds",
    "update_epochs",
    "run_training",
    "resume_state",
    "checkpoint_hook",
    "evaluate",
    "train_ppo",
]


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Adam (AdamW with ``weight_decay``), optional global-norm clipping and
    linear learning-rate decay to zero over ``total_steps``.

    A ``config.learning_rate`` schedule (a callable, e.g. from
    ``optax.schedules``) is passed to optax as it is: it is called with the
    optimizer's update count, which advances once per minibatch update, so a
    training run makes ``n_iterations * n_epochs * n_minibatches`` updates
    (the count is part of the optimizer state: a resumed run continues it,
    and each seed of :func:`~nnx_ppo.algorithms.seeds.train_seeds` has its
    own)."""
    lr: Any = config.learning_rate
    if config.learning_rate_decay:
        updates_per_iteration = config.n_epochs * config.n_minibatches
        lr = optax.linear_schedule(config.learning_rate, 0.0, config.n_iterations * updates_per_iteration)
    adam = optax.adamw(lr, weight_decay=config.weight_decay) if config.weight_decay else optax.adam(lr)
    if config.gradient_clipping is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.gradient_clipping), adam)


def new_training_state(env, network, config: TrainConfig) -> TrainingState:
    """Initial training state: resets ``config.ppo.n_envs`` envs (and
    de-synchronizes their time limits where the env asks for it, see
    :meth:`nnx_ppo.envs.TimeLimit.desynchronize`), initializes the network
    carry and the optimizer. Works on copies: ``network`` is not modified,
    and training never donates its arrays."""
    ppo = config.ppo
    env = as_env(env)
    check_network_matches_env(env, network, ppo)
    key = jax.random.key(config.seed)
    key, reset_key, sync_key = jax.random.split(key, 3)

    def initial_envs(reset_key, sync_key):
        states = jax.vmap(env.reset)(jax.random.split(reset_key, ppo.n_envs))
        if hasattr(env, "desynchronize"):
            states = jax.vmap(env.desynchronize)(states, jax.random.split(sync_key, ppo.n_envs))
        return states

    env_state = jax.jit(initial_envs)(reset_key, sync_key)
    net = jax.tree.map(copy_leaf, NetworkFn.of(network))
    carry, net = net.initialize(ppo.n_envs)  # may draw from the copy's Rngs
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
        opt_state=make_optimizer(ppo).init(net.params),
        rollout=rollout,
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        return_stats=initial_return_statistics(ppo.n_envs),
    )


def update_epochs(network: NetworkFn, optimizer: optax.GradientTransformation, opt_state: Any,
                  data: Any, key: jax.Array, config: PPOConfig,
                  loss_fn: Callable | None = None) -> tuple[NetworkFn, Any, dict]:
    """``n_epochs`` passes of ``n_minibatches`` gradient steps (nested scans).

    ``data`` leaves are ``[T, B, ...]`` (a :class:`Minibatch` for PPO); each
    epoch permutes the env axis and splits it into
    ``[n_minibatches, T, B / n_minibatches, ...]``. ``loss_fn(params,
    network, minibatch) -> (loss, metrics)`` defaults to :func:`ppo_loss`
    with ``config`` (distillation passes its own). Returns the network with
    new ``params``, the optimizer state and the mean metrics (``replay/...``
    metrics: those of the first minibatch, before any update).
    """
    if loss_fn is None:
        loss_fn = lambda params, net, batch: ppo_loss(params, net, batch, config)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def minibatch_step(carry, batch):
        params, opt_state = carry
        (_, metrics), grads = grad_fn(params, network, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["optimizer/grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def epoch(carry, epoch_key):
        batches = split_minibatches(epoch_key, data, config.n_minibatches, config.shuffle_blocks)
        return jax.lax.scan(minibatch_step, carry, batches)

    keys = jax.random.split(key, config.n_epochs)
    (params, opt_state), metrics = jax.lax.scan(epoch, (network.params, opt_state), keys)
    # replay/*: measured on the first minibatch, before any update (must be ~0).
    metrics = {k: v[0, 0] if k.startswith("replay/") else jnp.mean(v) for k, v in metrics.items()}
    return network.with_state(params=params), opt_state, metrics


def _explained_variance(values, returns):
    values, returns = sum_leaves(values), sum_leaves(returns)
    return 1.0 - jnp.var(returns - values) / (jnp.var(returns) + 1e-8)


def _normalized_rewards(traj, stats: ReturnStatistics, config: PPOConfig):
    """With ``config.normalize_rewards``: fold the rollout into the return
    statistics and scale its rewards; otherwise both unchanged."""
    if not config.normalize_rewards:
        return traj, stats
    done = jnp.maximum(traj.terminated, traj.truncated)
    stats = update_return_statistics(stats, sum_leaves(traj.rewards), done, config.discounting_factor)
    return dataclasses.replace(traj, rewards=scale_rewards(traj.rewards, stats)), stats


def train_iteration(env, graphdef, optimizer: optax.GradientTransformation, config: PPOConfig,
                    state: TrainingState) -> tuple[TrainingState, IterationOutput]:
    """One PPO iteration (pure; traced inside :func:`make_train_fn`).

    1. rollout ``[T, B]`` from the carried env states and network carries;
    2. GAE advantages and value targets ``[T, B]`` (rewards optionally scaled);
    3. ``n_epochs x n_minibatches`` replays of whole env sequences and updates;
    4. ``update_statistics`` with the rollout's ``[T, B, ...]`` extras.

    Returns the next state and the iteration's :class:`IterationOutput`.
    """
    key, rollout_key, epoch_key = jax.random.split(state.key, 3)
    network = NetworkFn(graphdef, state.params, state.rest)
    rollout = collect_rollout(env, network, state.rollout, rollout_key, config.rollout_length,
                              config.bootstrap_on_truncation)
    traj, stats = rollout.trajectory, rollout.stats
    reward_mean = jnp.mean(sum_leaves(traj.rewards))  # in the env's units
    traj, return_stats = _normalized_rewards(traj, state.return_stats, config)
    advantages, returns = trajectory_gae(traj, traj.values, rollout.last_values, config)
    data = Minibatch(trajectory=traj, advantages=advantages, returns=returns,
                     last_values=jax.tree.map(lambda v: v[None], rollout.last_values))
    network, opt_state, loss_metrics = update_epochs(rollout.network, optimizer, state.opt_state, data,
                                                     epoch_key, config)
    network = network.update_statistics(traj.extras)

    metrics = {
        **loss_metrics,
        **rollout.metrics,
        "value/explained_variance": _explained_variance(traj.values, returns),
        "train/reward_mean": reward_mean,
        **episode_metrics(stats),
    }
    if config.normalize_rewards:
        metrics["train/return_std"] = jnp.sqrt(return_stats.var)
    replay_error = jnp.maximum(loss_metrics["replay/max_abs_log_ratio"], loss_metrics["replay/max_value_difference"])
    health = Health(finite_obs=stats.finite_obs, finite_reward=stats.finite_reward,
                    finite_loss=jnp.isfinite(loss_metrics["loss/total"]), replay_error=replay_error,
                    replay_ok=replay_error <= config.replay_tolerance if config.replay_tolerance is not None
                    else jnp.asarray(True))
    next_state = TrainingState(
        params=network.params, rest=network.rest, opt_state=opt_state, rollout=rollout.state, key=key,
        iteration=state.iteration + 1, return_stats=return_stats,
    )
    return next_state, IterationOutput(health=health, metrics=metrics)


def make_train_fn(env, graphdef, config: PPOConfig, max_iterations: int, batched_seeds: bool = False,
                  shardings: Any = None, seed_batching: str = "vmap") -> Callable:
    """Compile up to ``max_iterations`` iterations into one program:
    ``fn(state, n) -> (state, IterationOutput)`` runs ``n <= max_iterations``
    iterations (``n`` is a runtime value, so a shorter last call does not
    recompile); output leaves are ``[max_iterations]``, rows ``>= n`` unused.
    With ``batched_seeds`` every state leaf has a leading seed axis ``[S, ...]``
    and the iteration runs over it (outputs ``[max_iterations, S]``), as
    ``seed_batching`` says (see :func:`over_seeds`).
    With ``shardings`` (see :func:`nnx_ppo.algorithms.sharding.state_shardings`)
    the state keeps that sharding in and out, and the outputs are replicated.
    The input state's buffers are donated."""
    optimizer = make_optimizer(config)
    return compile_iterations(lambda s: train_iteration(env, graphdef, optimizer, config, s), max_iterations,
                              batched_seeds, shardings, seed_batching)


def over_seeds(iteration: Callable, seed_batching: str = "vmap", shardings: Any = None) -> Callable:
    """``iteration`` for a state whose leaves have a leading seed axis ``[S, ...]``.

    ``"vmap"``: every operation batched over the seeds. ``"map"``: the seeds
    one after another (``jax.lax.map``), each seed's operations at their own
    size; when ``shardings`` split the seed axis over devices
    (:func:`~nnx_ppo.algorithms.sharding.seed_shardings`), each device runs
    its own seeds in turn (``jax.shard_map``), all devices at once.
    """
    check_seed_batching(seed_batching)
    if seed_batching == "vmap":
        return jax.vmap(iteration)
    in_turn = lambda state: jax.lax.map(iteration, state)
    mesh = None if shardings is None else jax.tree.leaves(shardings)[0].mesh
    if mesh is None or SEED_AXIS not in mesh.axis_names:
        return in_turn  # one device, or every seed's envs split: XLA partitions each seed's step
    by_seed = PartitionSpec(SEED_AXIS)
    # Nothing crosses devices: each device's seeds are independent trainings.
    return jax.shard_map(in_turn, mesh=mesh, in_specs=by_seed, out_specs=by_seed, check_vma=False)


def compile_iterations(iteration: Callable, max_iterations: int, batched_seeds: bool = False,
                       shardings: Any = None, seed_batching: str = "vmap") -> Callable:
    """Jit ``iteration(state) -> (state, IterationOutput)`` into
    ``fn(state, n)`` running ``n <= max_iterations`` iterations in one call
    (see :func:`make_train_fn`, which also describes ``batched_seeds``,
    ``shardings`` and ``seed_batching``). Any trainer with the
    :class:`TrainingState` shape uses it."""
    if batched_seeds:
        iteration = over_seeds(iteration, seed_batching, shardings)

    if max_iterations == 1:
        def run(state, n):
            del n
            state, output = iteration(state)
            return state, jax.tree.map(lambda m: m[None], output)
    else:
        def run(state, n):
            shapes = jax.eval_shape(iteration, state)[1]
            buffer = jax.tree.map(lambda m: jnp.zeros((max_iterations,) + m.shape, m.dtype), shapes)

            def body(i, carry):
                state, buffer = carry
                state, output = iteration(state)
                buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, output)
                return state, buffer

            return jax.lax.fori_loop(0, n, body, (state, buffer))

    if shardings is None:
        return jax.jit(run, donate_argnums=0)
    replicated = NamedSharding(jax.tree.leaves(shardings)[0].mesh, PartitionSpec())
    return jax.jit(run, donate_argnums=0, in_shardings=(shardings, replicated), out_shardings=(shardings, replicated))


def resume_state(resume_from: str, checkpoint_dir: str | None, state: TrainingState, ppo: PPOConfig) -> TrainingState:
    """Restore ``state`` from ``resume_from``; warn when the directory also
    holds checkpoints later than the one resumed from. A change of ``n_envs``
    or ``rollout_length`` (the size of an iteration) is refused before
    anything is read or written."""
    from nnx_ppo.algorithms import checkpointing

    # Only the sizes are compared: a placeholder rate lets a config saved with a schedule (not saved) load.
    saved = checkpointing.load_config(resume_from, learning_rate=1.0).ppo
    for name in ("n_envs", "rollout_length"):
        if getattr(saved, name) != getattr(ppo, name):
            raise ValueError(
                f"cannot resume with PPOConfig.{name}={getattr(ppo, name)}: the checkpoint in {str(resume_from)!r} "
                f"was trained with {name}={getattr(saved, name)} (its iteration count is in iterations of "
                f"{saved.steps_per_iteration} env steps); keep {name}, or start a new run from its network"
            )
    state = checkpointing.restore_training_state(resume_from, state)
    steps = int(jnp.max(state.iteration)) * ppo.steps_per_iteration  # (a seed batch has one per seed)
    newer = [s for s, _ in checkpointing.list_checkpoints(checkpoint_dir or resume_from) if s > steps]
    if newer:
        warnings.warn(
            f"resumed from step {steps}, but the checkpoint directory also holds later checkpoints "
            f"(steps {newer}) from the run being branched off; latest_checkpoint() will pick those until "
            "newer ones are written. Remove them, or checkpoint this branch into another directory.",
            stacklevel=3,
        )
    return state


def _eval_hook(config: TrainConfig, network, eval_env,
               on_evaluation: Callable[[NetworkFn, int], None] | None = None,
               ) -> Callable[[TrainingState, int], dict[str, float]]:
    """Evaluation of the training state in ``network``'s eval mode; then
    ``on_evaluation(policy, env_steps)`` with the evaluated policy's view."""
    eval_graphdef = NetworkFn.of(network, config.eval.deterministic).graphdef
    eval_fn = make_eval_fn(eval_env, config.eval.n_envs, config.eval.max_episode_length)

    def evaluate_state(state: TrainingState, steps: int) -> dict[str, float]:
        key = jax.random.fold_in(jax.random.key(config.seed + 1), steps)
        policy = NetworkFn(eval_graphdef, state.params, state.rest)
        metrics = {k: float(v) for k, v in eval_fn(policy, key).items()}
        if on_evaluation is not None:
            on_evaluation(policy, steps)
        return metrics

    return evaluate_state


def checkpoint_hook(config: TrainConfig, directory: str, metadata: dict | None) -> Callable[[TrainingState, int], None]:
    """Save the whole training state into ``directory``."""

    def save(state: TrainingState, steps: int) -> None:
        from nnx_ppo.algorithms import checkpointing

        checkpointing.save_training_state(directory, state, config, step=steps, keep=config.keep_checkpoints,
                                          metadata=metadata)

    return save


def train_ppo(
    env,
    network,
    config: TrainConfig,
    *,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
    eval_env=None,
    state: TrainingState | None = None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    checkpoint_metadata: dict | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
) -> TrainResult:
    """Train ``network`` on ``env`` with PPO; the network is updated in place.

    Args:
      env: an env with the ``reset(key)`` / ``step(state, action)`` API
        (see :mod:`nnx_ppo.envs`).
      network: a :class:`StatefulModule` whose output is a
        :class:`PPONetworkOutput` (e.g. from :mod:`nnx_ppo.networks.factories`).
      config: the :class:`TrainConfig`.
      log_fn: called as ``log_fn(metrics, env_steps)`` after every iteration
        and every evaluation, with flat ``/``-joined keys.
      eval_env: env for evaluation (default ``env``).
      state: continue from this training state instead of a fresh one.
      checkpoint_dir: save the whole training state here every
        ``config.checkpoint_every_steps`` env steps (keeping the last
        ``config.keep_checkpoints``) and at the end.
      resume_from: a checkpoint directory (or one checkpoint in it) to
        continue from; the latest complete checkpoint is used.
      checkpoint_metadata: JSON-serializable data saved with each checkpoint
        (e.g. how to rebuild the network for inference).
      should_stop: polled between compiled calls; returning True ends
        training early (the state so far is saved and returned).
      on_evaluation: called after every evaluation as
        ``on_evaluation(policy, env_steps)`` with the evaluated policy (a
        :class:`NetworkFn` in eval mode), e.g. to record a video of it.

    Raises:
      NonFiniteError: NaN/inf in rewards, observations or the loss, at the
        iteration where it happened; the network then holds the last finite
        parameters (from before the compiled call that failed).
    """
    env = as_env(env)
    if state is None:
        state = new_training_state(env, network, config)
    graphdef = NetworkFn.of(network, deterministic=False).graphdef  # training samples actions
    return run_training(
        lambda ppo, shardings: make_train_fn(env, graphdef, ppo, config.iterations_per_call, shardings=shardings),
        env, network, config, state, log_fn=log_fn, eval_env=eval_env, checkpoint_dir=checkpoint_dir,
        resume_from=resume_from, checkpoint_metadata=checkpoint_metadata, should_stop=should_stop,
        on_evaluation=on_evaluation,
    )


def run_training(
    make_fn: Callable[[PPOConfig, Any], Callable],
    env,
    network,
    config: TrainConfig,
    state: TrainingState,
    *,
    log_fn: Callable[[dict[str, float], int], None] | None = None,
    eval_env=None,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
    checkpoint_metadata: dict | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
) -> TrainResult:
    """Run a compiled iteration from ``state`` to ``config.ppo.total_steps``
    in the :class:`~nnx_ppo.algorithms.driver.Driver` loop; ``network`` gets
    the trained parameters. Shared by PPO and distillation.

    ``make_fn(ppo, shardings)`` compiles the trainer's
    ``fn(state, n) -> (state, IterationOutput)`` for the (possibly
    per-device) :class:`PPOConfig` and state shardings (None on one device).
    The other arguments are :func:`train_ppo`'s: evaluation (of ``network``
    in eval mode, on ``eval_env`` or ``env``), checkpoints, resume, stop,
    the evaluation callback.
    """
    ppo = config.ppo
    env = as_env(env)
    eval_env = None if eval_env is None else as_env(eval_env)
    if resume_from is not None:
        state = resume_state(resume_from, checkpoint_dir, state, ppo)
    state = donatable(state)
    state, ppo, shardings, _ = place(state, ppo, local_devices(config.n_devices, ppo.n_envs))
    driver = Driver(
        make_fn(ppo, shardings), state,
        start_iteration=int(state.iteration), total_iterations=ppo.n_iterations,
        iterations_per_call=config.iterations_per_call, steps_per_iteration=ppo.steps_per_iteration,
        hooks=Hooks(
            log=log_fn,
            evaluate=_eval_hook(config, network, env if eval_env is None else eval_env, on_evaluation)
            if config.eval.enabled else None,
            eval_every_steps=config.eval.every_steps,
            checkpoint=checkpoint_hook(config, checkpoint_dir, checkpoint_metadata) if checkpoint_dir else None,
            checkpoint_every_steps=config.checkpoint_every_steps,
            should_stop=should_stop,
            snapshot=lambda state: jax.tree.map(copy_leaf, (state.params, state.rest)),
        ),
    )
    try:
        result = driver.run()
    except flax_errors.TraceContextError as err:
        raise rule_breaking_module_error(err) from None
    except NonFiniteError as err:
        # The network gets the last finite parameters, not the NaNs.
        nnx.update(network, *driver.last_finite)
        steps = driver.last_finite_iteration * ppo.steps_per_iteration
        raise NonFiniteError(f"{err}. The network holds the last finite parameters and statistics, from "
                             f"iteration {driver.last_finite_iteration} ({steps} env steps)") from None
    finally:
        # Otherwise the network gets (copies of) the latest state, also when
        # training stops with another exception; the state stays donatable.
        latest = (driver.state.params, driver.state.rest)
        if not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(latest)) and (
                bool(all_finite(latest))):
            nnx.update(network, *jax.tree.map(copy_leaf, latest))
    return TrainResult(
        state=result.state,
        metrics=result.metrics,
        eval_history=result.eval_history,
        total_steps=result.iterations * ppo.steps_per_iteration,
        total_iterations=result.iterations,
        compile_seconds=result.compile_seconds,
    )
