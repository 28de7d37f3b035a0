"""The one trainer: everything around a compiled iteration, for one run or a seed batch.

PPO (:func:`~nnx_ppo.algorithms.ppo.train_ppo`), many seeds
(:func:`~nnx_ppo.algorithms.seeds.train_seeds`) and distillation
(:func:`~nnx_ppo.algorithms.distillation.train_distillation`) differ only in
their :class:`Algorithm`: how one seed's :class:`TrainingState` starts and
what one iteration does. :func:`train` does the rest, in this order:

1. coerce the envs and gather the members: one plain run is one member,
   a seed batch or a population N (:class:`~nnx_ppo.algorithms.members.Members`); check that their buffers
   fit (:mod:`~nnx_ppo.algorithms.footprint`); build their states (a batch's stacked ``[S, ...]``), or resume;
2. donate and place the state on the devices (:func:`~nnx_ppo.algorithms.sharding.place`);
3. compile the iteration (:func:`~nnx_ppo.algorithms.program.compile_iterations`)
   and run it in the :class:`~nnx_ppo.algorithms.driver.Driver` loop with
   its hooks: log, evaluate, checkpoint, stop;
4. on failure a member fails alone: it stays at its last healthy state, the
   others train on, its result says where and why, a run directory records
   it as a failure row of ``metrics.jsonl``, and a resumed run keeps it
   failed. One plain run then raises its failure (:class:`NonFiniteError`,
   :class:`ReplayMismatchError`, also for Flax's ``TraceContextError``),
   its network at its last healthy parameters;
5. write the trained variables back into the networks and build one
   :class:`TrainResult` per member.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

import numpy as np
from flax import errors as flax_errors
from flax import nnx

from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, check_seeds
from nnx_ppo.algorithms.distributed import any_process, process_count
from nnx_ppo.algorithms.driver import (
    Driver,
    Hooks,
    IterationOutput,
    rule_breaking_module_error,
)
from nnx_ppo.algorithms.footprint import check_footprint
from nnx_ppo.algorithms.functional import NetworkFn, donatable
from nnx_ppo.algorithms.hooks import best_policy_hook, checkpoint_hook, evaluation_hook
from nnx_ppo.algorithms.hyperparameters import member_entry
from nnx_ppo.algorithms.members import (
    Members,
    check_fresh_checkpoint_dir,
    earlier_failures,
    failure_metrics,
    gather_members,
    initial_state,
    member_row,
    resumed,
    run_failure,
    write_back,
)
from nnx_ppo.algorithms.outputs import RunOutput, run_layer
from nnx_ppo.algorithms.program import compile_iterations
from nnx_ppo.algorithms.sharding import local_devices, place, replicated
from nnx_ppo.algorithms.state import TrainingState, TrainResult
from nnx_ppo.envs.registry import as_env

__all__ = ["Algorithm", "TrainOptions", "train"]

Iteration = Callable[[TrainingState], tuple[TrainingState, IterationOutput]]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """What a trainer is made of besides the shared machinery.

    Attributes:
      initial_state: ``initial_state(env, network, config) -> TrainingState``
        of one seed (``config.seed`` is that seed's); must not modify ``network``.
      iteration: ``iteration(env, graphdef, ppo) -> fn(state) -> (state,
        IterationOutput)``: the pure iteration for the network structure
        ``graphdef`` (training mode) and the :class:`PPOConfig` to compile
        with (per device when sharded).
      run_record: what a run directory's ``config.json`` records about the
        algorithm besides the config (e.g. ``{"distillation": {...}}``).
      population_step: for a population, ``step(state, output) -> (state,
        output)`` on all members after every iteration (see
        :func:`~nnx_ppo.algorithms.pbt.population_step`).
      failed_member_row: for a batch, ``failed_member_row(row) -> row or
        None``: what of a failed member's iteration row is still logged
        (e.g. :func:`~nnx_ppo.algorithms.pbt.failed_member_row`: PBT reviving
        it); None: nothing.
      first_rows: for one run, ``first_rows() -> [(env_steps, metrics), ...]``:
        rows the initial state made (e.g. distillation's evaluation before
        the first update), logged before the first iteration's.
    """

    initial_state: Callable[[Any, Any, TrainConfig], TrainingState]
    iteration: Callable[[Any, Any, PPOConfig], Iteration]
    run_record: dict[str, Any] | None = None
    population_step: Callable | None = None
    failed_member_row: Callable[[dict[str, float]], dict[str, float] | None] | None = None
    first_rows: Callable[[], list[tuple[int, dict[str, float]]]] | None = None


class TrainOptions(TypedDict, total=False):
    """The keyword arguments every trainer takes
    (:func:`~nnx_ppo.algorithms.ppo.train_ppo`,
    :func:`~nnx_ppo.algorithms.seeds.train_seeds`,
    :func:`~nnx_ppo.algorithms.distillation.train_distillation`); all optional.

    Keys:
      log_fn: called as ``log_fn(metrics, env_steps)`` after every iteration
        and every evaluation, with flat ``/``-joined keys (``train_seeds``:
        ``log_fn(metrics, env_steps, seed)`` for every seed still training).
      eval_env: env for evaluation (default: the training env).
      checkpoint_dir: save the whole training state here every
        ``TrainConfig.checkpoint_every_steps`` env steps (keeping the last
        ``TrainConfig.keep_checkpoints``) and at the end. A run that does
        not resume refuses a directory that already holds checkpoints
        (:class:`CheckpointDirInUseError`), so that it never prunes another
        run's.
      resume_from: a checkpoint directory (or one checkpoint in it) to
        continue from; the latest complete checkpoint is used.
      checkpoint_metadata: JSON-serializable data saved with each checkpoint
        (e.g. how to rebuild the network for inference).
      should_stop: polled between compiled calls; True ends training (the
        state so far is saved and returned) right after that call, or one
        call later if it has ``may_lag_one_call = True`` (Ctrl-C's flag).
      run_dir: write a run directory as ``nnx-ppo train`` does (config.json,
        metrics.jsonl, TensorBoard, learning_curve.png, ``checkpoints/``
        with the best policy), through the run layer's one runner
        (:class:`nnx_ppo.runner.Run`), read by ``nnx-ppo eval``/``plot``/``resume``
        and ``load_policy``. A fresh run refuses a directory holding
        checkpoints (continue that run with ``resume_from=run_dir``) and
        starts again, with a warning, one whose run saved none. Replaces
        ``checkpoint_dir``.
      progress: show the command line's progress bar (plain lines at most
        every 30 s when stderr is not a terminal).
      run: an open :class:`~nnx_ppo.algorithms.outputs.RunOutput` to write
        into (what ``run_dir=`` opens; the command line opens its own and
        closes it).
    """

    log_fn: Callable[..., None] | None
    eval_env: Any
    checkpoint_dir: str | None
    resume_from: str | None
    checkpoint_metadata: dict | None
    should_stop: Callable[[], bool] | None
    run_dir: str | os.PathLike | None
    progress: bool
    run: RunOutput | None


def _check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(TrainOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; a trainer takes "
                        f"{', '.join(TrainOptions.__annotations__)} (see nnx_ppo.algorithms.trainer.TrainOptions)")


def train(
    algorithm: Algorithm,
    env,
    config: TrainConfig,
    *,
    network=None,
    make_network: Callable[[nnx.Rngs], Any] | None = None,
    seeds: Sequence[int] | None = None,
    members: Sequence[TrainConfig] | None = None,
    state: TrainingState | None = None,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
    **options: Unpack[TrainOptions],
) -> list[TrainResult]:
    """Train with ``algorithm``: one ``network`` (updated in place), or one
    network per seed from ``make_network(nnx.Rngs(seed))`` for ``seeds``,
    all in one compiled program. Returns one :class:`TrainResult` per seed
    (one for a single run).

    ``members`` (a population, see
    :func:`~nnx_ppo.algorithms.population.train_population`): one config per
    entry of ``seeds`` (which then only name the members: ``0 .. N-1``); a
    member's network is built from, and its state starts at, its config's
    ``seed``, and its :data:`~nnx_ppo.algorithms.hyperparameters.PER_MEMBER`
    numbers ride in its state; ``config`` gives everything the members share.

    ``state`` (continue from it) and ``on_evaluation`` (see
    :func:`~nnx_ppo.algorithms.ppo.train_ppo`) are for a single run;
    ``options`` are the :class:`TrainOptions`.
    """
    _check_options(options)
    if (network is None) == (seeds is None) or (seeds is None) != (make_network is None):
        raise ValueError("train: give a network (one run), or make_network and seeds (a seed batch)")
    checkpoint_dir, resume_from = options.get("checkpoint_dir"), options.get("resume_from")
    output, run_dir = options.get("run"), options.get("run_dir")
    if (run_dir is not None or output is not None) and checkpoint_dir is not None:
        raise ValueError("give run_dir or checkpoint_dir, not both (a run directory keeps its checkpoints in "
                         "run_dir/checkpoints)")
    if resume_from is not None:
        resume_from = run_layer().checkpoints_of(resume_from)
    env = as_env(env)
    eval_env = env if options.get("eval_env") is None else as_env(options["eval_env"])
    network, make_network, network_spec = _named_network(network, make_network, env, eval_env, config)
    if seeds is not None:
        seeds = check_seeds(seeds, "train_seeds: seeds")
    devices = local_devices(config.n_devices, config.ppo.n_envs, len(seeds) if seeds and config.shard_seeds else None)
    team = gather_members(network, make_network, seeds, members, config)
    check_footprint(env, team.networks[0], config.ppo, len(team.names) if team.stacked else 1, len(devices))
    record = dict(algorithm.run_record or {})
    metadata = dict(options.get("checkpoint_metadata") or {})
    if team.stacked:
        metadata["seeds"] = team.names
    if members is not None:
        record["members"] = metadata["members"] = [member_entry(c) for c in team.configs]
    opened = None
    if output is None and (run_dir is not None or options.get("progress")):
        output = opened = run_layer().open_output(
            run_dir, progress=bool(options.get("progress")), train_env=env, eval_env=eval_env,
            network_spec=network_spec, network=team.networks[0], config=config,
            seeds=team.names if team.stacked else None, resuming=resume_from is not None)
    try:
        if output is not None and output.checkpoint_dir is not None:
            checkpoint_dir = output.checkpoint_dir
        if checkpoint_dir is not None and resume_from is None:
            check_fresh_checkpoint_dir(checkpoint_dir)
        if state is None:
            state = initial_state(algorithm, env, team, population=members is not None)
        if resume_from is not None:
            state = resumed(state, team, resume_from, checkpoint_dir, config.ppo, record.get("members"))
        metadata = {**(output.checkpoint_metadata if output is not None else {}), **metadata}
        log = _member_log(options.get("log_fn"), team.stacked)
        earlier_failures = {}
        if output is not None:
            output.begin(record)
            log = _both(output.log, log)
            earlier_failures = output.earlier_failures() if resume_from is not None else {}
        if algorithm.first_rows is not None and log is not None and not team.stacked:
            for steps, row in algorithm.first_rows():
                log(row, steps, None)
        return _run(algorithm, env, eval_env, config, team, devices, state, _Outputs(
            log=log, checkpoint_dir=checkpoint_dir, checkpoint_metadata=metadata or None,
            on_evaluation=on_evaluation, should_stop=options.get("should_stop"),
            earlier_failures=earlier_failures, record_failure=None if output is None else output.record_failure))
    finally:
        if opened is not None:
            opened.close()


def _named_network(network, make_network, env, eval_env, config: TrainConfig):
    """``(network, make_network, spec)``: a network named by a string
    (``"mlp"``, ``"lstm"``, ``"gru"``, ``"MODULE:FUNCTION"``,
    ``"FILE.py:FUNCTION"``) or a :class:`~nnx_ppo.network_spec.NetworkSpec`
    is built here for ``env`` (one run: from ``config.seed``) by the run
    layer, and its spec returned; a network object or factory function is
    passed through with spec None."""
    named = run_layer().named_network(network if network is not None else make_network, env, eval_env, config.seed)
    if named is None:
        return network, make_network, None
    factory, spec = named
    if network is not None:
        spec = dataclasses.replace(spec, seed=config.seed)
        return factory(nnx.Rngs(config.seed)), None, spec
    return None, factory, spec


def _member_log(log_fn, stacked: bool):
    """The user's ``log_fn`` as the trainer calls it, ``log(metrics, env_steps,
    name)``: one run's takes no name."""
    if log_fn is None or stacked:
        return log_fn
    return lambda metrics, env_steps, name: log_fn(metrics, env_steps)


