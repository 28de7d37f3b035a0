"""PPO training: one compiled program per call, any stateful network.

Reading order: :func:`train_iteration` (rollout -> advantages -> epochs of
minibatch replay and updates -> statistics), then :func:`train_ppo` (the
Python loop that calls the compiled iterations, evaluates and logs).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.gae import trajectory_gae
from nnx_ppo.algorithms.losses import Minibatch, ppo_loss, split_minibatches
from nnx_ppo.algorithms.reward_scaling import (
    ReturnStatistics,
    initial_return_statistics,
    scale_rewards,
    update_return_statistics,
)
from nnx_ppo.envs.validation import check_actions, check_env_structure
from nnx_ppo.algorithms.rollout import RolloutState, apply_network, collect_rollout, sum_leaves

__all__ = [
    "TrainingState",
    "TrainResult",
    "NonFiniteError",
    "make_optimizer",
    "new_training_state",
    "train_iteration",
    "make_train_fn",
    "make_eval_fn",
    "split_in_mode",
    "evaluate",
    "train_ppo",
]


class NonFiniteError(FloatingPointError):
    """Raised when rewards, observations or the loss stop being finite."""


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
    """

    params: Any
    rest: Any
    opt_state: Any
    rollout: RolloutState
    key: jax.Array
    iteration: jax.Array
    return_stats: ReturnStatistics


@dataclasses.dataclass
class TrainResult:
    """What :func:`train_ppo` returns.

    Attributes:
      state: the final :class:`TrainingState` (the network was updated in place too).
      metrics: metrics of the last iteration.
      eval_history: ``(env_steps, eval metrics)`` of every evaluation.
      total_steps: env steps trained.
      total_iterations: iterations run.
      compile_seconds: time of the first (compiling) call.
    """

    state: TrainingState
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    total_steps: int
    total_iterations: int
    compile_seconds: float


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Adam (AdamW with ``weight_decay``), optional global-norm clipping and
    linear learning-rate decay to zero over ``total_steps``."""
    lr: Any = config.learning_rate
    if config.learning_rate_decay:
        updates_per_iteration = config.n_epochs * config.n_minibatches
        lr = optax.linear_schedule(config.learning_rate, 0.0, config.n_iterations * updates_per_iteration)
    adam = optax.adamw(lr, weight_decay=config.weight_decay) if config.weight_decay else optax.adam(lr)
    if config.gradient_clipping is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(config.gradient_clipping), adam)


def _check_network_matches_env(env, network, config: PPOConfig) -> None:
    """Fail early, with names, when the network's value output does not match
    the reward structure or its outputs have the wrong batch shape."""
    B = config.n_envs
    env_state = jax.eval_shape(lambda k: jax.vmap(env.reset)(jax.random.split(k, B)), jax.random.key(0))
    graphdef, params, rest = nnx.split(network, nnx.Param, ...)

    def forward(params, rest, obs):
        carry = nnx.merge(graphdef, params, rest).initialize_state(B)
        return apply_network(graphdef, params, rest, carry, obs)[0].output

    out = jax.eval_shape(forward, params, rest, env_state.obs)
    check_env_structure(env, B, actions=out.actions)
    reward_tree = jax.tree.structure(env_state.reward)
    value_tree = jax.tree.structure(out.value_estimates)
    if reward_tree != value_tree:
        raise ValueError(
            f"the network's value_estimates have structure {value_tree} but the env's rewards have "
            f"structure {reward_tree}; give the value port one head per reward key"
        )
    for name, tree in (("value_estimates", out.value_estimates), ("loglikelihoods", out.loglikelihoods)):
        for leaf in jax.tree.leaves(tree):
            if leaf.shape != (B,):
                raise ValueError(f"the network's {name} have shape {leaf.shape}, expected ({B},) = (n_envs,)")
    check_actions(env, out.actions, B)


def _copy_leaf(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(jnp.copy(jax.random.key_data(x)), impl=jax.random.key_impl(x))
    return jnp.copy(x)


def _unalias(tree: Any) -> Any:
    """Copy leaves that appear more than once (e.g. an LSTM's ``h`` and ``c``
    built from one zeros array), so the whole tree can be donated."""
    seen: set[int] = set()

    def leaf(x):
        if id(x) in seen:
            return _copy_leaf(x)
        seen.add(id(x))
        return x

    return jax.tree.map(leaf, tree)


def _strong_types(tree: Any) -> Any:
    """Give weakly typed leaves (e.g. env fields built from Python floats)
    their plain dtype. The compiled iteration returns strongly typed arrays,
    so without this the second call would see a new signature and compile
    the whole program again."""

    def leaf(x):
        if getattr(x, "weak_type", False):
            return jax.lax.convert_element_type(x, x.dtype)
        return x

    return jax.tree.map(leaf, tree)


def split_in_mode(network, deterministic: bool):
    """``nnx.split(network, nnx.Param, ...)`` with every module's
    ``deterministic`` flag set as asked (training: False; evaluation: True);
    the network's own flags are left as they were."""
    modules = [m for _, m in nnx.iter_modules(network) if hasattr(m, "deterministic")]
    saved = [m.deterministic for m in modules]
    for m in modules:
        m.deterministic = deterministic
    try:
        return nnx.split(network, nnx.Param, ...)
    finally:
        for m, flag in zip(modules, saved):
            m.deterministic = flag


