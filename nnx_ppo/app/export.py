"""``nnx-ppo export``: a run's policy as a :mod:`jax.export` artifact (see :mod:`nnx_ppo.policy`)."""

from __future__ import annotations

import errno
from pathlib import Path

from nnx_ppo.app.commands import CliError, ExportCommand, check_writable_target
from nnx_ppo.app.runs import checkpoint_choice, load_run_network, read_run, run_policy_spec
from nnx_ppo.progress import pretty_path


def check_out_directory(cmd: ExportCommand) -> list[str]:
    """The files of a previous export in ``--out`` that this export replaces
    (with ``--overwrite``); a usage error in one line when ``--out`` holds
    anything else, a previous export without ``--overwrite``, or cannot be written."""
    from nnx_ppo.policy import ExportDirInUseError, check_export_directory

    try:
        replaced = check_export_directory(cmd.out, cmd.overwrite, flag="--overwrite")
    except ExportDirInUseError as e:
        raise CliError(f"--out {e}") from None
    except OSError as e:  # e.g. a directory that cannot be listed
        raise CliError(f"cannot export to {cmd.out}: {e}") from None
    check_writable_target(cmd.out, f"cannot export to {cmd.out}")
    return replaced


def summary(what: str, run_dir: Path, seed: int | None, out: Path, info: dict, cmd: ExportCommand,
            replaced: list[str]) -> str:
    """The line ``export`` prints: what was exported, for which batch sizes, where, and what it replaced."""
    any_batch = info.get("batch_size") == "any"
    batches = "any batch size" if any_batch else f"batches of {info.get('batch_size')}"
    note = ""
    if any_batch and cmd.batch_size is not None:
        note = f" (--batch-size {cmd.batch_size} is initial_carry()'s default number of envs)"
    replacing = f"; replaced the previous export's {', '.join(replaced)}" if replaced else ""
    return (f"exported the {what} of {pretty_path(run_dir)}" + (f" (seed {seed})" if seed is not None else "") +
            f" for {batches}{note} to {out}: step.jax, initial_carry.jax, params.npz, policy.json "
            f"(load with jax.export alone; see nnx_ppo.policy.load_exported){replacing}")


def run_export(cmd: ExportCommand) -> int:
    from nnx_ppo.policy import Policy, export_info

    run_dir = Path(cmd.run_dir)
    if cmd.batch_size is not None and cmd.batch_size <= 0:
        raise CliError(f"--batch-size must be positive, got {cmd.batch_size}")
    which = checkpoint_choice(cmd)
    saved = read_run(run_dir, rebuild="export it")
    env, spec, ckpt_dir = run_policy_spec(run_dir, saved, checkpoint_choice(cmd))
    seeds = [int(s) for s in saved.get("seeds", [])]
    if cmd.seed is not None and cmd.seed not in seeds:
        raise CliError(f"--seed {cmd.seed}: this run trained " +
                       (f"seeds {seeds}" if seeds else "one seed; leave --seed out"))
    seed = cmd.seed if cmd.seed is not None else (seeds[0] if seeds else None)
    replaced = check_out_directory(cmd)  # before the network is loaded and compiled
    try:
        network = spec.build(env)
    except (ValueError, TypeError) as e:  # e.g. a network function that no longer returns a network
        raise CliError(f"cannot rebuild the network of {run_dir}: {e}") from None
    network = load_run_network(ckpt_dir, network, seed=seed, step=which)
    policy = Policy(network, deterministic=not cmd.stochastic, env=env)  # the env gives the observation shapes
    try:
        out = policy.export(cmd.out, platforms=cmd.platforms or None, batch_size=cmd.batch_size,
                            overwrite=cmd.overwrite)
        info = export_info(out)
    except (ValueError, OSError) as e:  # a target found read-only only now is still the usage error it is above
        denied = isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        raise CliError(f"cannot export to {cmd.out}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                       code=2 if denied else 1) from None
    what = {None: "final policy", "best": "best evaluated policy"}.get(which, f"policy at step {which}")
    print(summary(what, run_dir, seed, out, info, cmd, replaced))
    return 0
