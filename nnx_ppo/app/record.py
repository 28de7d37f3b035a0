"""``nnx-ppo eval --list-modules`` and ``nnx-ppo eval --record-activations
PATH [PATH ...] --out FILE.npz`` (see :mod:`nnx_ppo.algorithms.recording`)."""

from __future__ import annotations

from pathlib import Path

from nnx_ppo.app.commands import CliError, EvalCommand
from nnx_ppo.progress import pretty_path

__all__ = ["check_record_flags", "print_module_paths", "check_record_paths", "record_to_file"]


def check_record_flags(cmd: EvalCommand) -> None:
    """Named errors, before anything runs, for ``--record-activations``
    without ``--out`` (or the reverse) and an ``--out`` that is not .npz or
    cannot be written."""
    if cmd.record_activations and cmd.out is None:
        raise CliError("--record-activations needs --out FILE.npz")
    if cmd.out is not None and not cmd.record_activations:
        raise CliError("--out needs --record-activations PATH [PATH ...] (see --list-modules for the paths)")
    if cmd.out is not None and not cmd.out.endswith(".npz"):
        raise CliError(f"--out must end in .npz, got {cmd.out!r}")
    if cmd.out is not None:  # before the recording, not after it
        import os

        folder = Path(cmd.out).resolve().parent
        if not folder.is_dir():
            raise CliError(f"--out: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK) or Path(cmd.out).is_dir():
            raise CliError(f"--out: cannot write {cmd.out} (the folder is not writable, or it is a directory)")


def print_module_paths(network) -> int:
    """Print every recordable module path with its class; returns exit code 0."""
    from flax import nnx

    from nnx_ppo.algorithms.recording import module_paths

    kinds = {"/".join(str(p) for p in path): type(m).__name__ for path, m in nnx.iter_modules(network)}
    print("recordable module paths (for --record-activations):")
    for path in module_paths(network):
        print(f"  {path:<48} {kinds[path]}")
    return 0


def check_record_paths(network, paths: tuple[str, ...]) -> None:
    """A :class:`CliError` naming the first unknown path and listing the valid ones."""
    from nnx_ppo.algorithms.recording import module_paths

    known = module_paths(network)
    for path in paths:
        if path.strip("/") not in known:
            raise CliError(f"--record-activations: unknown module path {path!r}; recordable paths "
                           f"(see --list-modules): {', '.join(known)}")


def record_to_file(cmd: EvalCommand, env, network, n_steps: int) -> None:
    """Record ``cmd.record_activations`` of ``network`` over ``cmd.episodes``
    envs x ``n_steps`` steps (seeded like the evaluation) into ``cmd.out``."""
    from nnx_ppo.algorithms.recording import record_activations

    recording = record_activations(env, network, cmd.record_activations, n_envs=cmd.episodes, n_steps=n_steps,
                                   seed=cmd.seed, deterministic=not cmd.stochastic)
    recording.save(cmd.out)
    episodes = int(recording.done.sum())
    print(f"activations: {pretty_path(Path(cmd.out))} ({n_steps} steps x {cmd.episodes} envs, "
          f"{episodes} episodes ended; {len(recording.activations)} modules)")
