"""The one trainer: everything around a compiled iteration, for one run or a seed batch.

Who trains and how they fail is one code path for 1..N members
(:class:`Members`, :func:`gather_members`, the section "the members"): one
plain run is one member; a seed batch or a population is N, whose state has
a leading member axis ``[S, ...]``; a member's failure is logged
(:meth:`~nnx_ppo.algorithms._outputs.RunOutput.record_failure`), remembered on resume (:func:`earlier_failures`)
and raised by one plain run (:func:`run_failure`).

PPO (:func:`train_ppo`, at the end of this module), many seeds
(:func:`~nnx_ppo.algorithms.population.train_seeds`) and distillation
(:func:`~nnx_ppo.algorithms.distillation.train_distillation`) differ only in
their :class:`Algorithm`: how one seed's
:class:`~nnx_ppo.algorithms.ppo.TrainingState` starts and what one
iteration does (PPO's: :mod:`nnx_ppo.algorithms.ppo`). :func:`train` does
the rest, in this order:

1. coerce the envs and gather the members: one plain run is one member,
   a seed batch or a population N (:class:`Members`); check that their buffers
   fit (:func:`~nnx_ppo.algorithms.ppo.check_footprint`); build their states
   (a batch's stacked ``[S, ...]``), or resume;
2. donate and place the state on the devices (:func:`~nnx_ppo.algorithms.distributed.place`);
3. compile the iteration (:func:`~nnx_ppo.algorithms.ppo.compile_iterations`)
   and run it in the :class:`Driver` loop with
   its hooks (the section "the hooks": :func:`evaluation_hook`,
   :func:`checkpoint_hook`, :func:`best_policy_hook`): log, evaluate,
   checkpoint, stop;
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

import collections
import concurrent.futures
import contextlib
import dataclasses
import importlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, Unpack

import jax
import jax.numpy as jnp
import numpy as np
from flax import errors as flax_errors
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from nnx_ppo.algorithms import _outputs
from nnx_ppo.algorithms._hyperparameters import check_population, initial_member_state, member_entry
from nnx_ppo.algorithms._outputs import RunLayer, RunOutput
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig, check_seeds
from nnx_ppo.algorithms.distributed import any_process, local_devices, place, process_count, replicated
from nnx_ppo.algorithms.evaluation import episode_metrics, run_episodes
from nnx_ppo.algorithms.functional import (
    NetworkFn,
    ReplayMismatchError,
    copy_tree,
    donatable,
    rule_breaking_module_error,
)
from nnx_ppo.algorithms.ppo import (
    IterationOutput,
    TrainingState,
    all_finite,
    check_footprint,
    compile_iterations,
    make_iteration,
    new_training_state,
    seed_slice,
    stack_trees,
)
from nnx_ppo.envs.registry import as_env
from nnx_ppo.networks.feedforward import compute_precision

__all__ = [
    "Algorithm",
    "TrainOptions",
    "TrainResult",
    "train",
    "train_ppo",
    "Members",
    "gather_members",
    "initial_state",
    "resume_state",
    "resumed",
    "write_back",
    "member_row",
    "earlier_failures",
    "run_failure",
    "named_replay_error",
    "CheckpointDirInUseError",
    "check_fresh_checkpoint_dir",
    "Failure",
    "Hooks",
    "DriverResult",
    "Driver",
    "run_layer",
    "evaluation_hook",
    "compiles_beside_training",
    "compile_in_background",
    "training_program",
    "compile_ahead",
    "program_or",
    "lower_training_program",
    "best_policy_hook",
    "checkpoint_hook",
]


Iteration = Callable[[TrainingState], tuple[TrainingState, IterationOutput]]


# ----------------------------------------------------------------------------- the members: who trains, how they fail


class CheckpointDirInUseError(ValueError):
    """A run that starts from scratch was given a ``checkpoint_dir`` that
    already holds another run's checkpoints (which it would prune)."""


def check_fresh_checkpoint_dir(checkpoint_dir: str) -> None:
    """Refuse to start a fresh run in a directory holding checkpoints:
    keeping only the newest ``keep_checkpoints`` would delete the other
    run's, or this run's own when the other's steps are higher."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

    what = checkpointing.held_checkpoints(checkpoint_dir)
    if what is not None:
        raise CheckpointDirInUseError(
            f"checkpoint_dir {os.fspath(checkpoint_dir)!r} already holds {what} of another run; a fresh run "
            "would prune them. Continue that run with resume_from=checkpoint_dir, or give an empty directory")


@dataclasses.dataclass(frozen=True)
class Members:
    """Who trains, one code path for 1..N members.

    Attributes:
      names: what logs, checkpoints and failure rows call each member: the
        seeds of a batch, the member indices of a population, ``[None]`` for
        one plain run.
      configs: each member's config (its ``seed`` is the one its network and
        state start from).
      networks: each member's network, all of one structure.
      graphdef: their structure in training mode.
      stacked: whether the state has a leading member axis ``[S, ...]`` (a
        batch); one plain run's state has none, so that it compiles
        exactly the program a single network runs.
    """

    names: list[int | None]
    configs: list[TrainConfig]
    networks: list
    graphdef: Any
    stacked: bool

    def part(self, tree: Any, index: int) -> Any:
        """Member ``index``'s part of a state (or any tree laid out like one)."""
        return seed_slice(tree, index) if self.stacked else tree

    def state(self, states: list[TrainingState]) -> TrainingState:
        """The members' states as one state."""
        return stack_trees(states) if self.stacked else states[0]


