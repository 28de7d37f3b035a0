"""``nnx-ppo train``: build the envs and the network, write the run directory,
train; ``nnx-ppo distill``: a trained run's policy distilled into a new network,
a student run trained the same way.

And what a training run of the command line sends elsewhere: Weights & Biases
(``--wandb``, offline when W&B cannot be reached) and videos of the policy
(``--video-every``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from nnx_ppo import runner as rd
from nnx_ppo._app.commands import (
    DEFAULT_HIDDEN_SIZE,
    PROG,
    CliError,
    DistillCommand,
    RunFlags,
    SetupFlags,
    SweepCommand,
    SweepFlags,
    TrainCommand,
    shell_command,
)
from nnx_ppo._app.runs import (
    build_network,
    extra_network_kwargs,
    load_run_network,
    make_envs,
    network_spec_of,
    prepared,
    print_error,
    print_warning,
    read_run,
    run_directory,
    run_policy_spec,
    train_into,
    usage_errors,
)
from nnx_ppo._app.trained import check_video_target, render_episode, video_fps, write_video
from nnx_ppo.network_spec import NetworkSpec, is_factory_reference
from nnx_ppo.presets import NETWORK_DEFAULTS, find_preset
from nnx_ppo.runner import Run, RunSpec, fmt_seconds, pretty_path

__all__ = ["run_train", "resume_defaults", "student_run", "resumed_distillation", "DistillSetup", "import_wandb",
           "wandb_init", "video_recorder"]


def _saved_setup(saved: dict[str, Any], **flags) -> SetupFlags:
    """The env and network flags of a new command on a run's env (``saved``:
    its config.json): the run's env kwargs, no preset, ``flags``."""
    return SetupFlags(env_kwargs=json.dumps(saved.get("env_kwargs", {})), no_preset=True,
                      train_env_kwargs=json.dumps(saved.get("train_env_kwargs", {})), **flags)


def resume_defaults(run_dir: str) -> tuple[TrainCommand, dict[str, Any]]:
    """The command that continues the run in ``run_dir`` (a TrainCommand, or
    a SweepCommand for a sweep), holding the run's saved settings: the
    parser's defaults for ``resume``/``--resume``, so that only flags given
    explicitly change anything (and :func:`resume_changes` checks those)."""
    saved = read_run(Path(run_dir), rebuild="resume it")
    with usage_errors(rd.MetricsError):
        rd.read_metrics(run_dir, strict=True)  # a bad row refused before anything is built
    with usage_errors(KeyError, TypeError, ValueError, prefix=f"cannot read {Path(run_dir) / rd.CONFIG_FILE}: "):
        net = saved["network"]
        extra = extra_network_kwargs(net)
        setup = _saved_setup(saved, network=net["kind"], hidden_size=int(net.get("hidden_size") or DEFAULT_HIDDEN_SIZE),
                             network_kwargs=json.dumps(extra) if extra else None)  # the run's own settings
        fields = dict(env=saved["env"], setup=setup, config=rd.train_config_from_dict(saved["config"]),
                      seeds=tuple(int(s) for s in saved.get("seeds", ())), run=RunFlags(resume=run_dir))
        if "members" in saved:
            population = saved["population"]
            pbt = population.get("pbt") or {}
            return SweepCommand(**{**fields, "seeds": tuple(population["seeds"])},
                                sweep=SweepFlags(pbt_every=int(pbt.get("every_iterations", 0)))), saved
    return TrainCommand(**fields), saved


def _already_trained(cmd: TrainCommand, run_dir: Path) -> bool:
    """For ``--resume``: whether the run's latest checkpoint already holds the
    steps asked for (then nothing is trained, and nothing is rewritten)."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

    done = max((step for step, _ in checkpointing.list_checkpoints(run_dir / rd.CHECKPOINT_DIR)), default=0)
    wanted = cmd.config.ppo.n_iterations * cmd.config.ppo.steps_per_iteration
    if done < wanted:
        return False
    print(f"{pretty_path(run_dir)} already trained {done:,} env steps (--ppo.total-steps {wanted:,}); nothing to "
          f"do. Train longer with: {shell_command(PROG, 'resume', pretty_path(run_dir), '--ppo.total-steps', 'N')}")
    return True


def _preset(cmd: TrainCommand):
    """The preset of the command's env and network (none with ``--no-preset``)."""
    return None if cmd.setup.no_preset else find_preset(cmd.env, cmd.setup.network)


