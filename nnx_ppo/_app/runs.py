"""What the commands make runs of: the env and network a command's flags
name, and the run directories they read and write (lock one, start one
afresh, read a run's config, env, network and checkpoints back), each
failure a one-line :class:`~nnx_ppo._app.commands.CliError`.

And the process a command runs in (the section at the end): one-line errors
and warnings (:func:`usage_errors` turns an exception of a check into a
usage error, exit code 2), quiet library logs, the compilation cache on
disk, joining a run of several processes, and how every command that trains
ends (:func:`train_into`): training into an open
:class:`~nnx_ppo.runner.Run`, with each way it can end turned into an exit
code and one line, the run directory intact (``train``, ``--seeds``,
``distill``, ``sweep`` and ``resume`` alike).

=====  ==================================================================
code   how training ended
=====  ==================================================================
0      done, or stopped early by Ctrl-C / SIGTERM (a checkpoint is saved)
1      failed: non-finite values, a replay mismatch, an env, checkpoint or disk error
130    aborted by a second Ctrl-C (the last checkpoint is kept)
=====  ==================================================================

What training needs (JAX) is imported when it runs; ``nnx-ppo --help`` imports this module without it."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nnx_ppo import runner as rd
from nnx_ppo._app.commands import (
    DEFAULT_ENV,
    DEFAULT_ENV_KWARGS,
    DEFAULT_HIDDEN_SIZE,
    PROG,
    CliError,
    DistillCommand,
    EvalCommand,
    ExportCommand,
    TrainCommand,
    shell_command,
)
from nnx_ppo.network_spec import NetworkSpec, is_factory_reference, network_kwargs, resolve_factory_reference
from nnx_ppo.runner import PYTHON_NETWORK, Run, StopFlag, pretty_path

__all__ = ["has_checkpoint", "fresh_run_dir", "run_policy_spec", "read_run", "checkpoint_choice", "load_run_network",
           "only_best_policy", "parse_env_kwargs", "prepared", "make_env", "make_envs", "build_network",
           "use_run_code", "run_directory", "resume_changes", "extra_network_kwargs", "network_spec_of",
           "check_distinct_seeds", "usage_errors", "print_error", "print_warning", "format_warning",
           "quiet_library_logs", "compilation_cache", "join_processes", "train_into"]


def only_best_policy(directory: Path) -> bool:
    """The checkpoint directory holds a best policy but no training
    checkpoint (what a run whose checkpoints were deleted, or a disk-full
    run, can leave): evaluable and exportable with ``--best``, not resumable."""
    from nnx_ppo.algorithms.checkpointing import best_policy_dir

    best = best_policy_dir(directory)
    return not has_checkpoint(directory) and best.is_dir() and any(best.iterdir())


def has_checkpoint(directory: Path) -> bool:
    """A complete checkpoint exists (a crashed save's temp dir does not count)."""
    from nnx_ppo.algorithms.checkpointing import latest_checkpoint

    return directory.is_dir() and latest_checkpoint(directory) is not None


def fresh_run_dir(run_dir: Path, overwrite: bool = False) -> None:
    """Check ``run_dir`` for a run that starts from scratch. One that holds
    files no run writes is refused; one that holds any run data
    (config.json, metrics, tb/, checkpoints, a best policy) is refused
    naming what it holds and what to do (resume a run with a training
    checkpoint; ``--overwrite`` deletes the data first). The caller holds
    the directory's lock (:func:`run_directory`)."""
    with usage_errors(ValueError):
        rd.check_writable(run_dir)
    if not run_dir.is_dir():
        return
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in rd.RUN_ENTRIES)
    if foreign:
        shown = ", ".join(foreign[:4]) + (" ..." if len(foreign) > 4 else "")
        raise CliError(f"{run_dir} holds files that no run writes ({shown}); pick another --run-dir (an empty or new "
                       "directory)")
    data = rd.run_data(run_dir)
    if not data:
        return
    if overwrite:
        print_warning(f"--overwrite: deleting what {pretty_path(run_dir)} held ({', '.join(data)})")
        rd.clear_run(run_dir)
        return
    if (run_dir / rd.CONFIG_FILE).exists():
        try:
            rd.read_run_config(run_dir)
        except (FileNotFoundError, ValueError):
            raise CliError(f"{run_dir} holds a config.json that is no nnx-ppo run's ({', '.join(data)}); pick another "
                           "--run-dir, or --overwrite to delete them") from None
    ckpt = run_dir / rd.CHECKPOINT_DIR
    if has_checkpoint(ckpt):
        if not (run_dir / rd.CONFIG_FILE).exists():
            raise CliError(f"{ckpt} already holds {data[-1]} (of another run, without its config.json); a new run "
                           "would prune them: move them away, pick another --run-dir, or --overwrite (deletes them)")
        advice = f"continue it with {shell_command(PROG, 'resume', run_dir)}"
    elif only_best_policy(ckpt):
        advice = (f"it cannot be resumed (only its best policy is left, no training checkpoint); evaluate or export "
                  f"that with {shell_command(PROG, 'eval', run_dir)} --best")
    else:
        advice = "it saved no training checkpoint, so it cannot be resumed"
    raise CliError(f"{run_dir} already holds a run ({', '.join(data)}): {advice}; or start afresh with --overwrite "
                   "(deletes it), or pick another --run-dir")