def _both(first, second):
    """One ``log(metrics, env_steps, name)`` calling ``first`` then ``second`` (if any)."""
    if second is None:
        return first
    return lambda metrics, env_steps, name: (first(metrics, env_steps, name), second(metrics, env_steps, name))


@dataclasses.dataclass(frozen=True)
class _Outputs:
    """Where a run's results go besides its networks and :class:`TrainResult`\\ s.

    Attributes:
      log: ``log(metrics, env_steps, name)`` for every member's iteration
        and evaluation rows (None: nothing logged).
      checkpoint_dir, checkpoint_metadata: where and with what the whole
        state is saved (None: no checkpoints, no best policies).
      on_evaluation: ``on_evaluation(policy, env_steps)`` (one run only).
      should_stop: polled between compiled calls.
      earlier_failures: a resumed run directory's failure rows (name -> row): they stay failures.
      record_failure: ``record_failure(row, env_steps, name)`` writes each new failure into the run directory.
    """

    log: Callable[[dict[str, float], int, int | None], None] | None = None
    checkpoint_dir: str | None = None
    checkpoint_metadata: dict | None = None
    on_evaluation: Callable[[NetworkFn, int], None] | None = None
    should_stop: Callable[[], bool] | None = None
    earlier_failures: dict[Any, dict[str, Any]] = dataclasses.field(default_factory=dict)
    record_failure: Callable[[dict[str, str], int, int | None], None] | None = None