def gather_members(network, make_network, seeds, members, config: TrainConfig) -> Members:
    """One run (``network``), a seed batch (``make_network`` and ``seeds``,
    checked by :func:`~nnx_ppo.algorithms.config.check_seeds`) or a
    population (and ``members``: one config per seed) as :class:`Members`; a
    batch's networks are built here (``make_network(nnx.Rngs(seed))``) and
    must share one structure."""
    if seeds is None:
        return Members(names=[None], configs=[config], networks=[network],
                        graphdef=NetworkFn.of(network, deterministic=False).graphdef, stacked=False)
    if members is None:
        configs = [dataclasses.replace(config, seed=s) for s in seeds]
    else:
        configs = list(members)
        check_population([config, *configs])
        if len(configs) != len(seeds):
            raise ValueError(f"train: {len(configs)} member configs for {len(seeds)} members")
    networks = [make_network(nnx.Rngs(c.seed)) for c in configs]
    graphdef = NetworkFn.of(networks[0], deterministic=False).graphdef
    for c, net in zip(configs[1:], networks[1:]):
        if NetworkFn.of(net, deterministic=False).graphdef != graphdef:
            raise ValueError(f"train_seeds: make_network(nnx.Rngs({c.seed})) built a network whose structure "
                             f"differs from seed {configs[0].seed}'s; every seed must build the same architecture")
    return Members(names=list(seeds), configs=configs, networks=networks, graphdef=graphdef, stacked=True)


def initial_state(algorithm: Any, env, members: Members, population: bool) -> TrainingState:
    """The members' fresh state (a population's members each with their
    own hyperparameters in it)."""
    states = [algorithm.initial_state(env, net, config) for net, config in zip(members.networks, members.configs)]
    if population:
        states = [dataclasses.replace(s, member=initial_member_state(c, i))
                  for i, (s, c) in enumerate(zip(states, members.configs))]
    return members.state(states)


def resume_state(resume_from: str, checkpoint_dir: str | None, state: TrainingState, ppo: PPOConfig) -> TrainingState:
    """Restore ``state`` from ``resume_from``; warn when the directory also
    holds checkpoints later than the one resumed from. A change of ``n_envs``
    or ``rollout_length`` (the size of an iteration) is refused before
    anything is read or written."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

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
            stacklevel=4,
        )
    return state


def resumed(state: TrainingState, members: Members, resume_from: str, checkpoint_dir: str | None,
             ppo: PPOConfig, entries: list[dict] | None = None) -> TrainingState:
    """``state`` restored from ``resume_from`` (a seed batch only from a
    checkpoint of the same seeds, a population only from one of the same members)."""
    if members.stacked:
        import nnx_ppo.algorithms.checkpointing as checkpointing

        metadata = checkpointing.load_metadata(resume_from) or {}
        saved = metadata.get("seeds")
        if entries is not None and metadata.get("members") != entries:
            raise ValueError(f"train_population: cannot resume these members from {str(resume_from)!r}, which "
                             f"holds {metadata.get('members') or 'no population'}; resume with its configs and seeds")
        if saved != members.names:
            raise ValueError(f"train_seeds: cannot resume seeds {members.names} from {str(resume_from)!r}, which "
                             f"holds {'seeds ' + str(saved) if saved else 'a single-seed run'}; resume with its seeds")
    return resume_state(resume_from, checkpoint_dir, state, ppo)


def write_back(members: Members, state: TrainingState, mesh) -> None:
    """Copies of ``state``'s variables into the networks (each member's into
    its own), unless they were donated or are not finite."""
    latest = (state.params, state.rest)
    if any(getattr(leaf, "is_deleted", lambda: False)() for leaf in jax.tree.leaves(latest)):
        return
    latest = replicated(latest, mesh) if members.stacked else latest
    for i, net in enumerate(members.networks):
        own = members.part(latest, i)
        if bool(jax.jit(all_finite)(own)):
            nnx.update(net, *copy_tree(own))


def member_row(row: dict[str, Any], index: int) -> dict[str, float]:
    """Member ``index``'s row of host metrics (a batch's are ``[S]`` arrays; one run's are scalars)."""
    return {k: float(v[index]) if np.ndim(v) else float(v) for k, v in row.items()}


def earlier_failures(failures: dict[Any, Failure], names: list, up_to_steps: int) -> dict[int, Failure]:
    """The failures a resumed run directory records (member name -> :class:`Failure`, see
    :meth:`~nnx_ppo.algorithms._outputs.RunOutput.earlier_failures`) by member index, up to the env step the run
    continues from (a later one is trained again, and found again)."""
    return {names.index(name): f for name, f in failures.items() if name in names and f.env_steps <= up_to_steps}


def run_failure(failure: Failure, network, env, ppo: PPOConfig, compiler_options: dict | None = None) -> Exception:
    """The error one plain run raises for its ``failure``: a replay
    mismatch with the module named (the run's ``TrainConfig.compiler_options``
    among the settings it names), a non-finite value with where the
    network's parameters come from."""
    if isinstance(failure.error, ReplayMismatchError):
        return named_replay_error(failure.error, network, env, ppo, compiler_options)
    healthy = failure.iteration - 1
    return type(failure.error)(f"{failure.error}. The network holds the last finite parameters and statistics, "
                               f"from iteration {healthy} ({healthy * ppo.steps_per_iteration} env steps)")


_COMPILER_DEFAULTS = {"jax_exec_time_optimization_effort": 0.0, "jax_memory_fitting_effort": 0.0,
                      "jax_optimization_level": "UNKNOWN", "jax_memory_fitting_level": "O2",
                      "jax_default_matmul_precision": None}


def _compiler_settings() -> dict[str, Any]:
    """This process's settings of how XLA compiles, where they differ from
    JAX's defaults: ``jax.config``'s efforts, optimization and memory-fitting
    levels and default matmul precision, and the ``XLA_FLAGS`` and
    ``LIBTPU_INIT_ARGS`` environment variables (name -> value)."""
    found = {name: getattr(jax.config, name) for name, default in _COMPILER_DEFAULTS.items()
             if getattr(jax.config, name, default) != default}
    return found | {name: os.environ[name] for name in ("XLA_FLAGS", "LIBTPU_INIT_ARGS") if os.environ.get(name)}