def run_policy_spec(run_dir: Path, saved: dict[str, Any], step: int | str | None = None
                    ) -> tuple[Any, NetworkSpec, Path]:
    """The env, network spec and checkpoint directory of a ``train`` run
    (whose ``config.json`` is ``saved``), for the checkpoint ``step`` will
    pick (``"best"``: the best policy is enough); a named error when there is
    none, saying what there is instead."""
    ckpt_dir = run_dir / rd.CHECKPOINT_DIR
    if not has_checkpoint(ckpt_dir):
        if not only_best_policy(ckpt_dir):
            raise CliError(f"{run_dir} has no checkpoints (was training stopped before the first one?)")
        if step != "best":
            raise CliError(f"{run_dir} has no training checkpoint left, only its best policy "
                           f"({rd.CHECKPOINT_DIR}/best): give --best")
    env = make_env(saved["env"], saved.get("env_kwargs", {}))
    with usage_errors(TypeError, ValueError):
        spec = NetworkSpec.from_dict({"env": saved["env"], "env_kwargs": saved.get("env_kwargs", {}),
                                      **saved["network"]}, where=f"{run_dir}/config.json")
    if is_factory_reference(spec.kind):
        try:
            resolve_factory_reference(spec.kind)
        except ValueError as e:
            raise CliError(f"{e} (the network of {run_dir})") from None
    return env, spec, ckpt_dir


def read_run(run_dir: Path, rebuild: str | None = None) -> dict[str, Any]:
    """The run's config.json for a command; a one-line usage error if it is
    missing or broken, or (with ``rebuild``, what the command would do) if
    it was trained from Python on an env or network the command line cannot
    rebuild, or on an env name only the training script registered."""
    from nnx_ppo.envs.registry import is_known

    with usage_errors(FileNotFoundError, ValueError):
        saved = rd.read_run_config(run_dir)
    network = saved["network"] if isinstance(saved["network"], dict) else {}
    if rebuild and (PYTHON_NETWORK in network or saved.get("env_rebuildable") is False):
        what = (f"a network object ({network[PYTHON_NETWORK]})" if PYTHON_NETWORK in network
                else f"an env object ({saved['env'].removeprefix('python:')})")
        raise CliError(f"{run_dir} was trained from Python on {what}, which the command line cannot rebuild to "
                       f"{rebuild}; do it from Python (load_policy(run, network=...)), or name the env and network "
                       "when training (train_ppo('ENV', 'FILE.py:FUNCTION', config, run_dir=...))")
    if rebuild and not is_known(saved["env"]):  # (read_run_config checked that it is a string)
        raise CliError(f"{run_dir} was trained on the env {saved['env']!r}, which the script that trained it "
                       f"registered (nnx_ppo.envs.register) and {PROG} does not know; to {rebuild}, run the command "
                       f"through that script (nnx_ppo.cli.main()), or train with the env named by its file "
                       f"({PROG} train path/to/file.py:CLASS)")
    return saved


