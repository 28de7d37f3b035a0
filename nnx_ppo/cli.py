"""``nnx-ppo``: train, evaluate and list environments from the command line.

    nnx-ppo train                      # the default agent: an LSTM on cue_memory
    nnx-ppo train gymnax:CartPole-v1 --network mlp --ppo.total-steps 200000
    nnx-ppo resume runs/cue_memory-20250101-120000 --ppo.total-steps 200000
    nnx-ppo eval runs/cue_memory-20250101-120000 --episodes 100
    nnx-ppo eval runs/cue_memory-20250101-120000 --record-activations layers/1/components/action/layers/1 --out act.npz
    nnx-ppo distill runs/cue_memory-20250101-120000 --network gru
    nnx-ppo export runs/cue_memory-20250101-120000 --best --out policy/
    nnx-ppo plot runs/a runs/b --out compare.png --threshold 0.9
    nnx-ppo sweep gymnax:CartPole-v1 --grid ppo.learning-rate=1e-3,3e-4 --seeds 0 1 2
    nnx-ppo envs

Every :class:`~nnx_ppo.algorithms.config.TrainConfig` field is a flag
(``--ppo.n-envs``, ``--eval.every-steps``, ``--seed`` ...), with its
documentation as help. See docs/cli.md. The commands live in
:mod:`nnx_ppo.app` (``commands``, ``train``, ``evaluate``, ``progress``);
this module parses the command line and dispatches. It imports no JAX:
``--help`` and ``envs`` stay quick, and the commands that train or
evaluate import it when they run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import sys
import warnings
from typing import Annotated, Union

import tyro

from nnx_ppo.algorithms.config import checked, deferred_checks
from nnx_ppo.app.commands import (
    DEFAULT_ENV,
    DEFAULT_ENV_KWARGS,
    DEFAULT_HIDDEN_SIZE,
    DEFAULT_NETWORK,
    DEFAULT_TRAIN_CONFIG,
    PROG,
    CliError,
    DistillCommand,
    EnvsCommand,
    EvalCommand,
    ExportCommand,
    PlotCommand,
    ResumeCommand,
    SweepCommand,
    TrainCommand,
    flag_groups,
    print_error,
)
from nnx_ppo.app.help_text import TRAIN_FLAG_GROUPS, clean_help, group_options
from nnx_ppo.app.runs import parse_env_kwargs
from nnx_ppo.presets import NETWORK_DEFAULTS, find_preset, library_defaults

__all__ = [
    "main",
    "TrainCommand",
    "EvalCommand",
    "DistillCommand",
    "ExportCommand",
    "PlotCommand",
    "SweepCommand",
    "EnvsCommand",
    "CliError",
    "DEFAULT_ENV",
    "DEFAULT_ENV_KWARGS",
    "DEFAULT_NETWORK",
    "DEFAULT_HIDDEN_SIZE",
    "DEFAULT_TRAIN_CONFIG",
]


# ----------------------------------------------------------------------------- envs


def _env_spec_forms() -> str:
    """The forms an env spec takes, from the registry's table of sources."""
    from nnx_ppo.envs.registry import list_sources

    return ", ".join(["NAME (a built-in task)", *(f"{s.prefix}:NAME" for s in list_sources())])


def _run_envs() -> int:
    from nnx_ppo.envs.registry import list_envs, list_sources
    from nnx_ppo.presets import PRESETS

    print("built-in tasks:")
    for spec in list_envs():
        if ":" not in spec:
            print(f"  {spec}")
    print("\nenv sources: PREFIX:NAME builds the source's env NAME (if its package is installed; "
          "nnx_ppo.envs.register_source adds sources):")
    sources = list_sources()
    width = max((len(s.prefix) for s in sources), default=0) + 2
    for source in sources:
        print(f"  {source.prefix + ':':<{width}} {source.description}".rstrip())
        if source.examples:
            print(f"  {'':<{width}} e.g. {' '.join(source.examples)}")
    print("\ntuned presets (`nnx-ppo train ENV [--network KIND]` starts from them; nnx_ppo.presets in Python):")
    for p in PRESETS:
        ppo = p.config.ppo
        target = "-" if p.target is None else f"{p.target:g}"
        print(f"  {p.env:<28} {p.network:<5} {ppo.total_steps:>9,} steps  target {target}  {p.description}")
    print("\nother envs (and --no-preset) start from the library defaults (docs/training.md); "
          "where a kind of network has its own:")
    for network, own in NETWORK_DEFAULTS.items():
        print(f"  {network}: {', '.join(f'{k} {v}' for part in own.values() for k, v in part.items())}")
    return 0