def new_training_state(env, network, config: TrainConfig) -> TrainingState:
    """Initial training state: resets ``config.ppo.n_envs`` envs (and
    de-synchronizes their time limits where the env asks for it, see
    :meth:`nnx_ppo.envs.TimeLimit.desynchronize`), initializes the network
    carry and the optimizer. Works on copies: ``network`` is not modified,
    and training never donates its arrays."""
    ppo = config.ppo
    _check_network_matches_env(env, network, ppo)
    key = jax.random.key(config.seed)
    key, reset_key, sync_key = jax.random.split(key, 3)

    def initial_envs(reset_key, sync_key):
        states = jax.vmap(env.reset)(jax.random.split(reset_key, ppo.n_envs))
        if hasattr(env, "desynchronize"):
            states = jax.vmap(env.desynchronize)(states, jax.random.split(sync_key, ppo.n_envs))
        return states

    env_state = jax.jit(initial_envs)(reset_key, sync_key)
    graphdef, params, rest = nnx.split(network, nnx.Param, ...)
    params, rest = jax.tree.map(_copy_leaf, (params, rest))
    copy = nnx.merge(graphdef, params, rest)
    carry = copy.initialize_state(ppo.n_envs)  # may draw from the copy's Rngs
    _, _, rest = nnx.split(copy, nnx.Param, ...)
    rollout = RolloutState(
        env_state=env_state,
        carry=carry,
        episode_return=jnp.zeros((ppo.n_envs,), jnp.float32),
        episode_length=jnp.zeros((ppo.n_envs,), jnp.int32),
        fresh=jnp.ones((ppo.n_envs,), bool),
    )
    return TrainingState(
        params=params,
        rest=rest,
        opt_state=make_optimizer(ppo).init(params),
        rollout=rollout,
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        return_stats=initial_return_statistics(ppo.n_envs),
    )


def _update_epochs(graphdef, optimizer, params, opt_state, rest, data: Minibatch, key, config: PPOConfig):
    """``n_epochs`` passes of ``n_minibatches`` gradient steps (nested scans).
    Returns the new params, optimizer state and the mean metrics."""
    grad_fn = jax.value_and_grad(ppo_loss, has_aux=True)

    def minibatch_step(carry, batch):
        params, opt_state = carry
        (_, metrics), grads = grad_fn(params, graphdef, rest, batch, config)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["optimizer/grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def epoch(carry, epoch_key):
        return jax.lax.scan(minibatch_step, carry, split_minibatches(epoch_key, data, config.n_minibatches))

    keys = jax.random.split(key, config.n_epochs)
    (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state), keys)
    return params, opt_state, jax.tree.map(jnp.mean, metrics)