def named_replay_error(err: ReplayMismatchError, network, env, ppo: PPOConfig,
                       compiler_options: dict | None = None) -> ReplayMismatchError:
    """The health check's replay mismatch with the module named: the
    carry leaf the replay first departs from and the module that owns it
    (:func:`~nnx_ppo.algorithms._replay_diagnosis.diagnose_replay`, one small
    rollout of ``network`` on ``env`` at the run's precision and unroll).
    If that rollout replays within 1e-5, no module is to blame there: the
    error says so and names the compiler settings (:func:`_compiler_settings`,
    and the run's ``compiler_options``) that are not JAX's defaults (on a TPU v5e
    ``JAX_EXEC_TIME_OPTIMIZATION_EFFORT=-1`` made XLA compile the rollout's
    and the replay's steps differently). ``err`` as it is if the diagnosis
    fails or finds a difference above 1e-5 it cannot place."""
    from nnx_ppo.algorithms._replay_diagnosis import diagnose_replay

    n_envs, tolerance = min(ppo.n_envs, 8), 1e-5
    try:
        found = diagnose_replay(network, env, n_envs=n_envs, rollout_length=ppo.rollout_length,
                                n_minibatches=2 if n_envs % 2 == 0 else 1, tolerance=tolerance,
                                precision=ppo.precision, replay_unroll=ppo.replay_unroll)
    except ReplayMismatchError as named:  # a module writing a variable, named when the replay compiles
        return named
    except Exception:  # noqa: BLE001 -- the diagnosis is best effort; the mismatch itself stands
        return err
    if found.first_divergence is not None:
        return ReplayMismatchError(f"{err} First divergence: {found.first_divergence}")
    if not found.within(tolerance):
        return err
    own = {"TrainConfig.compiler_options": compiler_options} if compiler_options else {}
    settings = ", ".join(f"{name}={value!r}" for name, value in (_compiler_settings() | own).items())
    cause = (f"This process compiles with settings other than JAX's defaults ({settings}); under some, XLA "
             "compiles the rollout's and the replay's steps differently (docs/scale.md, 'Compiler settings')."
             if settings else "No compiler setting differs from JAX's defaults; please report it, with the "
             "run's config.")
    return ReplayMismatchError(
        f"{err} But a fresh rollout of the trained network ({n_envs} envs) replayed within {tolerance:g}, so no module "
        f"was found breaking those rules: the difference comes from how this run's program computes. {cause}")


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
        :func:`~nnx_ppo.algorithms.population.population_step`).
      failed_member_row: for a batch, ``failed_member_row(row) -> row or
        None``: what of a failed member's iteration row is still logged
        (e.g. :func:`~nnx_ppo.algorithms.population.failed_member_row`: PBT reviving
        it); None: nothing.
      first_rows: for one run, ``first_rows() -> [(env_steps, metrics), ...]``:
        rows the initial state made (e.g. distillation's evaluation before
        the first update), logged before the first iteration's.
      shapes_ahead: ``initial_state`` may run under ``jax.eval_shape`` (it
        only builds arrays: no side effects, no module changed, no value
        read on the host), so that the training program can compile from
        its shapes while the state is built (:func:`compile_ahead`).
    """

    initial_state: Callable[[Any, Any, TrainConfig], TrainingState]
    iteration: Callable[[Any, Any, PPOConfig], Iteration]
    run_record: dict[str, Any] | None = None
    population_step: Callable | None = None
    failed_member_row: Callable[[dict[str, float]], dict[str, float] | None] | None = None
    first_rows: Callable[[], list[tuple[int, dict[str, float]]]] | None = None
    shapes_ahead: bool = False


class TrainOptions(TypedDict, total=False):
    """The keyword arguments every trainer takes
    (:func:`train_ppo`,
    :func:`~nnx_ppo.algorithms.population.train_seeds`,
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
      run: an open :class:`~nnx_ppo.algorithms._outputs.RunOutput` to write
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


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns per member: what :func:`train_ppo` returns
    (and :func:`~nnx_ppo.algorithms.population.train_seeds` per seed).

    Attributes:
      state: the final :class:`TrainingState` (the network was updated in
        place too); for a failed seed, the state of its last healthy iteration.
      metrics: metrics of the last iteration.
      eval_history: ``(env_steps, eval metrics)`` of every evaluation.
      total_steps: env steps trained (a failed seed's: up to its last healthy iteration).
      total_iterations: iterations run (likewise).
      compile_seconds: time of the first (compiling) call (with the program
        compiled ahead, :func:`compile_ahead`, what was left of its compile).
      failure: for a seed of a batch whose health failed (non-finite values or a
        replay mismatch), where and why (a :class:`Failure`);
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
    ``seed``, and its :data:`~nnx_ppo.algorithms._hyperparameters.PER_MEMBER`
    numbers ride in its state; ``config`` gives everything the members share.

    ``state`` (continue from it) and ``on_evaluation`` (see
    :func:`train_ppo`) are for a single run;
    ``options`` are the :class:`TrainOptions`.
    """
    unknown = sorted(set(options) - set(TrainOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; a trainer takes "
                        f"{', '.join(TrainOptions.__annotations__)} (see nnx_ppo.algorithms.trainer.TrainOptions)")
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
    check_footprint(env, team.networks[0], config.ppo, len(team.names), len(devices))
    record = dict(algorithm.run_record or {})
    metadata = dict(options.get("checkpoint_metadata") or {})
    if team.stacked:
        metadata["seeds"] = team.names
    if members is not None:
        record["members"] = metadata["members"] = [member_entry(c) for c in team.configs]
    with contextlib.ExitStack() as stack:
        if output is None and (run_dir is not None or options.get("progress")):
            output = run_layer().open_output(
                run_dir, progress=bool(options.get("progress")), train_env=env, eval_env=eval_env,
                network_spec=network_spec, network=team.networks[0], config=config,
                seeds=team.names if team.stacked else None, resuming=resume_from is not None)
            stack.callback(output.close)
        if output is not None and output.checkpoint_dir is not None:
            checkpoint_dir = output.checkpoint_dir
        if checkpoint_dir is not None and resume_from is None:
            check_fresh_checkpoint_dir(checkpoint_dir)
        ahead = None
        if state is None:
            if resume_from is None:  # (a resume's checks need the state: an error there would wait for the compile)
                ahead = compile_ahead(algorithm, env, config, team, devices, population=members is not None)
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
        return _run(algorithm, env, eval_env, config, team, devices, state,
                    log=log, checkpoint_dir=checkpoint_dir, checkpoint_metadata=metadata or None,
                    on_evaluation=on_evaluation, should_stop=options.get("should_stop"),
                    failed_before=earlier_failures, record_failure=None if output is None else output.record_failure,
                    ahead=ahead)


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


def _run(algorithm: Algorithm, env, eval_env, config: TrainConfig, team: Members, devices, state: TrainingState, *,
         log, checkpoint_dir: str | None, checkpoint_metadata: dict | None, on_evaluation, should_stop,
         failed_before: dict[Any, Failure], record_failure,
         ahead: concurrent.futures.Future | None = None) -> list[TrainResult]:
    """Place and compile, then drive the iterations with their hooks (steps
    2-5 above). Every member fails alone, kept at its last healthy state; one
    plain run then raises its failure.

    Where the results go besides the networks and :class:`TrainResult`\\ s:
    ``log(metrics, env_steps, name)`` for every member's iteration and
    evaluation rows (None: nothing logged); ``checkpoint_dir`` and
    ``checkpoint_metadata``: where and with what the whole state is saved
    (None: no checkpoints, no best policies); ``on_evaluation(policy,
    env_steps)`` (one run only); ``should_stop``: polled between compiled
    calls; ``failed_before``: a resumed run directory's failures (name ->
    :class:`Failure`): they stay failures; ``record_failure(failure, name)``
    writes each new failure into the run directory; ``ahead``: the training
    program compiled ahead (:func:`compile_ahead`), used where it takes the state."""
    ppo = config.ppo
    stop = should_stop
    if process_count() > 1:  # a stop asked for in one process stops every process at the same iteration
        stop = lambda: any_process(should_stop is not None and should_stop())  # noqa: E731
    state = donatable(state)
    iterations = np.atleast_1d(np.asarray(state.iteration))  # read before the state spans other processes
    start_iteration = int(np.max(iterations))
    state, ppo, shardings, mesh = place(state, ppo, devices, seed_batch=team.stacked,
                                        by_seed=team.stacked and config.shard_seeds)
    train_fn = training_program(algorithm, env, config, team, ppo, shardings)

    last_rows: dict[int, dict[str, float]] = {}
    recorded: set[int] = set()  # the failed members whose failure the run directory holds

    def log_failed(i: int, row: dict[str, float], steps: int) -> None:
        """Record member ``i``'s failure once; then log only what the algorithm keeps of its rows."""
        if i not in recorded:
            recorded.add(i)
            if record_failure is not None:
                record_failure(driver.failures[i], team.names[i])
        kept = None if algorithm.failed_member_row is None else algorithm.failed_member_row(row)
        if kept and log is not None:
            log(kept, steps, team.names[i])

    def log_members(row: dict[str, Any], steps: int) -> None:
        for i, name in enumerate(team.names):
            if i not in driver.failures:
                own = member_row(row, i)
                if not any(k.startswith("eval/") for k in own):
                    last_rows[i] = own
                if log is not None:
                    log(own, steps, name)
        for i in driver.failures:  # (after the healthy members' rows of the step)
            log_failed(i, member_row(row, i), steps)

    evaluate = _run_evaluation(config, team, eval_env, mesh, on_evaluation, train_fn if ahead is None else None,
                               state)
    if ahead is not None:
        train_fn = program_or(ahead, train_fn)
    if evaluate is not None and checkpoint_dir:
        evaluate = best_policy_hook(evaluate, config, checkpoint_dir, checkpoint_metadata,
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
            checkpoint=checkpoint_hook(config, checkpoint_dir, checkpoint_metadata) if (
                checkpoint_dir) else None,
            checkpoint_every_steps=config.checkpoint_every_steps,
            should_stop=stop,
            stop_may_lag=getattr(should_stop, "may_lag_one_call", False),
        ),
    )
    # A member that failed before the resumed step stays failed.
    driver.failures.update(earlier_failures(failed_before, team.names,
                                             start_iteration * ppo.steps_per_iteration))
    recorded.update(driver.failures)
    try:
        with _named_module_errors(team.networks[0]):
            result = driver.run()
    finally:
        # The networks get (copies of) the latest state, also when training
        # stops with another exception; the state stays donatable.
        write_back(team, driver.state, mesh)
    if not team.stacked and driver.failures:
        raise run_failure(driver.failures[0], team.networks[0], env, ppo, config.compiler_options)
    return _results(team, result, replicated(result.state, mesh) if team.stacked else result.state,
                    driver.failures, last_rows, ppo)


