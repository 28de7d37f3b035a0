"""``nnx-ppo distill``: distill a trained run's policy into a new network.

The teacher run's ``config.json`` gives the env, its kwargs and the training
config; the student gets its own run directory, written by the same code as
``nnx-ppo train`` (metrics, TensorBoard, curve, checkpoints), so ``nnx-ppo
eval`` reads it like any run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from nnx_ppo import run_dir as rd
from nnx_ppo.app.commands import CliError, DistillCommand, RunFlags, SetupFlags, TrainCommand
from nnx_ppo.app.runs import load_run_network, read_run, run_policy_spec


@dataclasses.dataclass(frozen=True)
class DistillSetup:
    """What ``run_train`` needs to distill instead of running PPO."""

    teacher: object
    config: object  # DistillationConfig
    teacher_run: str


def _teacher(run_dir: Path, saved: dict):
    """The teacher network: the final checkpoint of ``run_dir`` (of a run of
    several seeds, the first seed's policy)."""
    env, spec, ckpt_dir = run_policy_spec(run_dir, saved)
    seeds = saved.get("seeds")
    return load_run_network(ckpt_dir, spec.build(env), seed=int(seeds[0]) if seeds else None,
                            what=f"teacher {run_dir}: ")


def resumed_distillation(saved: dict) -> DistillSetup:
    """What a distillation run (its ``config.json`` is ``saved``) needs to be
    resumed: its teacher, loaded again from the teacher's run, and its
    distillation settings."""
    from nnx_ppo.algorithms.distillation import DistillationConfig

    recorded = dict(saved["distillation"])
    teacher_run = Path(recorded.pop("teacher_run"))
    try:
        config = DistillationConfig(**recorded)
    except (TypeError, ValueError) as e:
        raise CliError(f"cannot read the distillation settings of the run: {e}") from None
    teacher = _teacher(teacher_run, read_run(teacher_run, rebuild="use it as a teacher"))
    return DistillSetup(teacher=teacher, config=config, teacher_run=str(teacher_run))


def student_run(cmd: DistillCommand) -> tuple[TrainCommand, DistillSetup]:
    """``nnx-ppo distill``: the student's training command and its
    distillation setup, which ``nnx-ppo train``'s runner trains
    (:func:`nnx_ppo.app.train.run_train`, with ``distill=``)."""
    from nnx_ppo.algorithms.distillation import DistillationConfig
    from nnx_ppo.user_code import short_name

    teacher_run = Path(cmd.teacher_run)
    saved = read_run(teacher_run, rebuild="use it as a teacher")
    try:
        config = rd.train_config_from_dict(saved["config"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise CliError(f"cannot read {teacher_run / rd.CONFIG_FILE}: {e}") from None
    try:
        distillation = DistillationConfig(teacher_mixing=cmd.teacher_mixing,
                                          teacher_mixing_steps=cmd.teacher_mixing_steps)
        ppo = dataclasses.replace(
            config.ppo,
            total_steps=config.ppo.total_steps if cmd.total_steps is None else cmd.total_steps,
            learning_rate=config.ppo.learning_rate if cmd.learning_rate is None else cmd.learning_rate,
        )
    except ValueError as e:
        raise CliError(str(e)) from None
    teacher = _teacher(teacher_run, saved)
    student_cmd = TrainCommand(
        env=saved["env"],
        setup=SetupFlags(network=cmd.network, hidden_size=cmd.hidden_size, no_preset=True,
                         env_kwargs=json.dumps(saved.get("env_kwargs", {})),
                         train_env_kwargs=json.dumps(saved.get("train_env_kwargs", {}))),
        config=dataclasses.replace(config, ppo=ppo, seed=cmd.seed),
        run=RunFlags(run_dir=cmd.run_dir or str(rd.default_run_dir(f"{short_name(saved['env'])}-distill")),
                     quiet=cmd.quiet),
    )
    return student_cmd, DistillSetup(teacher=teacher, config=distillation, teacher_run=str(teacher_run.resolve()))