def _update_statistics(graphdef, params, rest, extras):
    """``network.update_statistics`` on the rollout's ``[T, B, ...]`` extras."""
    net = nnx.merge(graphdef, params, rest)
    net.update_statistics(extras)
    _, _, rest = nnx.split(net, nnx.Param, ...)
    return rest


def _explained_variance(values, returns):
    values, returns = sum_leaves(values), sum_leaves(returns)
    return 1.0 - jnp.var(returns - values) / (jnp.var(returns) + 1e-8)


def train_iteration(env, graphdef, optimizer, config: PPOConfig, state: TrainingState):
    """One PPO iteration (pure; traced inside :func:`make_train_fn`).

    1. rollout ``[T, B]`` from the carried env states and network carries;
    2. GAE advantages ``[T, B]``;
    3. ``n_epochs x n_minibatches`` replays of whole env sequences and updates;
    4. ``update_statistics`` with the rollout's extras.

    Returns ``(next_state, metrics)`` with scalar metrics.
    """
    key, rollout_key, epoch_key = jax.random.split(state.key, 3)
    traj, rollout, last_values, rest, stats = collect_rollout(
        env, graphdef, state.params, state.rest, state.rollout, rollout_key,
        config.rollout_length, config.bootstrap_on_truncation,
    )
    reward_mean = jnp.mean(sum_leaves(traj.rewards))  # in the env's units
    return_stats = state.return_stats
    if config.normalize_rewards:
        done = jnp.maximum(traj.terminated, traj.truncated)
        return_stats = update_return_statistics(return_stats, sum_leaves(traj.rewards), done,
                                                config.discounting_factor)
        traj = dataclasses.replace(traj, rewards=scale_rewards(traj.rewards, return_stats))
    advantages, returns = trajectory_gae(traj, traj.values, last_values, config)
    data = Minibatch(trajectory=traj, advantages=advantages, returns=returns,
                     last_values=jax.tree.map(lambda v: v[None], last_values))
    params, opt_state, loss_metrics = _update_epochs(
        graphdef, optimizer, state.params, state.opt_state, rest, data, epoch_key, config
    )
    rest = _update_statistics(graphdef, params, rest, traj.extras)

    episodes = stats.pop("completed_episodes")
    return_sum = stats.pop("completed_return_sum")
    length_sum = stats.pop("completed_length_sum")
    metrics = {
        **loss_metrics,
        **stats,
        "value/explained_variance": _explained_variance(traj.values, returns),
        "train/reward_mean": reward_mean,
        "train/completed_episodes": episodes,
        "train/episode_return": return_sum / jnp.maximum(episodes, 1.0),
        "train/episode_length": length_sum / jnp.maximum(episodes, 1.0),
        "finite_loss": jnp.isfinite(loss_metrics["loss/total"]),
    }
    if config.normalize_rewards:
        metrics["train/return_std"] = jnp.sqrt(return_stats.var)
    next_state = TrainingState(
        params=params, rest=rest, opt_state=opt_state, rollout=rollout, key=key,
        iteration=state.iteration + 1, return_stats=return_stats,
    )
    return next_state, metrics


def make_train_fn(env, graphdef, config: PPOConfig, max_iterations: int) -> Callable:
    """Compile up to ``max_iterations`` iterations into one program:
    ``fn(state, n) -> (state, metrics)`` runs ``n <= max_iterations``
    iterations (``n`` is a runtime value, so a shorter last call does not
    recompile); metric leaves are ``[max_iterations]``, rows ``>= n`` unused.
    The input state's buffers are donated."""
    optimizer = make_optimizer(config)
    iteration = lambda s: train_iteration(env, graphdef, optimizer, config, s)

    if max_iterations == 1:
        def run(state, n):
            del n
            state, metrics = iteration(state)
            return state, jax.tree.map(lambda m: m[None], metrics)
    else:
        def run(state, n):
            shapes = jax.eval_shape(iteration, state)[1]
            buffer = jax.tree.map(lambda m: jnp.zeros((max_iterations,) + m.shape, m.dtype), shapes)

            def body(i, carry):
                state, buffer = carry
                state, metrics = iteration(state)
                buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, metrics)
                return state, buffer

            return jax.lax.fori_loop(0, n, body, (state, buffer))

    return jax.jit(run, donate_argnums=0)


