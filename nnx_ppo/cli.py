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
:mod:`nnx_ppo._app` (``commands``, ``train``, ``sweep``, ``evaluate``,
``distill``, ``export``, ``plot``, ``listing``; ``process`` sets up the
process a command runs in); this module parses the command line (tyro:
``train --help`` shows a box per group of flags, a nested dataclass of the
command) and dispatches. It imports no JAX: ``--help`` and ``envs`` stay
quick, and the commands that train or evaluate import it when they run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import typing
import warnings
from typing import Annotated, Union

import tyro
from tyro.constructors import MISSING_NONPROP

from nnx_ppo._app.commands import (
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
    SetupFlags,
    SweepCommand,
    TrainCommand,
    run_envs,
)
from nnx_ppo._app.runs import (
    compilation_cache,
    format_warning,
    join_processes,
    parse_env_kwargs,
    print_error,
    quiet_library_logs,
    usage_errors,
    use_run_code,
)
from nnx_ppo._app.train import resume_defaults, run_train, student_run
from nnx_ppo.algorithms.config import TrainConfig, checked, config_to_dict, deferred_checks, flat_fields
from nnx_ppo.presets import find_preset, library_defaults

__all__ = ["main", "TrainCommand", "EvalCommand", "DistillCommand", "ExportCommand", "PlotCommand", "SweepCommand",
           "EnvsCommand", "CliError", "DEFAULT_ENV", "DEFAULT_ENV_KWARGS", "DEFAULT_NETWORK", "DEFAULT_HIDDEN_SIZE",
           "DEFAULT_TRAIN_CONFIG"]


# ----------------------------------------------------------------------------- main


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value ``argv`` gives ``flag`` (``--flag V`` or ``--flag=V``; the
    last one given), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _find_resume(argv: list[str]) -> str | None:
    """The run a command line resumes: ``resume RUN ...``, or the value of
    ``--resume`` in a ``train`` or ``sweep`` command line."""
    if argv[:1] == ["resume"]:
        return argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
    return _flag_value(argv[1:], "--resume") if argv[:1] in (["train"], ["sweep"]) else None


_COMMANDS = {"train": TrainCommand, "sweep": SweepCommand, "resume": ResumeCommand, "eval": EvalCommand,
             "distill": DistillCommand, "export": ExportCommand, "plot": PlotCommand, "envs": EnvsCommand}


def env_spec_forms() -> str:
    """The forms an env spec takes, from the registry's table of sources."""
    from nnx_ppo.envs.registry import list_sources

    return ", ".join(["NAME (a built-in task)", *(f"{s.prefix}:NAME" for s in list_sources())])


def _tyro_parse(argv: list[str], default: TrainCommand | None = None):
    """``argv`` parsed; ``default`` (a TrainCommand or SweepCommand) holds
    the defaults of its command."""
    defaults = {"train": TrainCommand(), "sweep": SweepCommand()}
    if default is not None:
        defaults["sweep" if isinstance(default, SweepCommand) else "train"] = default
    commands = Union[tuple(Annotated[command, tyro.conf.subcommand(
        name, default=defaults.get(name, MISSING_NONPROP), prefix_name=False)] for name, command in _COMMANDS.items())]
    description = (f"PPO for stateful (recurrent) networks in JAX + Flax NNX. An ENV_SPEC is {env_spec_forms()}; "
                   f"`{PROG} envs` lists them.")
    err = io.StringIO()
    try:
        with usage_errors(ValueError):  # a config's check rejected a value: its own one-line text
            with contextlib.redirect_stderr(err), deferred_checks():  # tyro's error, then a suggestion of ours
                cmd = tyro.cli(commands, args=argv, prog=PROG, description=description)
            return dataclasses.replace(cmd, config=checked(cmd.config)) if isinstance(cmd, TrainCommand) else cmd
    finally:
        sys.stderr.write(err.getvalue() + (_did_you_mean(argv) if err.getvalue() else ""))


