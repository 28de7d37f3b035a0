"""The command line's commands, their defaults and :class:`CliError` (see :mod:`nnx_ppo.cli`),
and ``nnx-ppo envs``: the built-in tasks, the env sources, the presets and the
library defaults of each kind of network."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Optional

import tyro

from nnx_ppo.algorithms.config import TrainConfig, per_member_bounds
from nnx_ppo.presets import DEFAULT_CONFIG, NETWORK_DEFAULTS, PRESETS, get_preset

PROG = "nnx-ppo"


# ----------------------------------------------------------------------------- the default agent
#
# An LSTM actor-critic on the built-in memory task: a cue (one of 4) is shown
# at the first step and must be reported after 8 blank steps. A memoryless
# policy gets 0.25; the trained LSTM gets 1.0. On a laptop CPU this takes a
# couple of minutes. It is the cue_memory preset (nnx_ppo.presets); every
# env with a preset starts from it (see `nnx-ppo envs`).

DEFAULT_ENV = "cue_memory"
DEFAULT_PRESET = get_preset(DEFAULT_ENV)
DEFAULT_ENV_KWARGS: dict[str, Any] = dict(DEFAULT_PRESET.env_kwargs)
"""Used only when the env is the default one and ``--env-kwargs`` is not given."""

DEFAULT_NETWORK = DEFAULT_PRESET.network
DEFAULT_HIDDEN_SIZE = DEFAULT_PRESET.hidden_size
DISTRIBUTED_TIMEOUT = 120.0  # = nnx_ppo.algorithms.distributed.DEFAULT_TIMEOUT (importing it would load JAX for --help)
DEFAULT_TRAIN_CONFIG = DEFAULT_CONFIG


def shell_command(*parts) -> str:
    """A command line to print for copy-paste, each part shell-quoted
    (``nnx-ppo eval 'runs/a b'``)."""
    import shlex

    return shlex.join(str(p) for p in parts)


class CliError(Exception):
    """A user-facing error: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- commands
#
# `train --help` shows a box of flags per group: each group is a frozen dataclass, a field of the command marked
# tyro.conf.OmitArgPrefixes (its flags keep their own names) and named by the title of its box.


@dataclasses.dataclass(frozen=True)
class SetupFlags:
    """The network, and keyword arguments for the env."""

    network: Annotated[str, tyro.conf.arg(metavar="{mlp,lstm,gru}|MODULE:FUNCTION|FILE.py:FUNCTION")] = DEFAULT_NETWORK
    ("actor-critic architecture: feed-forward MLP, or an encoder + LSTM/GRU core; or your own network, "
     "FUNCTION(env, rngs) in MODULE (importable, or from the current directory) or in FILE.py, rebuilt from "
     "config.json by eval, --resume, --seeds and distill (docs/own_network.md).")

    hidden_size: int = DEFAULT_HIDDEN_SIZE
    ("width of the hidden layers (mlp: two layers per actor/critic; lstm/gru: one encoder layer and the "
     "recurrent core).")

    network_kwargs: Optional[str] = None
    ("""JSON object of extra keyword arguments for the network factory (nnx_ppo.networks.factories), e.g. """
     """'{"forget_bias": 3}' for an LSTM or '{"entropy_weight": 0.01}'; not with your own network function.""")

    env_kwargs: Optional[str] = None
    ("""JSON object of keyword arguments for nnx_ppo.envs.make, e.g. '{"episode_length": 500}'. Default: {} (the """
     'default env cue_memory uses {"n_cues": 4, "delay": 8}).')

    train_env_kwargs: Optional[str] = None
    ("""JSON object of extra keyword arguments for the training env only, e.g. '{"random_reset_steps": 500}' """
     "(evaluation keeps full episodes).")

    no_preset: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """ignore the env's tuned preset (see `nnx-ppo envs`): start from the library's defaults instead."""


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """Where the run is written, how it continues, what it logs."""

    run_dir: Optional[str] = None
    """where to write the run (default: runs/<env>-<YYYYmmdd-HHMMSS>)."""

    resume: Optional[str] = None
    ("continue the run in this directory (reads its config.json; flags given here override its training config, "
     "e.g. a larger --ppo.total-steps).")

    current_code: bool = False
    ("with --resume: rebuild the run's env and network from their files as they are now, even where they changed "
     "since it was trained (by default the run's copies in RUN_DIR/source/ are used then).")

    overwrite: bool = False
    ("start afresh in a --run-dir that holds a run's data (config.json, metrics, tb/, checkpoints, the best "
     "policy): delete them first. Without it such a directory is refused.")

    quiet: bool = False
    """no progress bar; print only a few log lines (evaluations, summary)."""

    print_config: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """print the effective settings (the preset's or the resumed run's, with the flags given) as JSON, and exit."""

    video_every: int = 0
    ("record one deterministic evaluation episode every N evaluations into <run>/videos/step_<env steps>.mp4 "
     "(also to TensorBoard and W&B); renderable envs only (MuJoCo Playground); 0: none.")

    wandb: bool = False
    """also log metrics to Weights & Biases (needs `pip install wandb`)."""

    wandb_project: str = "nnx-ppo"
    """Weights & Biases project name (with --wandb)."""


