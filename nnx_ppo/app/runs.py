"""What the commands make runs of: the env and network a command's flags
name, and the run directories they read and write (lock one, start one
afresh, read a run's config, env, network and checkpoints back), each
failure a one-line :class:`~nnx_ppo.app.commands.CliError`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nnx_ppo.app.commands import DEFAULT_ENV, DEFAULT_ENV_KWARGS, PROG, CliError, print_warning
from nnx_ppo.network_spec import NetworkSpec, is_factory_reference, resolve_factory_reference

__all__ = ["has_checkpoint", "lock_run_dir", "fresh_run_dir", "run_policy_spec", "read_run", "checkpoint_choice",
           "load_run_network", "parse_env_kwargs", "make_env", "build_network",
           "network_spec_of"]


def has_checkpoint(directory: Path) -> bool:
    """A complete checkpoint exists (a crashed save's temp dir does not count)."""
    from nnx_ppo.algorithms.checkpointing import latest_checkpoint

    return directory.is_dir() and latest_checkpoint(directory) is not None


def lock_run_dir(run_dir: Path):
    """The run directory's :class:`~nnx_ppo.run_dir.RunLock`, acquired: a
    directory another process trains into is refused in one line naming its pid."""
    from nnx_ppo import run_dir as rd

    try:
        return rd.RunLock(run_dir).acquire()
    except ValueError as e:
        raise CliError(str(e)) from None


def fresh_run_dir(run_dir: Path) -> Path:
    """``run_dir`` for a run that starts from scratch: refused (naming
    ``PROG resume``) when it holds a run with checkpoints, or
    another run's checkpoints; a run that saved no checkpoint is cleared.
    The caller holds the directory's lock (:func:`lock_run_dir`)."""
    from nnx_ppo import run_dir as rd
    from nnx_ppo.algorithms.checkpointing import held_checkpoints
    from nnx_ppo.progress import pretty_path

    held = held_checkpoints(run_dir / rd.CHECKPOINT_DIR)
    if held is not None and (run_dir / rd.CONFIG_FILE).exists():
        raise CliError(f"{run_dir} already holds a run; continue it with {PROG} resume {run_dir} or pick another "
                       "--run-dir")
    if held is not None:
        raise CliError(f"{run_dir / rd.CHECKPOINT_DIR} already holds {held} (of another run, without its "
                       "config.json); a new run would prune them. Pick another --run-dir, or move them away")
    try:
        rd.check_writable(run_dir)
    except ValueError as e:
        raise CliError(str(e)) from None
    if (run_dir / rd.CONFIG_FILE).exists():  # a start that failed, or a run stopped before its first checkpoint
        print_warning(f"{pretty_path(run_dir)} holds a run that saved no checkpoint; starting it again from scratch")
        rd.clear_run(run_dir)
    return run_dir


def run_policy_spec(run_dir: Path, saved: dict[str, Any]) -> tuple[Any, NetworkSpec, Path]:
    """The env, network spec and checkpoint directory of a ``train`` run
    (whose ``config.json`` is ``saved``); a named error when it has no checkpoint."""
    from nnx_ppo import run_dir as rd

    ckpt_dir = run_dir / rd.CHECKPOINT_DIR
    if not has_checkpoint(ckpt_dir):
        raise CliError(f"{run_dir} has no checkpoints (was training stopped before the first one?)")
    env = make_env(saved["env"], saved.get("env_kwargs", {}))
    try:
        spec = NetworkSpec.from_dict({"env": saved["env"], "env_kwargs": saved.get("env_kwargs", {}),
                                      **saved["network"]}, where=f"{run_dir}/config.json")
    except (TypeError, ValueError) as e:
        raise CliError(str(e)) from None
    if is_factory_reference(spec.kind):
        try:
            resolve_factory_reference(spec.kind)
        except ValueError as e:
            raise CliError(f"{e} (the network of {run_dir})") from None
    return env, spec, ckpt_dir


def read_run(run_dir: Path, rebuild: str | None = None) -> dict[str, Any]:
    """The run's config.json for a command; a one-line usage error if it is
    missing or broken, or (with ``rebuild``, what the command would do) if
    it was trained from Python on an env or network the command line cannot rebuild."""
    from nnx_ppo import run_dir as rd
    from nnx_ppo.runner import PYTHON_NETWORK

    try:
        saved = rd.read_run_config(run_dir)
    except (FileNotFoundError, ValueError) as e:
        raise CliError(str(e)) from None
    network = saved["network"] if isinstance(saved["network"], dict) else {}
    if rebuild and (PYTHON_NETWORK in network or saved.get("env_rebuildable") is False):
        what = (f"a network object ({network[PYTHON_NETWORK]})" if PYTHON_NETWORK in network
                else f"an env object ({saved['env'].removeprefix('python:')})")
        raise CliError(f"{run_dir} was trained from Python on {what}, which the command line cannot rebuild to "
                       f"{rebuild}; do it from Python (load_policy(run, network=...)), or name the env and network "
                       "when training (train_ppo('ENV', 'FILE.py:FUNCTION', config, run_dir=...))")
    return saved


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
    if text is None:
        return dict(DEFAULT_ENV_KWARGS) if env == DEFAULT_ENV and flag == "--env-kwargs" else {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{flag} must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object, got {text!r}")
    return value


def make_env(spec: str, kwargs: dict[str, Any]):
    from nnx_ppo import envs

    try:
        return envs.make(spec, **kwargs)
    except ValueError as e:
        raise CliError(str(e).splitlines()[0] if str(e) else f"invalid environment {spec!r}") from None
    except TypeError as e:
        raise CliError(f"bad keyword arguments for environment {spec!r}: {e}") from None
    except ImportError as e:
        raise CliError(str(e), code=1) from None


def build_network(spec: NetworkSpec, env, cmd):
    """``spec.build(env)``; a network that cannot be built (a bad size, an
    unknown ``--network-kwargs`` key) is a usage error in one line."""
    try:
        return spec.build(env)
    except (ValueError, TypeError) as e:
        raise CliError(f"cannot build the network {cmd.network} for {cmd.env}: {e}") from None


def network_spec_of(cmd, env_kwargs: dict[str, Any], seed: int) -> NetworkSpec:
    if cmd.hidden_size <= 0:
        raise CliError(f"--hidden-size must be positive, got {cmd.hidden_size}")
    try:
        spec = NetworkSpec.sized(cmd.env, cmd.network, cmd.hidden_size, seed=seed, env_kwargs=env_kwargs)
        if is_factory_reference(spec.kind):
            resolve_factory_reference(spec.kind)
    except ValueError as e:
        raise CliError(f"--network: {e}") from None
    extra = parse_env_kwargs(cmd.network_kwargs, cmd.env, "--network-kwargs")
    return dataclasses.replace(spec, kwargs={**spec.kwargs, **extra}) if extra else spec