def _flags(command: type) -> list[str]:
    """The flags of ``command``, from its fields: a group's by their own
    names, the config's as ``--seed``, ``--ppo.n-envs``, ... (no positional)."""
    names = []
    for name, hint in typing.get_type_hints(command, include_extras=True).items():
        kind, *marks = typing.get_args(hint) if typing.get_origin(hint) is Annotated else (hint,)
        if kind is TrainConfig:
            names += flat_fields(TrainConfig)
        elif dataclasses.is_dataclass(kind):
            names += [f.name for f in dataclasses.fields(kind)]
        elif tyro.conf.Positional not in marks:
            names.append(name)
    return ["--" + name.replace("_", "-") for name in names]


def _did_you_mean(argv: list[str]) -> str:
    """For a flag of ``argv`` its command lacks (``--ppo.lr``), the flags
    of the command whose last part it abbreviates (``--ppo.learning-rate``)."""
    if not argv or argv[0] not in _COMMANDS:
        return ""
    known = _flags(_COMMANDS[argv[0]])

    def initials(flag: str) -> str:
        return "".join(word[0] for word in flag.rpartition(".")[2].split("-") if word)

    for given in (arg.partition("=")[0] for arg in argv[1:] if arg.startswith("--")):
        prefix, _, short = given[2:].rpartition(".")
        found = sorted(f for f in known if f[2:].startswith(prefix) and short and
                       (initials(f) == short.replace("-", "") or f.rpartition(".")[2].startswith(short)))
        if given not in known and found:
            return f"{PROG}: did you mean {' or '.join(found[:3])}?\n"
    return ""


def _preset_of_help(argv: list[str]):
    """For ``train|sweep ENV [--network KIND] --help``: the preset of ENV (and KIND), if any."""
    rest = argv[1:]
    network = _flag_value(rest, "--network")
    positional = [a for i, a in enumerate(rest)
                  if not a.startswith("-") and (i == 0 or not rest[i - 1].startswith("--"))]
    env = positional[0] if positional else DEFAULT_ENV
    return find_preset(env, network) or (library_defaults(env, network, DEFAULT_HIDDEN_SIZE) if network else None)


def _parse(argv: list[str]):
    """Parse the command line. ``resume RUN`` (spelled ``train --resume
    RUN`` or ``sweep --resume RUN`` too) continues the run as its kind (a
    sweep's members or one run), with the run's settings as the defaults;
    ``train ENV`` starts from ENV's preset (of ``--network``, when given)."""
    resume = _find_resume(argv)
    helping = any(a in ("-h", "--help") for a in argv)
    if resume is not None and not helping:
        default, saved = resume_defaults(resume)
        rest = ["--resume", *argv[1:]] if argv[0] == "resume" else argv[1:]
        return _tyro_parse(["sweep" if isinstance(default, SweepCommand) else "train", *rest], default), saved
    if argv[:1] == ["resume"] and not helping:
        raise CliError(f"resume: give the run directory to continue: {PROG} resume RUN_DIR [--ppo.total-steps N]")
    if helping and argv[:1] in (["train"], ["sweep"]) and "--no-preset" not in argv:
        preset = _preset_of_help(argv)
        if preset is not None:  # the help shows the defaults this env starts from
            return _with_preset(argv, preset), None
    cmd = _tyro_parse(argv)
    if isinstance(cmd, TrainCommand):  # (a SweepCommand is one too)
        preset, _ = _starting_preset(cmd, argv)
        if preset is not None:
            cmd = _with_preset(argv, preset)
    return cmd, None