def make_eval_fn(env, graphdef, n_envs: int, max_episode_length: int) -> Callable:
    """``fn(params, rest, key) -> metrics``: one episode per env, up to
    ``max_episode_length`` steps; statistics of the first episode's return and length."""

    def run(params, rest, key):
        net = nnx.merge(graphdef, params, rest)
        carry = net.initialize_state(n_envs)
        env_state = jax.vmap(env.reset)(jax.random.split(key, n_envs))

        def step(c, _):
            rest, env_state, carry, ret, length, alive = c
            out, rest = apply_network(graphdef, params, rest, carry, env_state.obs)
            env_state = jax.vmap(env.step)(env_state, out.output.actions)
            ret = ret + jnp.where(alive > 0, sum_leaves(env_state.reward), 0.0)  # ended envs may hold NaN
            length = length + alive
            alive = alive * (1.0 - (env_state.done > 0))
            return (rest, env_state, out.next_state, ret, length, alive), None

        zeros = jnp.zeros((n_envs,), jnp.float32)
        init = (rest, env_state, carry, zeros, zeros, jnp.ones((n_envs,), jnp.float32))
        (_, _, _, ret, length, _), _ = jax.lax.scan(step, init, None, length=max_episode_length)
        return {
            "eval/episode_return": jnp.mean(ret),
            "eval/episode_return_std": jnp.std(ret),
            "eval/episode_return_min": jnp.min(ret),
            "eval/episode_return_max": jnp.max(ret),
            "eval/episode_length": jnp.mean(length),
        }

    return jax.jit(run)


def evaluate(env, network, *, n_envs: int = 16, max_episode_length: int = 1000, seed: int = 0,
             deterministic: bool = True) -> dict[str, float]:
    """Run ``n_envs`` episodes with ``network`` (mode/mean actions when
    ``deterministic``) and return return/length statistics."""
    graphdef, params, rest = split_in_mode(network, deterministic)
    fn = make_eval_fn(env, graphdef, n_envs, max_episode_length)
    return {k: float(v) for k, v in fn(params, rest, jax.random.key(seed)).items()}


def _host_metrics(metrics: dict[str, jax.Array]) -> list[dict[str, float]]:
    """Stacked ``[n]`` metrics to one dict of floats per iteration."""
    host = jax.device_get(metrics)
    n = len(next(iter(host.values())))
    return [{k: float(np.asarray(v)[i]) for k, v in host.items()} for i in range(n)]