def _announce(cmd: TrainCommand, run_dir: Path, env_kwargs: dict) -> None:
    ppo, resuming = cmd.config.ppo, cmd.run.resume is not None
    total = ppo.n_iterations * ppo.steps_per_iteration
    network = cmd.setup.network
    title = network if is_factory_reference(network) else f"{network} (hidden {cmd.setup.hidden_size})"
    print(f"run directory: {pretty_path(run_dir)}", flush=True)
    print(f"{'resuming' if resuming else 'training'} {title} on {cmd.env}"
          f"{' ' + json.dumps(env_kwargs) if env_kwargs else ''}: {total:,} env steps, "
          f"{ppo.n_envs} envs x {ppo.rollout_length} steps per iteration", flush=True)
    preset = _preset(cmd)
    if preset is not None and not resuming:
        print(f"starting from the tuned preset for {preset.env} ({preset.network}); flags given override it, "
              "--no-preset starts from the library defaults", flush=True)
    elif cmd.setup.network in NETWORK_DEFAULTS and not resuming:
        print(f"starting from the library defaults for --network {cmd.setup.network} (docs/training.md, \"The defaults "
              f"over a suite of tasks\"); flags given override them", flush=True)


def _summary(result, elapsed: float, stopped: bool, run_dir: Path, n_seeds: int = 1) -> None:
    if stopped:
        print(f"stopped early at {result.total_steps:,} env steps; continue with: "
              f"{shell_command(PROG, 'resume', pretty_path(run_dir))}")
    line = f"trained {result.total_steps:,} env steps{' per seed' if n_seeds > 1 else ''} in {fmt_seconds(elapsed)} " \
           f"(compile {result.compile_seconds:.1f} s)"
    if result.eval_history and n_seeds == 1:
        _, last = result.eval_history[-1]
        line += (f"; final eval return {last['eval/episode_return']:.3f}"
                 f" ± {last.get('eval/episode_return_std', math.nan):.3f}")
    elif result.metrics and n_seeds == 1:
        line += f"; last train return {result.metrics.get('train/episode_return', math.nan):.3f}"
    print(line)
    best = _best_policies(run_dir)
    if best:
        kept = shell_command(PROG, "eval", pretty_path(run_dir), "--best")
        print("best eval return " + ", ".join(best) + f" (kept: {kept})")
    print(f"evaluate with: {shell_command(PROG, 'eval', pretty_path(run_dir))}")


def _best_policies(run_dir: Path) -> list[str]:
    """``"R at step S"`` of each best policy kept in the run (``"seed N: ..."`` for a seed batch)."""
    import nnx_ppo.algorithms.checkpointing as checkpointing

    root = checkpointing.best_policy_dir(run_dir / rd.CHECKPOINT_DIR)
    found = []
    for path in [root, *sorted(root.glob("seed_*"), key=lambda p: int(p.name[5:]))] if root.is_dir() else []:
        saved = checkpointing.list_checkpoints(path)
        if saved:
            step, latest = saved[-1]
            metadata = checkpointing.load_metadata(latest) or {}
            where = f"seed {path.name[5:]}: " if path != root else ""
            found.append(f"{where}{metadata.get('eval', {}).get('eval/episode_return', float('nan')):.3f} at step "
                         f"{step:,}")
    return found