@dataclasses.dataclass(frozen=True)
class ProcessFlags:
    """Training with several processes (hosts; docs/scale.md)."""

    coordinator_address: Optional[str] = None
    ("HOST:PORT of process 0, to train with several processes (hosts); give it, --num-processes and "
     "--process-id to every process, with the same --run-dir (see docs/scale.md).")

    num_processes: int = 1
    """number of processes taking part (with --coordinator-address)."""

    process_id: int = 0
    """this process's index, 0 .. num_processes - 1 (process 0 writes the run directory and logs)."""

    distributed_timeout: float = DISTRIBUTED_TIMEOUT
    ("seconds to wait for every process to join, and for a peer that stopped responding, before every process "
     "ends with one line naming it (with --coordinator-address).")


@dataclasses.dataclass
class TrainCommand:
    """Train a PPO agent. With no arguments: the default agent (an LSTM on the
    cue_memory memory task), which learns in a few minutes on a CPU. An env
    with a tuned preset (`nnx-ppo envs` lists them) starts from the preset's
    network and hyperparameters; flags given here override them.

    Writes a run directory (config.json, metrics.jsonl, TensorBoard events in
    tb/, learning_curve.png, checkpoints/). Ctrl-C stops cleanly after the
    current compiled call and saves a final checkpoint; continue with `nnx-ppo resume RUN_DIR`.
    """

    env: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV_SPEC")] = DEFAULT_ENV
    ("environment spec for nnx_ppo.envs.make, e.g. cue_memory, gymnax:CartPole-v1, playground:CartpoleBalance "
     "(see `nnx-ppo envs`), or your own env class or function as FILE.py:NAME or MODULE:NAME, called with "
     "--env-kwargs and rebuilt from config.json by every command (docs/environments.md).")

    seeds: Annotated[tuple[int, ...], tyro.conf.arg(metavar="SEED [SEED ...]",
                                                    help_behavior_hint="(default: one run, of --seed)")] = ()
    ("train these seeds together in one compiled program (instead of --seed): one run directory, metrics rows "
     'carry their "seed", the curve shows the mean and the min-max band over seeds; one checkpoint holds every seed '
     "(resume with --resume, `nnx-ppo eval` evaluates each seed).")

    setup: Annotated[SetupFlags, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="env and network")] = SetupFlags()
    run: Annotated[RunFlags, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="run directory and logging")] = RunFlags()
    processes: Annotated[ProcessFlags, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="multi-process")] = ProcessFlags()

    config: Annotated[TrainConfig, tyro.conf.arg(name="")] = DEFAULT_TRAIN_CONFIG
    """training configuration."""