def use_run_code(cmd) -> None:
    """Before a command rebuilds a run (resume, eval, export, distill's
    teacher): the files of the user's env and network that moved or changed
    since it was trained are said in one line each, and loaded from the
    run's copies (``source/``) from now on, or as they are now with
    ``--current-code``."""
    from nnx_ppo.envs.registry import use_run_copies

    run, current = None, False
    if isinstance(cmd, TrainCommand):
        run, current = cmd.run.resume, cmd.run.current_code
    elif isinstance(cmd, DistillCommand):
        run = cmd.teacher_run
    elif isinstance(cmd, (EvalCommand, ExportCommand)):
        run, current = cmd.run_dir, cmd.current_code
    if run is None:
        return
    try:
        recorded = rd.read_run_config(run).get("source") or {}
    except (FileNotFoundError, ValueError):
        return  # (the command itself says what is wrong with the run)
    for note in use_run_copies(Path(run), recorded, current):
        print_warning(note)


def checkpoint_choice(cmd) -> int | str | None:
    """The checkpoint ``--best`` / ``--step N`` pick (None: the final one)."""
    if cmd.best and cmd.step is not None:
        raise CliError("--best and --step each pick a checkpoint; give one of them")
    return "best" if cmd.best else cmd.step


def load_run_network(ckpt_dir: Path, network: Any, seed: int | None = None, step: int | str | None = None,
                     what: str = ""):
    """``load_network`` for a command: a missing checkpoint or one that does
    not match the run's config.json is a usage error (2), a run none of whose
    checkpoints reads back a failure (1); one line each, prefixed by ``what``."""
    from nnx_ppo.network_spec import load_network

    try:
        return load_network(str(ckpt_dir.resolve()), network, seed=seed, step=step)
    except (FileNotFoundError, ValueError) as e:
        raise CliError(what + str(e).splitlines()[0]) from None
    except RuntimeError as e:  # CheckpointError
        raise CliError(what + str(e).splitlines()[0], code=1) from None


def parse_env_kwargs(text: str | None, env: str, flag: str = "--env-kwargs") -> dict[str, Any]:
    """The JSON object ``flag`` gave (``--env-kwargs``: the default env's own
    when not given); a usage error in one line when it is not one."""
    if text is None:
        return dict(DEFAULT_ENV_KWARGS) if env == DEFAULT_ENV and flag == "--env-kwargs" else {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{flag} must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object, got {text!r}")
    return value


def prepared(cmd, saved: dict[str, Any] | None):
    """``(cmd, env_kwargs, train_env_kwargs)`` of ``train`` or ``sweep``: the
    command with a FILE.py:NAME env made absolute (as the run records it), and
    its env's keyword arguments; with ``--resume`` what the flags change of
    the run ``saved`` is checked and printed (:func:`resume_changes`)."""
    from nnx_ppo.envs.registry import normalized

    cmd = dataclasses.replace(cmd, env=normalized(cmd.env))
    env_kwargs = parse_env_kwargs(cmd.setup.env_kwargs, cmd.env)
    train_env_kwargs = parse_env_kwargs(cmd.setup.train_env_kwargs, cmd.env, "--train-env-kwargs")
    if cmd.run.resume is not None:
        resume_changes(cmd, saved, env_kwargs, train_env_kwargs)
    return cmd, env_kwargs, train_env_kwargs


def make_env(spec: str, kwargs: dict[str, Any]):
    from nnx_ppo.envs.registry import make

    try:
        return make(spec, **kwargs)
    except ValueError as e:
        raise CliError(str(e).splitlines()[0] if str(e) else f"invalid environment {spec!r}") from None
    except TypeError as e:
        raise CliError(f"bad keyword arguments for environment {spec!r}: {e}") from None
    except ImportError as e:
        raise CliError(str(e), code=1) from None


def make_envs(spec: str, env_kwargs: dict[str, Any], train_env_kwargs: dict[str, Any]):
    """``(train_env, eval_env)`` (:func:`nnx_ppo.runner.training_env_kwargs`
    says how the training env differs)."""
    return make_env(spec, rd.training_env_kwargs(env_kwargs, train_env_kwargs)), make_env(spec, env_kwargs)


def build_network(spec: NetworkSpec, env, cmd):
    """``spec.build(env)``; a network that cannot be built (a bad size, an
    unknown ``--network-kwargs`` key) is a usage error in one line."""
    with usage_errors(ValueError, TypeError, prefix=f"cannot build the network {cmd.setup.network} for {cmd.env}: "):
        return spec.build(env)


def network_spec_of(cmd, env_kwargs: dict[str, Any], seed: int) -> NetworkSpec:
    if cmd.setup.hidden_size <= 0:
        raise CliError(f"--hidden-size must be positive, got {cmd.setup.hidden_size}")
    with usage_errors(ValueError, prefix="--network: "):
        spec = NetworkSpec.sized(cmd.env, cmd.setup.network, cmd.setup.hidden_size, seed=seed, env_kwargs=env_kwargs)
        if is_factory_reference(spec.kind):
            resolve_factory_reference(spec.kind)
    extra = parse_env_kwargs(cmd.setup.network_kwargs, cmd.env, "--network-kwargs")
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **extra}) if extra else spec