def _report_seeds(cmd: TrainCommand, run: Run, results) -> int:
    """After ``--seeds``: each seed's final evaluation, and each failure in
    one line; the exit code (1 when a seed failed)."""
    finals = [(s, r.eval_history[-1][1]["eval/episode_return"]) for s, r in zip(cmd.seeds, results) if r.eval_history]
    if finals:
        run.write("final eval return per seed: " + ", ".join(f"{s}: {f:.3f}" for s, f in finals)
                  + f"; mean {sum(f for _, f in finals) / len(finals):.3f}")
    failed = [(s, r.failure) for s, r in zip(cmd.seeds, results) if r.failure is not None]
    for s, failure in failed:
        print_error(f"seed {s} failed at iteration {failure.iteration} ({failure.env_steps} env steps) and "
                    f"keeps its parameters from iteration {failure.iteration - 1}: {failure.error}")
    if failed:
        print_error(f"seeds {[s for s, _ in failed]} failed (the others trained on); the run directory is kept and "
                    f"resumable: {shell_command(PROG, 'resume', pretty_path(run.path))}")
    return 1 if failed else 0


def run_train(cmd: TrainCommand, argv: list[str], saved: dict[str, Any] | None, distill=None) -> int:
    """``nnx-ppo train`` (and ``resume``): returns the exit code (0 done or
    stopped, 1 failed, 130 aborted). With ``distill`` (a
    :class:`DistillSetup`), ``nnx-ppo distill``: the
    same run, trained by distillation from its teacher.

    The run directory is locked from the first check to the last line."""
    from nnx_ppo.algorithms.distributed import is_primary, process_count

    cmd, env_kwargs, train_env_kwargs = prepared(cmd, saved)  # (a resume's changes: recorded when training begins)
    if process_count() > 1 and cmd.run.run_dir is None and cmd.run.resume is None:
        raise CliError("--run-dir is required with several processes (every process must name the same directory)")
    if cmd.run.resume is not None and "distillation" in saved:  # a distillation run resumes as one, from its teacher
        distill = resumed_distillation(saved)
    if not is_primary():  # in a run of several processes only process 0 writes the run directory and logs
        return _train(cmd, argv, Path(cmd.run.resume or cmd.run.run_dir), env_kwargs, train_env_kwargs, distill,
                      primary=False)
    with run_directory(cmd, saved, "distill" if distill is not None else "train") as run_dir:
        if cmd.run.resume is not None and process_count() == 1 and _already_trained(cmd, run_dir):
            return 0
        return _train(cmd, argv, run_dir, env_kwargs, train_env_kwargs, distill, primary=True)


def _open_run(cmd: TrainCommand, argv: list[str], run_dir: Path, spec, env_kwargs: dict, train_env_kwargs: dict,
              distill, primary: bool) -> Run:
    """The run's :class:`~nnx_ppo.runner.Run` (locked; config.json is
    written when training begins), with W&B for ``--wandb``."""
    resuming = cmd.run.resume is not None
    saved = rd.read_run_config(run_dir) if resuming else None
    wandb = import_wandb(cmd) if primary else None
    wandb_id = (saved or {}).get("wandb_id") or (uuid.uuid4().hex[:8] if wandb is not None else None)
    preset = _preset(cmd)
    extra: dict[str, Any] = {} if preset is None else {"preset": {"env": preset.env, "network": preset.network}}
    if distill is not None:
        extra["distillation"] = {"teacher_run": distill.teacher_run, **dataclasses.asdict(distill.config)}
    if wandb_id is not None and not resuming:
        extra["wandb_id"] = wandb_id
    run_spec = RunSpec(env=cmd.env, network=spec.to_dict(), config=cmd.config, env_kwargs=env_kwargs,
                       train_env_kwargs=train_env_kwargs, seeds=tuple(cmd.seeds), extra=extra, command=(PROG, *argv))
    wandb_run = None
    if wandb is not None:
        wandb_run = wandb_init(wandb, project=cmd.run.wandb_project, name=run_dir.name, id=wandb_id, dir=str(run_dir),
                                config=saved or run_spec.to_dict(), resume="allow")
    return Run.open(run_dir, run_spec, resuming=resuming, progress=True, quiet=cmd.run.quiet, wandb_run=wandb_run,
                    primary=primary)