@dataclasses.dataclass(frozen=True)
class SweepFlags:
    """The grid of hyperparameters, and population-based training."""

    grid: Annotated[tuple[str, ...], tyro.conf.arg(
        metavar="FIELD=V1,V2 [FIELD=V1,V2 ...]", help_behavior_hint="(required; not with --resume)",
        help="the hyperparameters to sweep and their values, e.g. ppo.learning-rate=1e-3,3e-4 "
             "ppo.clip-range=0.1,0.2: every combination is a config, trained with every seed of --seeds. Only "
             "numbers that change no array shape: " + ", ".join(
                 "ppo." + name.replace("_", "-") for name in per_member_bounds()) + ".")] = ()

    pbt_every: int = 0
    ("population-based training: every N iterations the worst quarter of the members take over the state "
     "of members of the best quarter and perturb the swept hyperparameters (x0.8 or x1.25); 0: the members "
     "train independently.")

    threshold: Optional[float] = None
    """the return for 'steps/seconds to threshold' in sweep.md (default: the env preset's target, if any)."""


@dataclasses.dataclass
class SweepCommand(TrainCommand):
    """Train a grid of hyperparameters, each with every seed, in one compiled
    program (a population; docs/sweeps.md). Every `train` flag sets what the
    members share (an env with a preset starts from it); --grid gives the
    numbers that differ. Writes one run directory: per-member metrics and
    checkpoints, sweep.md (the configs ranked) and a plot per swept
    hyperparameter. Ctrl-C stops cleanly; continue with `nnx-ppo resume RUN_DIR`.
    """

    sweep: Annotated[SweepFlags, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="sweep")] = SweepFlags()


@dataclasses.dataclass
class ResumeCommand:
    """Continue a run (of train, --seeds or sweep) from its last checkpoint:
    `nnx-ppo resume RUN_DIR [--ppo.total-steps N]`. The run's own settings
    are the defaults; a flag may change only what keeps the run the same
    run (e.g. --ppo.total-steps, evaluation and checkpoint settings), and
    every change is printed and recorded in config.json's "resumed" list.
    `train --resume RUN_DIR` and `sweep --resume RUN_DIR` are the same."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory written by `nnx-ppo train` or `nnx-ppo sweep`."""


@dataclasses.dataclass
class EvalCommand:
    """Evaluate the final policy of a run with deterministic episodes and print
    return statistics; optionally record a video (MP4/GIF, renderable envs only)."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory written by `nnx-ppo train`."""

    current_code: bool = False
    """rebuild the run's env and network from their files as they are now, even where they changed since it was
    trained (by default the run's copies in RUN_DIR/source/ are used then)."""

    episodes: int = 16
    """number of evaluation episodes (run in parallel)."""

    max_episode_length: Optional[int] = None
    """step limit per episode (default: the run's eval.max_episode_length)."""

    seed: int = 0
    """seeds the env resets."""

    member: Optional[int] = None
    """in a sweep's run directory: evaluate only this member (sweep.md lists them; default: every member)."""

    best: bool = False
    """evaluate the best evaluated policy kept during training (one per seed) instead of the final one."""

    step: Optional[int] = None
    """evaluate the checkpoint saved at this env step instead of the final one."""

    stochastic: bool = False
    """sample actions instead of taking the policy's mode/mean."""

    video: Optional[str] = None
    """also record one episode to this file (.mp4 or .gif); the env must be able to render (MuJoCo Playground envs)."""

    fps: Optional[float] = None
    """video frame rate (default: the env's control rate, else 30)."""

    record_activations: Annotated[tuple[str, ...], tyro.conf.arg(metavar="PATH [PATH ...]")] = ()
    ("record the outputs and carries of these modules (paths from --list-modules) over --episodes envs x "
     "--max-episode-length steps into --out (nnx_ppo.algorithms.evaluation).")

    out: Optional[str] = None
    """the .npz file that --record-activations writes."""

    list_modules: bool = False
    """print the module paths that --record-activations accepts, and exit."""