def _run_evaluation(config: TrainConfig, team: Members, eval_env, mesh, on_evaluation, train_fn,
                    state: TrainingState) -> Callable[[TrainingState, int], dict] | None:
    """The run's :func:`evaluation_hook` (None with evaluation off). On an
    accelerator (:func:`compiles_beside_training`) its program compiles
    beside the training program's, which is traced and lowered first
    (:func:`lower_training_program`; ``train_fn`` None: it is already
    compiling, :func:`compile_ahead`), so that the evaluation's program
    traces while the training program compiles."""
    if not config.eval.enabled:
        return None
    beside = compiles_beside_training()
    if beside and train_fn is not None:
        with _named_module_errors(team.networks[0]):
            lower_training_program(train_fn, state)
    return evaluation_hook(config, team.networks[0], eval_env, [c.seed for c in team.configs] if team.stacked else None,
                           mesh, on_evaluation, ahead=state if beside else None)


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


# ----------------------------------------------------------------------------------------------------------------- PPO
# The one trainer with PPO's first state and iteration (nnx_ppo.algorithms.ppo).

PPO = Algorithm(initial_state=new_training_state, iteration=make_iteration, shapes_ahead=True)
"""PPO for :func:`train`: its first state and its iteration
(:mod:`nnx_ppo.algorithms.ppo`); also used by
:func:`~nnx_ppo.algorithms.population.train_seeds` and
:func:`~nnx_ppo.algorithms.population.train_population`."""