# ----------------------------------------------------------------------------- main


def _find_resume(argv: list[str]) -> str | None:
    """The run a command line resumes: ``resume RUN ...``, or the value of
    ``--resume`` in a ``train`` or ``sweep`` command line."""
    if argv[:1] == ["resume"]:
        return argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
    if argv[:1] not in (["train"], ["sweep"]):
        return None
    for i, a in enumerate(argv[1:], start=1):
        if a == "--resume" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--resume="):
            return a.split("=", 1)[1]
    return None


def _preset_defaults(preset, command: type = TrainCommand) -> TrainCommand:
    """A TrainCommand (or ``command``, a SweepCommand) holding a preset's
    settings (the parser's defaults for an env with a preset, so that flags
    given explicitly override them)."""
    return command(
        env=preset.env,
        network=preset.network,
        hidden_size=preset.hidden_size,
        env_kwargs=json.dumps(preset.env_kwargs) if preset.env_kwargs else None,
        network_kwargs=json.dumps(preset.network_kwargs) if preset.network_kwargs else None,
        train_env_kwargs=json.dumps(preset.train_env_kwargs) if preset.train_env_kwargs else None,
        config=preset.config,
    )


def _tyro_parse(argv: list[str], train_default: TrainCommand, sweep_default: SweepCommand | None = None):
    commands = Union[
        Annotated[TrainCommand, tyro.conf.subcommand("train", default=train_default, prefix_name=False)],
        Annotated[SweepCommand, tyro.conf.subcommand("sweep", default=sweep_default or SweepCommand(),
                                                     prefix_name=False)],
        Annotated[ResumeCommand, tyro.conf.subcommand("resume", prefix_name=False)],
        Annotated[EvalCommand, tyro.conf.subcommand("eval", prefix_name=False)],
        Annotated[DistillCommand, tyro.conf.subcommand("distill", prefix_name=False)],
        Annotated[ExportCommand, tyro.conf.subcommand("export", prefix_name=False)],
        Annotated[PlotCommand, tyro.conf.subcommand("plot", prefix_name=False)],
        Annotated[EnvsCommand, tyro.conf.subcommand("envs", prefix_name=False)],
    ]
    description = (f"PPO for stateful (recurrent) networks in JAX + Flax NNX. An ENV_SPEC is {_env_spec_forms()}; "
                   f"`{PROG} envs` lists them.")
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), deferred_checks():  # cleaned below
            cmd = tyro.cli(commands, args=argv, prog=PROG, description=description)
        if isinstance(cmd, TrainCommand):
            cmd = dataclasses.replace(cmd, config=checked(cmd.config))
        return cmd
    except ValueError as e:  # a config's check rejected a value: its own one-line text
        raise CliError(str(e)) from None
    finally:
        shown = clean_help(out.getvalue())
        if argv[:1] == ["train"]:
            shown = group_options(shown, TRAIN_FLAG_GROUPS)
        elif argv[:1] == ["sweep"]:
            shown = group_options(shown, flag_groups(SweepCommand))
        sys.stdout.write(shown)
        sys.stderr.write(clean_help(err.getvalue()) + _did_you_mean(err.getvalue(), argv, train_default))


_SUBCOMMANDS = ("train", "sweep", "resume", "eval", "distill", "export", "plot", "envs")


def _did_you_mean(error: str, argv: list[str], train_default) -> str:
    """For an unknown flag tyro found no near match for (``--ppo.lr``), the
    flags whose last part it abbreviates (``--ppo.learning-rate``)."""
    match = re.search(r"Unrecognized options: (--[\w.-]+)", error)
    if not match or "Perhaps you meant" in error or not argv or argv[0] not in _SUBCOMMANDS:
        return ""
    unknown = match.group(1)
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        _tyro_parse([*argv[:1], "--help"], train_default)
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w.-]*", help_text.getvalue()))
    prefix, _, short = unknown[2:].rpartition(".")

    def initials(flag: str) -> str:
        return "".join(word[0] for word in flag.rpartition(".")[2].split("-") if word)

    found = sorted(f for f in flags if f[2:].startswith(prefix) and short and
                   (initials(f) == short.replace("-", "") or f.rpartition(".")[2].startswith(short)))
    return f"{PROG}: did you mean {' or '.join(found[:3])}?\n" if found else ""