@dataclasses.dataclass
class DistillCommand:
    """Distill a trained run's policy (the teacher) into a new network (the
    student): the student acts, the teacher's actions are its targets
    (nnx_ppo.algorithms.distillation). Writes a run directory like `train`
    (evaluate it with `nnx-ppo eval`); env and training config come from
    the teacher's run."""

    teacher_run: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="TEACHER_RUN_DIR")]
    """a run directory written by `nnx-ppo train` (its final checkpoint is the teacher)."""

    network: Annotated[str, tyro.conf.arg(metavar="{mlp,lstm,gru}|MODULE:FUNCTION|FILE.py:FUNCTION")] = "lstm"
    """the student's architecture."""

    hidden_size: int = 64
    """width of the student's hidden layers."""

    total_steps: Optional[int] = None
    """env steps of distillation (default: the teacher run's ppo.total_steps)."""

    learning_rate: Optional[float] = None
    """the student's learning rate (default: the teacher run's)."""

    teacher_mixing: float = 0.0
    """probability that an env executes the teacher's action instead of the student's (DAgger-style)."""

    teacher_mixing_steps: Optional[int] = None
    """env steps over which --teacher-mixing decays linearly to 0 (default: constant)."""

    seed: int = 0
    """seeds the student's initialization and the rollouts."""

    run_dir: Optional[str] = None
    """where to write the run (default: runs/<env>-distill-<YYYYmmdd-HHMMSS>)."""

    quiet: bool = False
    """no progress bar; print only a few log lines."""


@dataclasses.dataclass
class ExportCommand:
    """Write a run's policy as a jax.export artifact that runs with JAX alone
    (no nnx_ppo): its step, initial carry and parameters (nnx_ppo.policy)."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory written by `nnx-ppo train`."""

    out: str
    """the directory to write (step.jax, initial_carry.jax, params.npz, policy.json): new or empty, or a previous
    export with --overwrite."""

    current_code: bool = False
    """rebuild the run's env and network from their files as they are now, even where they changed since it was
    trained (by default the run's copies in RUN_DIR/source/ are used then)."""

    batch_size: Optional[int] = None
    """the number of envs load_exported(DIR).initial_carry() gives by default (default 1). The exported step takes any
    batch size, unless a module of the network needs a fixed one: then this one (default 1)."""

    overwrite: bool = False
    """replace the files of a previous export in --out (anything else there is still refused)."""

    best: bool = False
    """export the best evaluated policy kept during training instead of the final one."""

    step: Optional[int] = None
    """export the checkpoint saved at this env step instead of the final one."""

    seed: Optional[int] = None
    """for a run of several seeds: which training seed's policy (default: the first)."""

    stochastic: bool = False
    """sample actions instead of taking the policy's mode/mean."""

    platforms: Annotated[tuple[str, ...], tyro.conf.arg(metavar="PLATFORM [PLATFORM ...]")] = ()
    """the platforms the artifact runs on, e.g. cpu cuda (default: this machine's)."""


@dataclasses.dataclass
class PlotCommand:
    """Compare runs: one curve per run (the mean over its seeds with a min-max
    band), labelled by the run's name, written to --out; prints a table of the
    final, best and IQM values and the steps and seconds to --threshold."""

    runs: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]")]
    """run directories written by `nnx-ppo train` (or distill)."""

    out: str
    """the PNG file to write."""

    metric: str = "eval/episode_return"
    """the metric to compare: an evaluation metric (eval/...) or a training one (e.g. train/episode_return)."""

    threshold: Optional[float] = None
    """also give the first env step (and seconds) at which each run's mean over seeds reached this value."""


@dataclasses.dataclass
class EnvsCommand:
    """List the available environment specs."""


# ----------------------------------------------------------------------------- helpers


def check_writable_target(path: str, what: str) -> None:
    """Before any work: a usage error (exit code 2) in one line, ``"{what}:
    X is not writable"``, when ``path`` (a file or folder a command writes)
    cannot be written, as ``train`` checks its run directory."""
    import os
    from pathlib import Path

    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        raise CliError(f"{what}: {existing} is not writable")


# ----------------------------------------------------------------------------- nnx-ppo envs


def run_envs() -> int:
    """``nnx-ppo envs``: the built-in tasks, the env sources, the presets and the
    library defaults of each kind of network; returns exit code 0."""
    from nnx_ppo.envs.registry import list_envs, list_sources

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