def train_ppo(
    env,
    network,
    config: TrainConfig,
    *,
    state: TrainingState | None = None,
    on_evaluation: Callable[[NetworkFn, int], None] | None = None,
    **options: Unpack[TrainOptions],
) -> TrainResult:
    """Train ``network`` on ``env`` with PPO; the network is updated in place.

    Args:
      env: an env with the ``reset(key)`` / ``step(state, action)`` API
        (see :mod:`nnx_ppo.envs`), or anything :func:`~nnx_ppo.envs.as_env` accepts.
      network: a :class:`StatefulModule` whose output is a
        :class:`PPONetworkOutput` (e.g. from :mod:`nnx_ppo.networks.factories`),
        or its name, built here from ``config.seed``: ``"mlp"``, ``"lstm"``,
        ``"gru"`` (the default preset's width), your function as
        ``"MODULE:FUNCTION"`` or ``"FILE.py:FUNCTION"`` (called as
        ``function(env, rngs)``), or a :class:`~nnx_ppo.network_spec.NetworkSpec`.
        A named network lets ``nnx-ppo eval`` and ``--resume`` rebuild a
        ``run_dir``'s network; the trained one is ``result.network``.
      config: the :class:`TrainConfig`.
      state: continue from this training state instead of a fresh one.
      on_evaluation: called after every evaluation as
        ``on_evaluation(policy, env_steps)`` with the evaluated policy (a
        :class:`NetworkFn` in eval mode), e.g. to record a video of it.
      **options: the :class:`TrainOptions`
        (``log_fn``, ``eval_env``, ``checkpoint_dir``, ``resume_from``,
        ``checkpoint_metadata``, ``should_stop``, ``run_dir``, ``progress``).

    Raises:
      NonFiniteError: NaN/inf in rewards, observations or the loss, at the
        iteration where it happened; the network then holds the last finite
        parameters (those of the iteration before).
      ReplayMismatchError: the loss replay did not reproduce the rollout (a
        module breaks the randomness rules).
    """
    [result] = train(PPO, env, config, network=network, state=state, on_evaluation=on_evaluation, **options)
    return result


# ----------------------------------------------------------------------------- the hooks


def evaluation_hook(config: TrainConfig, network, eval_env, seeds: list[int] | None, mesh,
                     on_evaluation: Callable[[NetworkFn, int], None] | None,
                     ahead: TrainingState | None = None) -> Callable[[TrainingState, int], dict]:
    """Evaluation of the state in ``network``'s eval mode (every seed of a
    batch vmapped; metrics ``[S]`` then), a seed's key the same whether it
    trains alone or in a batch; then ``on_evaluation(policy, env_steps)``
    (one run only). With a ``mesh`` the metrics come back replicated
    (readable by every process).

    With ``ahead`` (a state of the shapes and placement the evaluations will
    see), the evaluation's program starts compiling now on a thread of its
    own (:func:`compile_in_background`), beside the training program's
    compile, and the first evaluation waits only for what is left of it."""
    graphdef = NetworkFn.of(network, config.eval.deterministic).graphdef
    ev = config.eval

    def one(params, rest, key):
        policy = NetworkFn(graphdef, params, rest)
        with compute_precision(config.ppo.precision):
            return episode_metrics(run_episodes(eval_env, policy, key, ev.n_envs, ev.max_episode_length))

    out = {} if mesh is None else {"out_shardings": NamedSharding(mesh, PartitionSpec())}
    evaluate = jax.jit(one if seeds is None else jax.vmap(one), **out)

    def keys_at(steps: int) -> jax.Array:
        keys = [jax.random.fold_in(jax.random.key(s + 1), steps) for s in seeds or [config.seed]]
        return keys[0] if seeds is None else jnp.stack(keys)

    compiling = None if ahead is None else compile_in_background(evaluate, ahead.params, ahead.rest, keys_at(0))

    def hook(state: TrainingState, steps: int) -> dict:
        nonlocal compiling
        args = (state.params, state.rest, keys_at(steps))
        program = None if compiling is None else compiling.result()
        try:
            out = evaluate(*args) if program is None else program(*args)
        except (TypeError, ValueError):  # (raised before it runs: arguments of other types or placements than
            compiling, out = None, evaluate(*args)  # the program's; compiled for them, and raising a real error)
        metrics = {k: _host_value(v) for k, v in out.items()}
        if on_evaluation is not None and seeds is None:
            on_evaluation(NetworkFn(graphdef, state.params, state.rest), steps)
        return metrics

    return hook


def compiles_beside_training() -> bool:
    """Whether a run compiles its evaluation's program on a thread beside the
    training program's compile (:func:`evaluation_hook`'s ``ahead``): on an
    accelerator, whose host's cores are otherwise idle while XLA compiles.
    Not on a CPU, where the same cores compile both programs: there it saved
    no wall time (the rodent preset on 2 cores, first evaluation at 126 s
    either way) and raised the peak memory from 2.8 to 4.6 GB."""
    return jax.default_backend() != "cpu"


@contextlib.contextmanager
def _named_module_errors(network):
    """Flax's error for a module that breaks NNX's tracing rules, raised
    inside the ``with``, as :func:`rule_breaking_module_error` names it for ``network``."""
    try:
        yield
    except flax_errors.TraceContextError as err:
        raise rule_breaking_module_error(err, network) from None