def _check_finite(row: dict[str, float], iteration: int) -> None:
    for flag, what in (("finite_obs", "observations"), ("finite_reward", "rewards"), ("finite_loss", "the loss")):
        if row.get(flag, 1.0) < 0.5:
            raise NonFiniteError(
                f"non-finite values (NaN or inf) in {what} at iteration {iteration}; "
                "check the environment (or the learning rate, for the loss)"
            )


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

    Raises:
      NonFiniteError: NaN/inf in rewards, observations or the loss, at the
        iteration where it happened.
    """
    ppo = config.ppo
    eval_env = eval_env if eval_env is not None else env
    if state is None:
        state = new_training_state(env, network, config)
    if resume_from is not None:
        from nnx_ppo.algorithms import checkpointing

        state = checkpointing.restore_training_state(resume_from, state)
        newer = [
            step for step, _ in checkpointing.list_checkpoints(checkpoint_dir or resume_from)
            if step > int(state.iteration) * ppo.steps_per_iteration
        ]
        if newer:
            warnings.warn(
                f"resumed from step {int(state.iteration) * ppo.steps_per_iteration}, but the checkpoint "
                f"directory also holds later checkpoints (steps {newer}) from the run being branched off; "
                "latest_checkpoint() will pick those until newer ones are written. Remove them, or "
                "checkpoint this branch into another directory.",
                stacklevel=2,
            )
    state = _unalias(_strong_types(state))
    last_checkpoint_steps = int(state.iteration) * ppo.steps_per_iteration

    def save_checkpoint(steps: int) -> None:
        nonlocal last_checkpoint_steps
        from nnx_ppo.algorithms import checkpointing

        checkpointing.save_training_state(
            checkpoint_dir, state, config, step=steps, keep=config.keep_checkpoints, metadata=checkpoint_metadata
        )
        last_checkpoint_steps = steps
    graphdef, _, _ = split_in_mode(network, deterministic=False)  # training samples actions
    if config.eval.enabled:
        eval_graphdef, _, _ = split_in_mode(network, config.eval.deterministic)
        eval_fn = make_eval_fn(eval_env, eval_graphdef, config.eval.n_envs, config.eval.max_episode_length)

    total_iterations = ppo.n_iterations
    start_iteration = int(state.iteration)
    train_fn = make_train_fn(env, graphdef, ppo, config.iterations_per_call)
    eval_history: list[tuple[int, dict[str, float]]] = []
    last_metrics: dict[str, float] = {}
    compile_seconds = 0.0
    last_eval_steps = -1
    tick = time.perf_counter()

    def run_eval(steps: int) -> None:
        nonlocal last_eval_steps
        eval_key = jax.random.fold_in(jax.random.key(config.seed + 1), steps)
        row = {k: float(v) for k, v in eval_fn(state.params, state.rest, eval_key).items()}
        eval_history.append((steps, row))
        last_eval_steps = steps
        if log_fn is not None:
            log_fn(row, steps)

    iteration = start_iteration
    try:
        while iteration < total_iterations:
            n = min(config.iterations_per_call, total_iterations - iteration)
            first_call = iteration == start_iteration
            t0 = time.perf_counter()
            state, metrics = train_fn(state, jnp.asarray(n, jnp.int32))
            rows = _host_metrics(metrics)[:n]
            elapsed = time.perf_counter() - t0
            if first_call:
                compile_seconds = elapsed
            for row in rows:
                iteration += 1
                _check_finite(row, iteration)
                row["time/steps_per_second"] = n * ppo.steps_per_iteration / max(elapsed, 1e-9)
                row["time/elapsed_seconds"] = time.perf_counter() - tick
                last_metrics = row
                if log_fn is not None:
                    log_fn(row, iteration * ppo.steps_per_iteration)
            steps = iteration * ppo.steps_per_iteration
            if config.eval.enabled and (
                last_eval_steps < 0 or steps - last_eval_steps >= config.eval.every_steps or iteration == total_iterations
            ):
                run_eval(steps)
            if checkpoint_dir is not None and config.checkpoint_every_steps is not None and (
                steps - last_checkpoint_steps >= config.checkpoint_every_steps
            ):
                save_checkpoint(steps)
            if should_stop is not None and should_stop():
                break

        if checkpoint_dir is not None and last_checkpoint_steps != iteration * ppo.steps_per_iteration:
            save_checkpoint(iteration * ppo.steps_per_iteration)
    finally:
        # The network gets (copies of) the latest state, also when training
        # stops with an exception; the state itself stays donatable.
        if not any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves((state.params, state.rest))):
            nnx.update(network, *jax.tree.map(_copy_leaf, (state.params, state.rest)))
    return TrainResult(
        state=state,
        metrics=last_metrics,
        eval_history=eval_history,
        total_steps=iteration * ppo.steps_per_iteration,
        total_iterations=iteration,
        compile_seconds=compile_seconds,
    )