def _train(cmd: TrainCommand, argv: list[str], run_dir: Path, env_kwargs: dict, train_env_kwargs: dict,
           distill, primary: bool) -> int:
    """Build the envs and the network, open the run, train, and turn every
    way training can end into an exit code with the run directory intact."""
    train_env, env = make_envs(cmd.env, env_kwargs, train_env_kwargs)
    spec = network_spec_of(cmd, env_kwargs, cmd.config.seed)
    network = build_network(spec, env, cmd)
    if cmd.run.video_every < 0:
        raise CliError(f"--video-every must be >= 0, got {cmd.run.video_every}")
    if cmd.run.video_every and cmd.seeds:
        raise CliError("--video-every is not available with --seeds")
    if cmd.run.video_every:
        check_video_target(str(run_dir / "videos" / "check.mp4"), env, cmd.env, flag="--video-every")
    run = _open_run(cmd, argv, run_dir, spec, env_kwargs, train_env_kwargs, distill, primary)
    if primary:
        _announce(cmd, run_dir, env_kwargs)
    t0 = time.perf_counter()
    code, result, stopped = train_into(run, lambda stop: _fit(cmd, train_env, env, network, run, stop, distill))
    if result is not None:
        code, result = result
    if result is not None and primary:
        _summary(result, time.perf_counter() - t0, stopped, run_dir, max(len(cmd.seeds), 1))
    if primary:
        print(f"run directory: {pretty_path(run_dir)}", flush=True)
    return code


def _fit(cmd: TrainCommand, train_env, env, network, run: Run, stop, distill):
    """Train (PPO, a seed batch, or distillation) into ``run``: ``(exit code, result)``."""
    from nnx_ppo.algorithms.trainer import train_ppo

    config = cmd.config
    options = dict(run=run, should_stop=stop, eval_env=env,
                   resume_from=run.checkpoint_dir if cmd.run.resume is not None else None)
    if cmd.seeds:
        from nnx_ppo.algorithms.population import train_seeds

        spec = NetworkSpec.from_dict(run.spec.network)
        results = train_seeds(train_env, lambda rngs: spec.build(env, rngs), config, list(cmd.seeds), **options)
        return _report_seeds(cmd, run, results), results[0]
    on_evaluation = video_recorder(cmd, env, run) if cmd.run.video_every else None
    if distill is not None:
        from nnx_ppo.algorithms.distillation import train_distillation

        return 0, train_distillation(train_env, distill.teacher, network, config, distillation=distill.config,
                                     on_evaluation=on_evaluation, **options)
    return 0, train_ppo(train_env, network, config, on_evaluation=on_evaluation, **options)


# ``nnx-ppo distill``: distill a trained run's policy into a new network. The
# teacher run's config.json gives the env, its kwargs and the training config;
# the student gets its own run directory, trained by run_train above (metrics,
# TensorBoard, curve, checkpoints), so ``nnx-ppo eval`` reads it like any run.


@dataclasses.dataclass(frozen=True)
class DistillSetup:
    """What ``run_train`` needs to distill instead of running PPO."""

    teacher: object
    config: object  # DistillationConfig
    teacher_run: str


def _teacher(teacher_run: Path, saved: dict, config) -> DistillSetup:
    """What distilling from the run ``teacher_run`` (its config.json is
    ``saved``) with ``config`` (a DistillationConfig) needs: the teacher,
    its final policy (of a run of several seeds, the first seed's)."""
    env, spec, ckpt_dir = run_policy_spec(teacher_run, saved)
    seeds = saved.get("seeds")
    teacher = load_run_network(ckpt_dir, spec.build(env), seed=int(seeds[0]) if seeds else None,
                               what=f"teacher {teacher_run}: ")
    return DistillSetup(teacher=teacher, config=config, teacher_run=str(teacher_run.resolve()))


def resumed_distillation(saved: dict) -> DistillSetup:
    """What a distillation run (its ``config.json`` is ``saved``) needs to be
    resumed: its teacher, loaded again from the teacher's run, and its
    distillation settings."""
    from nnx_ppo.algorithms.distillation import DistillationConfig

    recorded = dict(saved["distillation"])
    teacher_run = Path(recorded.pop("teacher_run"))
    with usage_errors(TypeError, ValueError, prefix="cannot read the distillation settings of the run: "):
        config = DistillationConfig(**recorded)
    return _teacher(teacher_run, read_run(teacher_run, rebuild="use it as a teacher"), config)