def training_program(algorithm: Algorithm, env, config: TrainConfig, team: Members, ppo: PPOConfig, shardings):
    """The run's iterations as one program (:func:`~nnx_ppo.algorithms.ppo.compile_iterations`),
    with ``ppo`` and ``shardings`` as :func:`~nnx_ppo.algorithms.distributed.place` gives them."""
    return compile_iterations(algorithm.iteration(env, team.graphdef, ppo), config.iterations_per_call,
                              batched_seeds=team.stacked, shardings=shardings, seed_batching=config.seed_batching,
                              population_step=algorithm.population_step, compiler_options=config.compiler_options)


def compile_ahead(algorithm: Algorithm, env, config: TrainConfig, team: Members, devices,
                  population: bool) -> concurrent.futures.Future | None:
    """On an accelerator (:func:`compiles_beside_training`) with one device,
    for an algorithm whose initial state can be shaped ahead
    (:attr:`Algorithm.shapes_ahead`), trace and lower the training program
    for the shapes of the state :func:`initial_state` will build
    (``jax.eval_shape``: nothing runs) and start compiling it on a thread of
    its own (:func:`compile_in_background`), so that the initial state's own
    programs compile and run meanwhile (on a TPU v5e 7-11 s of a run's start
    at the users' scale, bench/README.md, "Seventeenth sitting"), and the
    evaluation's program traces only after the training program has been
    lowered (as :func:`lower_training_program` orders it otherwise). The
    future gives the compiled program, or None; the run calls it through
    :func:`program_or`. None here (compiled at the first call, as on a CPU)
    with several devices, whose placement
    :func:`~nnx_ppo.algorithms.distributed.place` decides on the state
    itself."""
    if not (algorithm.shapes_ahead and compiles_beside_training() and len(devices) == 1):
        return None
    shapes = jax.eval_shape(lambda: donatable(initial_state(algorithm, env, team, population)))
    train_fn = training_program(algorithm, env, config, team, config.ppo, None)
    return compile_in_background(train_fn, shapes, jax.ShapeDtypeStruct((), jnp.int32), lower_now=True)


def program_or(ahead: concurrent.futures.Future, train_fn) -> Callable:
    """``train_fn(state, n)`` that calls the program compiled ahead
    (:func:`compile_ahead`) instead, once it is ready, unless it failed to
    compile or refuses the arguments (other shapes or placements than the
    shapes it was compiled for; raised before anything runs, so nothing is
    donated): then ``train_fn``, compiled at its first call, for good."""
    program = None

    def call(state, n):
        nonlocal program
        if program is None:
            program = ahead.result() or train_fn
        if program is not train_fn:
            try:
                return program(state, n)
            except (TypeError, ValueError):
                program = train_fn
        return train_fn(state, n)

    return call


def lower_training_program(train_fn, state: TrainingState) -> None:
    """Trace and lower ``train_fn`` (:func:`~nnx_ppo.algorithms.ppo.compile_iterations`'s)
    for ``state`` now; JAX keeps the lowering, so the first call only compiles it.
    A run that compiles its evaluation's program beside the training
    program's (:func:`evaluation_hook`'s ``ahead``) does this first: tracing
    and lowering run Python and hold its lock, XLA's compile does not, so the
    evaluation's program then traces while the training program compiles,
    not while it traces (on a TPU v5e the users' rodent preset's training
    program took 185 s to its first call with both traced at once, 165 s
    with no evaluation beside it)."""
    train_fn.lower(state, jnp.zeros((), jnp.int32))


def compile_in_background(jitted, *args, lower_now: bool = False) -> concurrent.futures.Future:
    """Start compiling ``jitted`` (a ``jax.jit`` function) for ``args`` on a
    thread of its own; the returned future gives the compiled program
    (``jax.stages.Compiled``, called like ``jitted`` with arguments of the
    same shapes and placements), or None if the compile failed (left for a
    later ``jitted(*args)`` to raise). The program is kept rather than left
    in JAX's caches, whose entries can be evicted or collected before it is
    used. Only the arguments' shapes, dtypes and placements are read, here,
    before the thread starts (so ``args`` may be donated right after). The
    thread is no daemon: a process that ends while it compiles (a run that
    fails before its first evaluation) waits for the compile to finish
    rather than tear the compiler down under it. With ``lower_now`` the
    program is traced and lowered here, before the thread starts (both run
    Python and hold its lock; XLA's compile on the thread does not)."""
    structs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(  # (an array not committed to its device lowers without)
        a.shape, a.dtype, sharding=a.sharding if getattr(a, "committed", True) else None), args)
    program: concurrent.futures.Future = concurrent.futures.Future()
    lowered = None
    if lower_now:
        try:
            lowered = jitted.lower(*structs)
        except Exception:  # noqa: BLE001 (the later call raises it, with its own traceback)
            program.set_result(None)
            return program

    def compile_() -> None:
        try:
            program.set_result((jitted.lower(*structs) if lowered is None else lowered).compile())
        except Exception:  # noqa: BLE001 (the later call raises it, with its own traceback)
            program.set_result(None)

    threading.Thread(target=compile_, name="nnx_ppo-compile").start()
    return program