def _run(algorithm: Algorithm, env, eval_env, config: TrainConfig, team: Members, devices,
         state: TrainingState, out: _Outputs) -> list[TrainResult]:
    """Place and compile, then drive the iterations with their hooks (steps
    2-5 above). Every member fails alone, kept at its last healthy state; one
    plain run then raises its failure."""
    ppo = config.ppo
    should_stop = out.should_stop
    if process_count() > 1:  # a stop asked for in one process stops every process at the same iteration
        should_stop = lambda: any_process(out.should_stop is not None and out.should_stop())  # noqa: E731
    state = donatable(state)
    iterations = np.atleast_1d(np.asarray(state.iteration))  # read before the state spans other processes
    start_iteration = int(np.max(iterations))
    state, ppo, shardings, mesh = place(state, ppo, devices, seed_batch=team.stacked,
                                        by_seed=team.stacked and config.shard_seeds)
    train_fn = compile_iterations(algorithm.iteration(env, team.graphdef, ppo), config.iterations_per_call,
                                  batched_seeds=team.stacked, shardings=shardings, seed_batching=config.seed_batching,
                                  population_step=algorithm.population_step)

    last_rows: dict[int, dict[str, float]] = {}
    recorded: set[int] = set()  # the failed members whose failure the run directory holds

    def log_failed(i: int, row: dict[str, float], steps: int) -> None:
        """Record member ``i``'s failure once; then log only what the algorithm keeps of its rows."""
        if i not in recorded:
            recorded.add(i)
            if out.record_failure is not None:
                failure = driver.failures[i]
                out.record_failure(failure_metrics(failure), failure.env_steps, team.names[i])
        kept = None if algorithm.failed_member_row is None else algorithm.failed_member_row(row)
        if kept and out.log is not None:
            out.log(kept, steps, team.names[i])

    def log_members(row: dict[str, Any], steps: int) -> None:
        for i, name in enumerate(team.names):
            if i not in driver.failures:
                own = member_row(row, i)
                if not any(k.startswith("eval/") for k in own):
                    last_rows[i] = own
                if out.log is not None:
                    out.log(own, steps, name)
        for i in driver.failures:  # (after the healthy members' rows of the step)
            log_failed(i, member_row(row, i), steps)

    training_seeds = [c.seed for c in team.configs] if team.stacked else None
    evaluate = evaluation_hook(config, team.networks[0], eval_env, training_seeds, mesh, out.on_evaluation) if (
        config.eval.enabled) else None
    if evaluate is not None and out.checkpoint_dir:
        evaluate = best_policy_hook(evaluate, config, out.checkpoint_dir, out.checkpoint_metadata,
                                    team.names if team.stacked else None, mesh, lambda: driver.failures)
    driver = Driver(
        train_fn, state,
        start_iteration=start_iteration, total_iterations=ppo.n_iterations,
        iterations_per_call=config.iterations_per_call, steps_per_iteration=ppo.steps_per_iteration,
        member_iterations=[int(i) for i in iterations], stacked=team.stacked,
        hooks=Hooks(
            log=log_members,
            evaluate=evaluate,
            eval_every_steps=config.eval.every_steps,
            checkpoint=checkpoint_hook(config, out.checkpoint_dir, out.checkpoint_metadata) if (
                out.checkpoint_dir) else None,
            checkpoint_every_steps=config.checkpoint_every_steps,
            should_stop=should_stop,
            stop_may_lag=getattr(out.should_stop, "may_lag_one_call", False),
        ),
    )
    # A member that failed before the resumed step stays failed.
    driver.failures.update(earlier_failures(out.earlier_failures, team.names,
                                             start_iteration * ppo.steps_per_iteration))
    recorded.update(driver.failures)
    try:
        result = driver.run()
    except flax_errors.TraceContextError as err:
        raise rule_breaking_module_error(err, team.networks[0]) from None
    finally:
        # The networks get (copies of) the latest state, also when training
        # stops with another exception; the state stays donatable.
        write_back(team, driver.state, mesh)
    if not team.stacked and driver.failures:
        raise run_failure(driver.failures[0], team.networks[0], env, ppo)
    return _results(team, result, replicated(result.state, mesh) if team.stacked else result.state,
                    driver.failures, last_rows, ppo)


def _results(team: Members, result, final: TrainingState, failures: dict, last_rows: dict[int, dict[str, float]],
             ppo: PPOConfig) -> list[TrainResult]:
    """One :class:`TrainResult` per member (step 5 above): its part of the
    ``final`` state, its last rows and evaluations, and where it failed."""
    results = []
    for i, net in enumerate(team.networks):
        failure = failures.get(i)
        done = result.iterations if failure is None else failure.iteration - 1
        results.append(TrainResult(
            state=team.part(final, i),
            metrics=last_rows.get(i, {}),
            eval_history=[(steps, member_row(row, i)) for steps, row in result.eval_history
                          if failure is None or steps < failure.env_steps],
            total_steps=done * ppo.steps_per_iteration,
            total_iterations=done,
            compile_seconds=result.compile_seconds,
            failure=failure,
            network=net,
        ))
    return results