def extra_network_kwargs(network: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a saved network (config.json's ``network``)
    that ``--network-kwargs`` gave: those its width does not set."""
    sized = network_kwargs(network["kind"], int(network.get("hidden_size") or DEFAULT_HIDDEN_SIZE))
    return {k: v for k, v in (network.get("kwargs") or {}).items() if k not in sized}


def resume_changes(cmd, saved: dict[str, Any], env_kwargs: dict, train_env_kwargs: dict) -> None:
    """Print what resuming the run ``saved`` with ``cmd`` changes
    (``resuming with --ppo.total-steps 2000 (was 1000)``); a change of
    anything that makes the run (the env, the network, the seeds, a config
    field not declared resumable) is a one-line CliError naming the flag."""
    from nnx_ppo.algorithms.config import resume_changes as config_changes

    network = saved["network"]
    kwargs = parse_env_kwargs(cmd.setup.network_kwargs, cmd.env, "--network-kwargs")
    for what, now, before in (
        ("env", cmd.env, saved["env"]),
        ("--network", _normalized_network(cmd.setup.network), network["kind"]),
        ("--hidden-size", cmd.setup.hidden_size, network["hidden_size"]),
        ("--network-kwargs", kwargs, extra_network_kwargs(network)),
        ("--env-kwargs", env_kwargs, saved.get("env_kwargs", {})),
        ("--train-env-kwargs", train_env_kwargs, saved.get("train_env_kwargs", {})),
        ("--seeds", list(cmd.seeds), list(saved.get("population", saved).get("seeds", []))),
    ):
        if now != before:
            raise CliError(f"cannot change {what} when resuming ({before!r} in the run, {now!r} given)")
    with usage_errors(ValueError):
        changes = config_changes(saved["config"], cmd.config)
    for name, (before, after) in changes.items():
        print(f"resuming with --{name.replace('_', '-')} {after} (was {before})", flush=True)
    if changes:
        _print_decay_change(cmd, saved)


def _print_decay_change(cmd, saved: dict[str, Any]) -> None:
    """With ``--ppo.learning-rate-decay``: one line when resuming stretches or
    shrinks the decay (its end moves; the rate jumps), with the rate before
    and after at the update the run continues from."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

    before, after = rd.train_config_from_dict(saved["config"], learning_rate=1.0).ppo, cmd.config.ppo
    saved_steps = checkpointing.list_checkpoints(Path(cmd.run.resume) / rd.CHECKPOINT_DIR)
    if not after.learning_rate_decay or not saved_steps or before.total_updates == after.total_updates:
        return
    step = saved_steps[-1][0]
    update = step // before.steps_per_iteration * before.n_epochs * before.n_minibatches
    old, new = (max(0.0, 1.0 - update / ppo.total_updates) for ppo in (before, after))
    rates = (f"{old * after.learning_rate:.3g} to {new * after.learning_rate:.3g}" if "members" not in saved
             else f"{old:.1%} to {new:.1%} of each member's learning rate")
    end, was = (ppo.n_iterations * ppo.steps_per_iteration for ppo in (after, before))
    print(f"resuming changes the learning-rate decay: it now reaches 0 at {end:,} env steps ({after.total_updates:,} "
          f"updates; was {was:,}, {before.total_updates:,}), so at step {step:,} (update {update:,}) the rate goes "
          f"from {rates}", flush=True)


def check_distinct_seeds(seeds) -> list[int]:
    """``seeds`` (none: one run) as distinct valid seeds; a one-line CliError naming ``--seeds`` otherwise."""
    from nnx_ppo.algorithms.config import check_seeds

    with usage_errors(ValueError):
        return check_seeds(seeds, "--seeds") if seeds else []


@contextlib.contextmanager
def run_directory(cmd, saved: dict[str, Any] | None, command: str = "train"):
    """``with run_directory(cmd, saved, command) as run_dir:`` the run
    directory of ``train``, ``sweep`` or ``distill`` (``command``; by default
    ``runs/<env>[-sweep|-distill]-<time>``), locked for the block: a
    directory another process trains into is refused in one line naming its
    pid, a fresh run's is checked (:func:`fresh_run_dir`), a resumed one must
    hold a checkpoint to resume from and writable files."""
    from nnx_ppo.envs.registry import short_name

    check_distinct_seeds(cmd.seeds)
    if cmd.run.resume is None:
        name = short_name(cmd.env) + ("" if command == "train" else f"-{command}")
        run_dir = Path(cmd.run.run_dir) if cmd.run.run_dir else rd.default_run_dir(name)
    elif cmd.run.run_dir is not None and Path(cmd.run.run_dir).resolve() != Path(cmd.run.resume).resolve():
        raise CliError("give either --run-dir or --resume, not both")
    else:
        run_dir = Path(cmd.run.resume)
        if not has_checkpoint(run_dir / rd.CHECKPOINT_DIR):
            again = f"{shell_command(PROG, command, '...', '--run-dir', run_dir)} --overwrite"
            if only_best_policy(run_dir / rd.CHECKPOINT_DIR):
                raise CliError(f"{run_dir} has no training checkpoint to resume from, only its best policy (which "
                               f"holds no optimizer state): evaluate or export it with --best, or start it again: "
                               f"{again}")
            raise CliError(f"{run_dir} has no checkpoints to resume from (it stopped before its first one); start it "
                           f"again: {again}")
    with usage_errors(ValueError):
        lock = rd.RunLock(run_dir).acquire()
    try:
        if cmd.run.resume is None:
            fresh_run_dir(run_dir, cmd.run.overwrite)
        else:
            rd.check_writable(run_dir)
            for path in [run_dir, *(run_dir / name for name in (rd.CONFIG_FILE, rd.METRICS_FILE, rd.CHECKPOINT_DIR))]:
                if path.exists() and not os.access(path, os.W_OK):  # (a resumed run appends to its files)
                    raise CliError(f"cannot resume {run_dir}: {path} is not writable")
        yield run_dir
    finally:
        lock.release()


def _normalized_network(network: str) -> str:
    """``--network`` as config.json records it (a file reference made absolute)."""
    try:
        return NetworkSpec.sized("", network, 1).kind
    except ValueError:
        return network


# ----------------------------- the process: one-line errors and warnings, logs, the cache, processes, how training ends

@contextlib.contextmanager
def usage_errors(*kinds: type[BaseException], prefix: str = ""):
    """``with usage_errors(ValueError, prefix="--grid: "):`` an exception of
    ``kinds`` raised in the block is a usage error: a :class:`CliError` (exit
    code 2) of its message after ``prefix``."""
    try:
        yield
    except kinds as e:
        raise CliError(prefix + str(e)) from None


def print_error(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def print_warning(msg: str) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


_python_format_warning = warnings.formatwarning


def format_warning(message, category, filename, lineno, line=None) -> str:
    """The library's own warnings (e.g. a skipped unreadable checkpoint) as
    one line; others as Python formats them."""
    if category.__module__.startswith("nnx_ppo."):
        return f"{PROG}: warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


def _closed_loop(value) -> bool:
    return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"


def quiet_library_logs() -> None:
    """Failures are reported in one line by the command itself: the logs that
    orbax's background threads write when a checkpoint fails (absl errors,
    asyncio callbacks after the loop closed) are not shown as well."""
    import logging

    for name in ("absl", "concurrent.futures", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    shown, unraisable = sys.excepthook, sys.unraisablehook
    # tensorstore callbacks after a failure raise "Event loop is closed"
    sys.excepthook = lambda kind, value, tb: None if _closed_loop(value) else shown(kind, value, tb)
    sys.unraisablehook = lambda info: None if _closed_loop(info.exc_value) else unraisable(info)


def compilation_cache() -> None:
    """Keep compiled programs on disk between runs
    (:func:`nnx_ppo.algorithms.ppo.enable_compilation_cache`): in the
    folder ``JAX_COMPILATION_CACHE_DIR`` names, else ``~/.cache/nnx_ppo/jax``;
    ``JAX_ENABLE_COMPILATION_CACHE=false`` turns it off. A folder that cannot
    be made is a warning, not an error."""
    import jax

    from nnx_ppo.algorithms.ppo import enable_compilation_cache

    if not jax.config.jax_enable_compilation_cache:
        return
    try:
        enable_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR") or None,
                                 jax.config.jax_persistent_cache_min_compile_time_secs)
    except OSError as e:
        warnings.warn(f"no compilation cache ({e}); every run compiles afresh", stacklevel=2)


def join_processes(cmd: TrainCommand) -> None:
    """``--coordinator-address``: join a run of several processes before
    anything touches a device (``nnx_ppo.algorithms.distributed.initialize``)."""
    flags = cmd.processes
    if flags.coordinator_address is None:
        if flags.num_processes != 1 or flags.process_id != 0:
            raise CliError("--num-processes and --process-id need --coordinator-address HOST:PORT")
        return
    from nnx_ppo.algorithms.distributed import check_same_everywhere, initialize, watch_peers

    with usage_errors(ValueError):
        initialize(flags.coordinator_address, flags.num_processes, flags.process_id, timeout=flags.distributed_timeout)
        # Every process must train the same run: compare a hash of the settings (all but --process-id).
        settings = {**vars(cmd), "processes": dataclasses.replace(flags, process_id=0),
                    "config": rd.train_config_to_dict(cmd.config)}
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
        check_same_everywhere(digest, "settings (flags)")
    # A peer that dies or hangs ends every process within --distributed-timeout, in one line.
    watch_peers(flags.distributed_timeout)


def train_into(run: Run, train: Callable[[StopFlag], Any]) -> tuple[int, Any, bool]:
    """``train(stop)`` into ``run`` (``stop()`` turns True after a Ctrl-C or
    SIGTERM): ``(exit code, its result or None, whether a stop was
    asked)``; ``run`` is closed (its directory released) in every case. A
    usage error (:class:`~nnx_ppo._app.commands.CliError`) passes through, and
    a bad row of a resumed run's metrics.jsonl becomes one (before training)."""
    from nnx_ppo.algorithms.distributed import await_lost_peer, process_count
    from nnx_ppo.algorithms.ppo import FootprintError, NonFiniteError

    stop = StopFlag(run.write)
    code, result = 0, None
    try:  # (a bad metrics row of a resumed run, a config too large for the memory: refused before training)
        with stop, usage_errors(rd.MetricsError, FootprintError):
            result = train(stop)
    except KeyboardInterrupt:
        run.close()
        where = f" is in {pretty_path(run.path / rd.CHECKPOINT_DIR)}" if run.path is not None else " is kept"
        print_error(f"aborted; metrics so far are kept, and the last saved checkpoint (if any){where}")
        code = 130
    except NonFiniteError as e:
        run.close()
        print_error(str(e))
        code = 1
    except (ValueError, OSError, RuntimeError) as e:  # env checks, checkpoints, shapes, the disk
        run.close()
        if process_count() > 1:  # a collective that failed because a peer is gone: the watch names the peer
            await_lost_peer(e)
        print_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        code = 1
    finally:
        run.close()
    return code, result, stop.requested