def _preset_of_help(argv: list[str]):
    """For ``train|sweep ENV [--network KIND] --help``: the preset of ENV (and KIND), if any."""
    env, network, rest = DEFAULT_ENV, None, argv[1:]
    for i, a in enumerate(rest):
        if a == "--network" and i + 1 < len(rest):
            network = rest[i + 1]
        elif a.startswith("--network="):
            network = a.split("=", 1)[1]
    positional = [a for i, a in enumerate(rest)
                  if not a.startswith("-") and (i == 0 or not rest[i - 1].startswith("--"))]
    if positional:
        env = positional[0]
    return find_preset(env, network) or (library_defaults(env, network, DEFAULT_HIDDEN_SIZE) if network else None)


def _parse(argv: list[str]):
    """Parse the command line. ``resume RUN`` (spelled ``train --resume
    RUN`` or ``sweep --resume RUN`` too) continues the run as its kind (a
    sweep's members or one run), with the run's settings as the defaults;
    ``train ENV`` starts from ENV's preset (of ``--network``, when given)."""
    saved = None
    resume = _find_resume(argv)
    helping = any(a in ("-h", "--help") for a in argv)
    if resume is not None and not helping:
        from nnx_ppo.app.train import resume_defaults

        default, saved = resume_defaults(resume)
        rest = ["--resume", *argv[1:]] if argv[0] == "resume" else argv[1:]
        if isinstance(default, SweepCommand):
            return _tyro_parse(["sweep", *rest], TrainCommand(), default), saved
        return _tyro_parse(["train", *rest], default), saved
    if argv[:1] == ["resume"] and not helping:
        raise CliError(f"resume: give the run directory to continue: {PROG} resume RUN_DIR [--ppo.total-steps N]")
    if helping and argv and argv[0] in ("train", "sweep") and "--no-preset" not in argv:
        preset = _preset_of_help(argv)
        if preset is not None:  # the help shows the defaults this env starts from
            return _with_preset(argv, preset), saved
    cmd = _tyro_parse(argv, TrainCommand())
    if isinstance(cmd, TrainCommand):  # (a SweepCommand is one too)
        network_given = any(a == "--network" or a.startswith("--network=") for a in argv)
        preset = None if cmd.no_preset else find_preset(cmd.env, cmd.network if network_given else None)
        if preset is None:  # the library defaults of this kind of network, where they differ
            preset = library_defaults(cmd.env, cmd.network, cmd.hidden_size)
        if preset is not None:
            cmd = _with_preset(argv, preset)
    return cmd, saved


def _with_preset(argv: list[str], preset):
    """Parse ``argv`` (``train`` or ``sweep``) with ``preset``'s settings as the defaults."""
    if argv[:1] == ["sweep"]:
        return _tyro_parse(argv, TrainCommand(), _preset_defaults(preset, SweepCommand))
    return _tyro_parse(argv, _preset_defaults(preset))


def _print_config(cmd: TrainCommand, argv: list[str]) -> int:
    """``train --print-config``: the settings the run would use, as JSON."""
    from nnx_ppo import run_dir as rd

    network_given = any(a == "--network" or a.startswith("--network=") for a in argv)
    preset = None if cmd.no_preset or cmd.resume else find_preset(cmd.env, cmd.network if network_given else None)
    settings = {
        "env": cmd.env,
        "network": cmd.network,
        "hidden_size": cmd.hidden_size,
        "network_kwargs": parse_env_kwargs(cmd.network_kwargs, cmd.env, "--network-kwargs"),
        "env_kwargs": parse_env_kwargs(cmd.env_kwargs, cmd.env),
        "train_env_kwargs": parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs"),
        "seeds": list(cmd.seeds) or [cmd.config.seed],
        "preset": (f"{preset.env} ({preset.network})" if preset is not None else
                   f"library defaults ({cmd.network})" if cmd.network in NETWORK_DEFAULTS else None),
        "resume": cmd.resume,
        "config": rd.train_config_to_dict(cmd.config),
    }
    print(json.dumps(settings, indent=2))
    return 0