def _starting_preset(cmd: TrainCommand, argv: list[str]):
    """What a new ``train`` or ``sweep`` starts from, and its name: ENV's
    preset (of ``--network`` when given, unless ``--no-preset``), else the
    library defaults of its kind of network; ``(None, None)`` where the kind
    has none."""
    network_given = _flag_value(argv, "--network") is not None
    preset = None if cmd.setup.no_preset else find_preset(cmd.env, cmd.setup.network if network_given else None)
    if preset is not None:
        return preset, f"{preset.env} ({preset.network})"
    defaults = library_defaults(cmd.env, cmd.setup.network, cmd.setup.hidden_size)
    return defaults, defaults and f"library defaults ({cmd.setup.network})"


def _with_preset(argv: list[str], preset):
    """Parse ``argv`` (``train`` or ``sweep``) with ``preset``'s settings as
    the defaults, so that flags given explicitly override them."""
    as_json = lambda kwargs: json.dumps(kwargs) if kwargs else None
    setup = SetupFlags(network=preset.network, hidden_size=preset.hidden_size, env_kwargs=as_json(preset.env_kwargs),
                       network_kwargs=as_json(preset.network_kwargs),
                       train_env_kwargs=as_json(preset.train_env_kwargs))
    command = SweepCommand if argv[:1] == ["sweep"] else TrainCommand
    return _tyro_parse(argv, command(env=preset.env, config=preset.config, setup=setup))


def _print_config(cmd: TrainCommand, argv: list[str]) -> int:
    """``train --print-config``: the settings the run would use, as JSON."""
    _, preset = (None, None) if cmd.run.resume else _starting_preset(cmd, argv)
    settings = {
        "env": cmd.env,
        "network": cmd.setup.network,
        "hidden_size": cmd.setup.hidden_size,
        "network_kwargs": parse_env_kwargs(cmd.setup.network_kwargs, cmd.env, "--network-kwargs"),
        "env_kwargs": parse_env_kwargs(cmd.setup.env_kwargs, cmd.env),
        "train_env_kwargs": parse_env_kwargs(cmd.setup.train_env_kwargs, cmd.env, "--train-env-kwargs"),
        "seeds": list(cmd.seeds) or [cmd.config.seed],
        "preset": preset,
        "resume": cmd.run.resume,
        "config": config_to_dict(cmd.config),
    }
    print(json.dumps(settings, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nnx-ppo`` console script. Returns the exit code
    (0 ok, 1 runtime failure, 2 usage error, 130 interrupted: the table in
    docs/cli.md, "Errors and exit codes")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = format_warning
    quiet_library_logs()
    try:
        cmd, saved = _parse(argv)
        if isinstance(cmd, TrainCommand):
            if cmd.seeds and _flag_value(argv, "--seed") is not None:  # (it would train --seeds and record --seed)
                raise CliError(f"give either --seed (one run) or --seeds (several seeds in one run), not both "
                               f"(--seed {cmd.config.seed}, --seeds {' '.join(map(str, cmd.seeds))})")
            if cmd.run.print_config:
                return _print_config(cmd, argv)
        use_run_code(cmd)
        if isinstance(cmd, (SweepCommand, TrainCommand, EvalCommand, DistillCommand, ExportCommand)):
            compilation_cache()
        if isinstance(cmd, SweepCommand):
            from nnx_ppo._app.sweep import run_sweep

            return run_sweep(cmd, argv, saved)
        if isinstance(cmd, TrainCommand):
            join_processes(cmd)
            return run_train(cmd, argv, saved)
        if isinstance(cmd, EvalCommand):
            from nnx_ppo._app.trained import run_eval

            return run_eval(cmd)
        if isinstance(cmd, DistillCommand):
            student, setup = student_run(cmd)
            return run_train(student, argv, None, distill=setup)
        if isinstance(cmd, PlotCommand):
            from nnx_ppo._app.plot import run_plot

            return run_plot(cmd)
        if isinstance(cmd, ExportCommand):
            from nnx_ppo._app.trained import run_export

            return run_export(cmd)
        return run_envs()
    except CliError as e:
        print_error(str(e))
        return e.code
    except BrokenPipeError:  # output piped into a reader that stopped (`nnx-ppo --help | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