def best_policy_hook(evaluate: Callable[[TrainingState, int], dict], config: TrainConfig, directory: str,
                      metadata: dict | None, seeds: list[int] | None, mesh,
                      failed: Callable[[], dict]) -> Callable[[TrainingState, int], dict]:
    """``evaluate``, then save each policy (each seed's of a batch, unless
    it failed) whose mean evaluation return is at least its best so far
    (also across a resume) as the best policy
    (:func:`~nnx_ppo.algorithms.checkpointing.best_policy_dir`): parameters
    and statistics only, with the evaluation in its metadata."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

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
            checkpointing.save_policy(paths[i], params, rest, config, step=steps, metadata={
                **base, "eval": member_row(metrics, i), **({} if seeds is None else {"seed": seeds[i]})})
            best[i] = float(returns[i])
        return metrics

    return hook


def checkpoint_hook(
    config: TrainConfig, directory: str, metadata: dict | None
) -> Callable[[TrainingState, int], None]:
    """Save the whole training state into ``directory`` (a ``RuntimeError``
    in one line if something replaced the directory during the run)."""

    def save(state: TrainingState, steps: int) -> None:
        import nnx_ppo.algorithms.checkpointing as checkpointing

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


# ----------------------------------------------------------------------------- the driver loop
# The only Python loop: call the compiled fn(state, n) -> (state, IterationOutput), which runs n iterations in one call
# (nnx_ppo.algorithms.ppo.make_train_fn), check the health flags (ppo.Health), and run the hooks (log every iteration,
# evaluate and checkpoint on their schedules, stop on request) between calls.


@dataclasses.dataclass(frozen=True)
class Failure:
    """Where and why one seed of a batch stopped training (its state stays
    at the last healthy iteration, ``iteration - 1``).

    Attributes:
      iteration: the iteration whose health failed (1-based, as counted by the driver).
      env_steps: env steps at the end of that iteration.
      error: the :class:`NonFiniteError` or :class:`ReplayMismatchError` it would raise alone.
    """

    iteration: int
    env_steps: int
    error: Exception


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What the driver does between compiled calls (every field optional).

    Attributes:
      log: ``log(metrics, env_steps)`` for every iteration's metrics and every evaluation.
      evaluate: ``evaluate(state, env_steps) -> metrics``; run after the first
        call, every ``eval_every_steps`` and at the end.
      eval_every_steps: env steps between evaluations.
      checkpoint: ``checkpoint(state, env_steps)``; run every
        ``checkpoint_every_steps`` and once at the end (if not just saved).
      checkpoint_every_steps: env steps between checkpoints (None: only at the end).
      should_stop: polled after every call; True ends training early.
      stop_may_lag: a stop may end training one call late (a stop on
        request, as Ctrl-C), so each call can go out before the last one's
        results are read; False: right after the call it answered True for.
    """

    log: Callable[[dict[str, float], int], None] | None = None
    evaluate: Callable[[Any, int], dict[str, float]] | None = None
    eval_every_steps: int | None = None
    checkpoint: Callable[[Any, int], None] | None = None
    checkpoint_every_steps: int | None = None
    should_stop: Callable[[], bool] | None = None
    stop_may_lag: bool = False


@dataclasses.dataclass
class DriverResult:
    """What :meth:`Driver.run` returns.

    Attributes:
      state: the last training state.
      metrics: the last iteration's metrics.
      eval_history: ``(env_steps, metrics)`` of every evaluation.
      iterations: iterations completed (counting those before the start).
      compile_seconds: wall time of the first (compiling) call.
    """

    state: Any
    metrics: dict[str, float]
    eval_history: list[tuple[int, dict[str, float]]]
    iterations: int
    compile_seconds: float


def _host_value(x: Any) -> Any:
    """A float for a scalar; a NumPy array for a metric with a seed axis."""
    return float(x) if np.ndim(x) == 0 else np.asarray(x, np.float64)


def _host_rows(output: Any, n: int) -> list[tuple[Any, dict[str, Any]]]:
    """Stacked ``[max_iterations, ...]`` outputs of one call (an
    :class:`~nnx_ppo.algorithms.ppo.IterationOutput`) to ``n`` host rows ``(health, metrics)``."""
    host = jax.device_get(output)
    return [(jax.tree.map(lambda x, i=i: np.asarray(x)[i], host.health),
             {k: _host_value(np.asarray(v)[i]) for k, v in host.metrics.items()}) for i in range(n)]