def _join_processes(cmd: TrainCommand) -> None:
    """``--coordinator-address``: join a run of several processes before
    anything touches a device (``nnx_ppo.algorithms.distributed.initialize``)."""
    if cmd.coordinator_address is None:
        if cmd.num_processes != 1 or cmd.process_id != 0:
            raise CliError("--num-processes and --process-id need --coordinator-address HOST:PORT")
        return
    from nnx_ppo import run_dir as rd
    from nnx_ppo.algorithms.distributed import check_same_everywhere, initialize, watch_peers

    try:
        initialize(cmd.coordinator_address, cmd.num_processes, cmd.process_id, timeout=cmd.distributed_timeout)
        # Every process must train the same run: compare a hash of the settings (all but --process-id).
        settings = {f.name: getattr(cmd, f.name) for f in dataclasses.fields(cmd) if f.name not in ("process_id",
                                                                                                   "config")}
        settings["config"] = rd.train_config_to_dict(cmd.config)
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
        check_same_everywhere(digest, "settings (flags)")
    except ValueError as e:
        raise CliError(str(e)) from None
    # A peer that dies or hangs ends every process within --distributed-timeout, in one line.
    watch_peers(cmd.distributed_timeout)


def _format_warning(message, category, filename, lineno, line=None) -> str:
    """The library's own warnings (e.g. a skipped unreadable checkpoint) as
    one line; others as Python formats them."""
    if category.__module__.startswith("nnx_ppo."):
        return f"{PROG}: warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


_python_format_warning = warnings.formatwarning


def _quiet_library_logs() -> None:
    """Failures are reported in one line by the command itself: the logs that
    orbax's background threads write when a checkpoint fails (absl errors,
    asyncio callbacks after the loop closed) are not shown as well."""
    import logging

    for name in ("absl", "concurrent.futures", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    shown = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if kind is RuntimeError and str(value) == "Event loop is closed":  # tensorstore callbacks, after a failure
            return
        shown(kind, value, traceback)

    sys.excepthook = hook
    unraisable = sys.unraisablehook

    def unraisable_hook(info) -> None:
        if isinstance(info.exc_value, RuntimeError) and str(info.exc_value) == "Event loop is closed":
            return
        unraisable(info)

    sys.unraisablehook = unraisable_hook


def _compilation_cache() -> None:
    """Keep compiled programs on disk between runs
    (:func:`nnx_ppo.algorithms.program.enable_compilation_cache`): in the
    folder ``JAX_COMPILATION_CACHE_DIR`` names, else ``~/.cache/nnx_ppo/jax``;
    ``JAX_ENABLE_COMPILATION_CACHE=false`` turns it off. A folder that cannot
    be made is a warning, not an error."""
    import jax

    from nnx_ppo.algorithms.program import enable_compilation_cache

    if not jax.config.jax_enable_compilation_cache:
        return
    try:
        enable_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR") or None,
                                 jax.config.jax_persistent_cache_min_compile_time_secs)
    except OSError as e:
        warnings.warn(f"no compilation cache ({e}); every run compiles afresh", stacklevel=2)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nnx-ppo`` console script. Returns the exit code
    (0 ok, 1 failure, 2 bad usage, 130 aborted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = _format_warning
    _quiet_library_logs()
    try:
        cmd, saved = _parse(argv)
        if isinstance(cmd, TrainCommand) and cmd.print_config:
            return _print_config(cmd, argv)
        if isinstance(cmd, (SweepCommand, TrainCommand, EvalCommand, DistillCommand, ExportCommand)):
            _compilation_cache()
        if isinstance(cmd, SweepCommand):
            from nnx_ppo.app.sweep import run_sweep

            return run_sweep(cmd, argv, saved)
        if isinstance(cmd, TrainCommand):
            from nnx_ppo.app.train import run_train

            _join_processes(cmd)
            return run_train(cmd, argv, saved)
        if isinstance(cmd, EvalCommand):
            from nnx_ppo.app.evaluate import run_eval

            return run_eval(cmd)
        if isinstance(cmd, DistillCommand):
            from nnx_ppo.app.distill import run_distill

            return run_distill(cmd, argv)
        if isinstance(cmd, PlotCommand):
            from nnx_ppo.app.plot import run_plot

            return run_plot(cmd)
        if isinstance(cmd, ExportCommand):
            from nnx_ppo.app.export import run_export

            return run_export(cmd)
        return _run_envs()
    except CliError as e:
        print_error(str(e))
        return e.code
    except BrokenPipeError:  # output piped into a reader that stopped (`nnx-ppo --help | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