def student_run(cmd: DistillCommand) -> tuple[TrainCommand, DistillSetup]:
    """``nnx-ppo distill``: the student's training command and its
    distillation setup, which ``nnx-ppo train``'s runner trains
    (:func:`run_train`, with ``distill=``)."""
    from nnx_ppo.algorithms.distillation import DistillationConfig

    teacher_run = Path(cmd.teacher_run)
    saved = read_run(teacher_run, rebuild="use it as a teacher")
    with usage_errors(KeyError, TypeError, ValueError, prefix=f"cannot read {teacher_run / rd.CONFIG_FILE}: "):
        config = rd.train_config_from_dict(saved["config"])
    with usage_errors(ValueError):
        distillation = DistillationConfig(teacher_mixing=cmd.teacher_mixing,
                                          teacher_mixing_steps=cmd.teacher_mixing_steps)
        ppo = dataclasses.replace(
            config.ppo, total_steps=config.ppo.total_steps if cmd.total_steps is None else cmd.total_steps,
            learning_rate=config.ppo.learning_rate if cmd.learning_rate is None else cmd.learning_rate)
    setup = _teacher(teacher_run, saved, distillation)
    student_cmd = TrainCommand(env=saved["env"], setup=_saved_setup(saved, network=cmd.network,
                                                                    hidden_size=cmd.hidden_size),
                               config=dataclasses.replace(config, ppo=ppo, seed=cmd.seed),
                               run=RunFlags(run_dir=cmd.run_dir, quiet=cmd.quiet))  # (run_directory names a new one)
    return student_cmd, setup


# What a training run sends elsewhere: W&B (--wandb) and videos (--video-every).


def import_wandb(cmd: TrainCommand):
    if not cmd.run.wandb:
        return None
    try:
        import wandb
    except ImportError:
        raise CliError("--wandb needs Weights & Biases: pip install wandb  (or pip install 'nnx_ppo[wandb]')") from None
    return wandb


def _wandb_has_key() -> bool:
    """Whether W&B can log in without asking: a key in WANDB_API_KEY or in ~/.netrc (where `wandb login` puts it)."""
    import netrc
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_init(wandb, **kwargs):
    """``wandb.init``, falling back to offline mode (with a warning, never a
    traceback or a hang) without an API key, or when W&B cannot be reached
    within 30 s; ``wandb sync`` uploads an offline run later."""
    if not os.environ.get("WANDB_MODE") and not _wandb_has_key():
        print_warning("--wandb: no W&B API key (WANDB_API_KEY or `wandb login`); logging offline into the run "
                      "directory, upload it later with `wandb sync`")
        return wandb.init(mode="offline", **kwargs)
    try:
        return wandb.init(settings=wandb.Settings(init_timeout=30), **kwargs)
    except Exception as err:  # no network, a bad key, the service down: W&B raises its own errors
        print_warning(f"--wandb: W&B could not be reached ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                      "logging offline into the run directory, upload it later with `wandb sync`")
    try:
        wandb.teardown()  # the failed attempt holds the run id in W&B's service
        return wandb.init(mode="offline", **kwargs)
    except Exception as err:
        print_warning(f"--wandb: offline logging failed too ({type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                      "training without W&B")
        return None


def video_recorder(cmd: TrainCommand, env, run: Run):
    """``on_evaluation`` for ``--video-every N``: every N-th evaluation, one
    deterministic episode to ``<run>/videos/step_<env steps>.mp4``, TensorBoard and W&B."""
    count = [0]
    max_len = cmd.config.eval.max_episode_length
    fps = video_fps(env, None)

    def record(policy, env_steps: int) -> None:
        count[0] += 1
        if count[0] % cmd.run.video_every:
            return
        path = run.path / "videos" / f"step_{env_steps:010d}.mp4"
        frames = render_episode(env, policy, max_len, seed=cmd.config.seed)
        write_video(str(path), frames, fps)
        if run.logger is not None:
            run.logger.log_video(path, frames, fps, env_steps)
        run.write(f"video: {pretty_path(path)} ({len(frames)} frames)")

    return record