class Driver:
    """Run a compiled ``train_fn(state, n)`` until ``total_iterations`` are done.

    ``driver.state`` is always the latest state (also after an exception or
    an interrupt between calls), so the caller can keep what was trained.

    Every member fails alone: the compiled iteration keeps a failing member
    at its last healthy state
    (:func:`~nnx_ppo.algorithms.ppo.keep_last_healthy`), its first
    :class:`Failure` goes into ``driver.failures`` (member index -> failure)
    and the others train on; the loop ends early when every member has
    failed (one plain run: at its failure).

    Args:
      train_fn: compiled ``fn(state, n) -> (state, IterationOutput)`` with
        ``[iterations_per_call]``-stacked outputs (rows ``>= n`` unused).
      state: the state to start from (donated to ``train_fn``).
      start_iteration: iterations already done in ``state``.
      total_iterations: iterations to reach.
      iterations_per_call: the most iterations one call runs.
      steps_per_iteration: env steps per iteration (for logging and schedules).
      hooks: see :class:`Hooks`.
      member_iterations: each member's completed iterations in ``state`` (a
        member that failed before stays behind the others; default: one
        member at ``start_iteration``); failures count each member's own iterations.
      stacked: whether the state and the health have a leading member axis.
    """

    def __init__(self, train_fn: Callable, state: Any, *, start_iteration: int, total_iterations: int,
                 iterations_per_call: int, steps_per_iteration: int, hooks: Hooks = Hooks(),
                 member_iterations: list[int] | None = None, stacked: bool = False):
        self.train_fn = train_fn
        self.state = state
        self.iteration = start_iteration
        self.start_iteration = start_iteration
        self.total_iterations = total_iterations
        self.iterations_per_call = iterations_per_call
        self.steps_per_iteration = steps_per_iteration
        self.hooks = hooks
        self.member_iterations = [start_iteration] if member_iterations is None else list(member_iterations)
        self.stacked = stacked
        self.failures: dict[int, Failure] = {}

    @property
    def steps(self) -> int:
        """Env steps done so far."""
        return self.iteration * self.steps_per_iteration

    def _check(self, health: Any) -> None:
        """Note each newly failed member (``health``: one row's
        :class:`~nnx_ppo.algorithms.ppo.Health`)."""
        for index, start in enumerate(self.member_iterations):
            own = start + self.iteration - self.start_iteration  # the member's iteration, if it has not failed
            error = None if index in self.failures else health.error(own, index if self.stacked else None)
            if error is not None:
                self.failures[index] = Failure(iteration=own, env_steps=own * self.steps_per_iteration, error=error)

    @property
    def all_failed(self) -> bool:
        """Every member has failed."""
        return len(self.failures) == len(self.member_iterations)

    @property
    def state_steps(self) -> int:
        """Env steps the state holds, which names its checkpoint: the driver's,
        or once every member has failed, the latest member's last healthy iteration."""
        if not self.all_failed:
            return self.steps
        return max(f.iteration - 1 for f in self.failures.values()) * self.steps_per_iteration

    def _last_scheduled_evaluation(self) -> int | None:
        """The env step of the last evaluation a run that started from scratch
        made before ``start_iteration`` (None for a fresh run), so that a
        resumed run evaluates where the uninterrupted one does: after the first
        call, then whenever ``eval_every_steps`` have passed since the last one."""
        if self.start_iteration == 0:
            return None
        if self.hooks.eval_every_steps is None:  # only after the first call and at the end
            return self.steps
        iteration, last = 0, None
        while iteration < self.start_iteration:
            iteration += min(self.iterations_per_call, self.start_iteration - iteration)
            steps = iteration * self.steps_per_iteration
            if last is None or steps - last >= self.hooks.eval_every_steps:
                last = steps
        return last

    def _dispatch(self, start: int) -> "_Call":
        """Start the call that runs the iterations from ``start`` on (up to
        ``iterations_per_call``); ``self.state`` becomes its (future) state."""
        n = min(self.iterations_per_call, self.total_iterations - start)
        started = time.perf_counter()
        self.state, output = self.train_fn(self.state, jnp.asarray(n, jnp.int32))
        return _Call(output=output, n=n, started=started)

    def _due(self, iteration: int, last_eval: int | None, last_checkpoint: int) -> tuple[bool, bool]:
        """``(evaluate, checkpoint)``: whether each hook falls due after ``iteration``."""
        steps, hooks = iteration * self.steps_per_iteration, self.hooks
        evaluate = hooks.evaluate is not None and (last_eval is None or iteration == self.total_iterations or (
            hooks.eval_every_steps is not None and steps - last_eval >= hooks.eval_every_steps))
        checkpoint = hooks.checkpoint is not None and hooks.checkpoint_every_steps is not None and (
            steps - last_checkpoint >= hooks.checkpoint_every_steps)
        return evaluate, checkpoint

    def run(self) -> DriverResult:
        """The loop. A failure ends it only when every member has failed (see ``failures``).
        Each call goes out before the last one's results are read (the device
        does not wait for the host), unless a hook reads the state between
        them or a stop must be exact (:class:`Hooks`)."""
        hooks = self.hooks
        last_checkpoint = self.steps
        saved = {self.steps} if self.start_iteration else set()  # env steps with a checkpoint (a resume's own)
        last_eval = self._last_scheduled_evaluation()
        eval_history: list[tuple[int, dict[str, float]]] = []
        last_metrics: dict[str, float] = {}
        compile_seconds = 0.0
        tick = previous = time.perf_counter()
        call = None if self.all_failed or self.iteration >= self.total_iterations else self._dispatch(self.iteration)
        stopping = False
        while call is not None:
            after = self.iteration + call.n
            ahead = None
            if (not stopping and after < self.total_iterations and (hooks.should_stop is None or hooks.stop_may_lag)
                    and not any(self._due(after, last_eval, last_checkpoint))):
                ahead = self._dispatch(after)
            rows = _host_rows(call.output, call.n)
            now = time.perf_counter()
            elapsed = now - max(call.started, previous)  # this call's share of the wall time
            previous = now
            if self.iteration == self.start_iteration:
                compile_seconds = elapsed
            for health, row in rows:
                self.iteration += 1
                self._check(health)
                row["time/steps_per_second"] = call.n * self.steps_per_iteration / max(elapsed, 1e-9)
                row["time/elapsed_seconds"] = now - tick
                last_metrics = row
                if hooks.log is not None:
                    hooks.log(row, self.steps)
            if self.all_failed:
                if ahead is not None:  # it left every (failed) member's state as it was
                    jax.block_until_ready(ahead.output)
                break
            evaluate, checkpoint = self._due(self.iteration, last_eval, last_checkpoint)
            if evaluate:
                metrics = hooks.evaluate(self.state, self.steps)
                eval_history.append((self.steps, metrics))
                last_eval = self.steps
                if hooks.log is not None:
                    hooks.log(metrics, self.steps)
            if checkpoint:
                hooks.checkpoint(self.state, self.steps)
                last_checkpoint = self.steps
                saved.add(self.steps)
            stopping = stopping or (hooks.should_stop is not None and hooks.should_stop())
            if ahead is not None or stopping or self.iteration == self.total_iterations:
                call = ahead
            else:
                call = self._dispatch(self.iteration)
        if hooks.checkpoint is not None and self.state_steps not in saved:
            hooks.checkpoint(self.state, self.state_steps)
        return DriverResult(state=self.state, metrics=last_metrics, eval_history=eval_history,
                            iterations=self.iteration, compile_seconds=compile_seconds)


# A dispatched call: its [iterations_per_call]-stacked output, how many of its iterations count, when it went out.
_Call = collections.namedtuple("_Call", "output n started")


def run_layer() -> RunLayer:
    """The run layer the package root names (:data:`nnx_ppo.algorithms._outputs.RUN_LAYER`)."""
    return importlib.import_module(_outputs.RUN_LAYER)
