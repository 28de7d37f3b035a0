"""``nnx-ppo train``: build the envs and the network, write the run directory, train.

And what a training run of the command line sends elsewhere: Weights & Biases
(``--wandb``, offline when W&B cannot be reached) and videos of the policy
(``--video-every``)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.app.commands import (
    DEFAULT_HIDDEN_SIZE,
    PROG,
    CliError,
    TrainCommand,
    check_distinct_seeds,
    print_error,
    print_warning,
    shell_command,
)
from nnx_ppo.app.ending import train_into
from nnx_ppo.app.evaluate import check_video_target, render_episode, video_fps, write_video
from nnx_ppo.app.runs import (
    build_network,
    fresh_run_dir,
    has_checkpoint,
    lock_run_dir,
    make_env,
    network_spec_of,
    parse_env_kwargs,
    read_run,
)
from nnx_ppo.network_spec import NetworkSpec, is_factory_reference, network_kwargs
from nnx_ppo.presets import NETWORK_DEFAULTS, find_preset
from nnx_ppo.progress import fmt_seconds, pretty_path
from nnx_ppo.runner import Run, RunSpec

__all__ = ["run_train", "resume_defaults", "resume_changes", "import_wandb", "wandb_init", "video_recorder"]


def resume_defaults(run_dir: str) -> tuple[TrainCommand, dict[str, Any]]:
    """The command that continues the run in ``run_dir`` (a TrainCommand, or
    a SweepCommand for a sweep), holding the run's saved settings: the
    parser's defaults for ``resume``/``--resume``, so that only flags given
    explicitly change anything (and :func:`resume_changes` checks those)."""
    from nnx_ppo.app.commands import SweepCommand

    saved = read_run(Path(run_dir), rebuild="resume it")
    try:
        rd.read_metrics(run_dir, strict=True)  # a bad row refused before anything is built
    except rd.MetricsError as e:
        raise CliError(str(e)) from None
    try:
        net = saved["network"]
        hidden_size = int(net.get("hidden_size") or DEFAULT_HIDDEN_SIZE)
        extra = _extra_network_kwargs(net)
        fields = dict(
            env=saved["env"],
            network=net["kind"],
            hidden_size=hidden_size,
            network_kwargs=json.dumps(extra) if extra else None,
            env_kwargs=json.dumps(saved.get("env_kwargs", {})),
            train_env_kwargs=json.dumps(saved.get("train_env_kwargs", {})),
            config=rd.train_config_from_dict(saved["config"]),
            no_preset=True,  # the run's own settings are the defaults
            seeds=tuple(int(s) for s in saved.get("seeds", ())),
            resume=run_dir,
        )
        if "members" in saved:
            population = saved["population"]
            pbt = population.get("pbt") or {}
            return SweepCommand(**{**fields, "seeds": tuple(population["seeds"])},
                                pbt_every=int(pbt.get("every_iterations", 0))), saved
    except (KeyError, TypeError, ValueError) as e:
        raise CliError(f"cannot read {Path(run_dir) / rd.CONFIG_FILE}: {e}") from None
    return TrainCommand(**fields), saved


def _extra_network_kwargs(network: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a saved network (config.json's ``network``)
    that ``--network-kwargs`` gave: those its width does not set."""
    sized = network_kwargs(network["kind"], int(network.get("hidden_size") or DEFAULT_HIDDEN_SIZE))
    return {k: v for k, v in (network.get("kwargs") or {}).items() if k not in sized}


def resume_changes(cmd: TrainCommand, saved: dict[str, Any], env_kwargs: dict, train_env_kwargs: dict
                   ) -> dict[str, list]:
    """What resuming the run ``saved`` with ``cmd`` changes (``{"ppo.total_steps":
    [before, after]}``), printed; a change of anything that makes the run
    (the env, the network, the seeds, a config field not declared resumable)
    is a one-line CliError naming the flag."""
    from nnx_ppo.algorithms.config import resume_changes as config_changes

    network = saved["network"]
    kwargs = parse_env_kwargs(cmd.network_kwargs, cmd.env, "--network-kwargs")
    for what, now, before in (
        ("env", cmd.env, saved["env"]),
        ("--network", _normalized_network(cmd.network), network["kind"]),
        ("--hidden-size", cmd.hidden_size, network["hidden_size"]),
        ("--network-kwargs", kwargs, _extra_network_kwargs(network)),
        ("--env-kwargs", env_kwargs, saved.get("env_kwargs", {})),
        ("--train-env-kwargs", train_env_kwargs, saved.get("train_env_kwargs", {})),
        ("--seeds", list(cmd.seeds), list(saved.get("population", saved).get("seeds", []))),
    ):
        if now != before:
            raise CliError(f"cannot change {what} when resuming ({before!r} in the run, {now!r} given)")
    try:
        changes = config_changes(saved["config"], cmd.config)
    except ValueError as e:
        raise CliError(str(e)) from None
    for name, (before, after) in changes.items():
        print(f"resuming with --{name.replace('_', '-')} {after} (was {before})", flush=True)
    if changes and cmd.resume is not None:
        _print_decay_change(cmd, saved)
    return changes


def _print_decay_change(cmd: TrainCommand, saved: dict[str, Any]) -> None:
    """With ``--ppo.learning-rate-decay``: one line when resuming stretches or
    shrinks the decay (its end moves; the rate jumps), with the rate before
    and after at the update the run continues from."""
    from nnx_ppo.algorithms import checkpointing

    before, after = rd.train_config_from_dict(saved["config"], learning_rate=1.0).ppo, cmd.config.ppo
    latest = checkpointing.latest_checkpoint(Path(cmd.resume) / rd.CHECKPOINT_DIR)
    if not after.learning_rate_decay or latest is None or before.total_updates == after.total_updates:
        return
    step = int(latest.name.removeprefix("step_"))
    update = step // before.steps_per_iteration * before.n_epochs * before.n_minibatches
    old, new = (max(0.0, 1.0 - update / ppo.total_updates) for ppo in (before, after))
    rates = (f"{old * after.learning_rate:.3g} to {new * after.learning_rate:.3g}" if "members" not in saved
             else f"{old:.1%} to {new:.1%} of each member's learning rate")
    end, was = (ppo.n_iterations * ppo.steps_per_iteration for ppo in (after, before))
    print(f"resuming changes the learning-rate decay: it now reaches 0 at {end:,} env steps ({after.total_updates:,} "
          f"updates; was {was:,}, {before.total_updates:,}), so at step {step:,} (update {update:,}) the rate goes "
          f"from {rates}", flush=True)


def _run_directory(cmd: TrainCommand, saved: dict[str, Any] | None, command: str = "train") -> Path:
    """The run directory, locked (the caller releases
    ``rd.RunLock(run_dir)``); for ``--resume``, after checking that there is
    a checkpoint to resume from."""
    from nnx_ppo.user_code import short_name

    check_distinct_seeds(cmd.seeds)
    if cmd.resume is None:
        run_dir = Path(cmd.run_dir) if cmd.run_dir else rd.default_run_dir(short_name(cmd.env))
        lock = lock_run_dir(run_dir)
        try:
            return fresh_run_dir(run_dir, cmd.overwrite)
        except BaseException:
            lock.release()
            raise
    assert saved is not None
    if cmd.run_dir is not None and Path(cmd.run_dir).resolve() != Path(cmd.resume).resolve():
        raise CliError("give either --run-dir or --resume, not both")
    run_dir = Path(cmd.resume)
    if not has_checkpoint(run_dir / rd.CHECKPOINT_DIR):
        from nnx_ppo.algorithms.checkpointing import held_checkpoints

        again = f"{shell_command(PROG, command, '...', '--run-dir', run_dir)} --overwrite"
        if held_checkpoints(run_dir / rd.CHECKPOINT_DIR) == "a best policy":
            raise CliError(f"{run_dir} has no training checkpoint to resume from, only its best policy (which holds "
                           f"no optimizer state): evaluate or export it with --best, or start it again: {again}")
        raise CliError(f"{run_dir} has no checkpoints to resume from (it stopped before its first one); start it "
                       f"again: {again}")
    lock = lock_run_dir(run_dir)
    try:
        rd.check_writable(run_dir)
        _check_writable_files(run_dir)
    except BaseException:
        lock.release()
        raise
    return run_dir


def _check_writable_files(run_dir: Path) -> None:
    """A resumed run appends to its files: each must be writable (one line naming the first that is not)."""
    import os

    for path in [run_dir, *(run_dir / name for name in (rd.CONFIG_FILE, rd.METRICS_FILE, rd.CHECKPOINT_DIR))]:
        if path.exists() and not os.access(path, os.W_OK):
            raise CliError(f"cannot resume {run_dir}: {path} is not writable")


def _already_trained(cmd: TrainCommand, run_dir: Path) -> bool:
    """For ``--resume``: whether the run's latest checkpoint already holds the
    steps asked for (then nothing is trained, and nothing is rewritten)."""
    from nnx_ppo.algorithms import checkpointing

    latest = checkpointing.latest_checkpoint(run_dir / rd.CHECKPOINT_DIR)
    done = int(latest.name.removeprefix("step_")) if latest is not None else 0
    wanted = cmd.config.ppo.n_iterations * cmd.config.ppo.steps_per_iteration
    if done < wanted:
        return False
    print(f"{pretty_path(run_dir)} already trained {done:,} env steps (--ppo.total-steps {wanted:,}); nothing to "
          f"do. Train longer with: {shell_command(PROG, 'resume', pretty_path(run_dir), '--ppo.total-steps', 'N')}")
    return True


def _normalized_network(network: str) -> str:
    """``--network`` as config.json records it (a file reference made absolute)."""
    from nnx_ppo.network_spec import NetworkSpec

    try:
        return NetworkSpec.sized("", network, 1).kind
    except ValueError:
        return network


def _network_title(cmd: TrainCommand) -> str:
    """``lstm (hidden 32)``, or the user's network reference."""
    return cmd.network if is_factory_reference(cmd.network) else f"{cmd.network} (hidden {cmd.hidden_size})"


def _envs(cmd: TrainCommand, env_kwargs: dict, train_env_kwargs: dict):
    """``(train_env, eval_env)`` (:func:`nnx_ppo.run_dir.training_env_kwargs`
    says how the training env differs)."""
    return make_env(cmd.env, rd.training_env_kwargs(env_kwargs, train_env_kwargs)), make_env(cmd.env, env_kwargs)


def _run_spec(cmd: TrainCommand, argv: list[str], spec, env_kwargs: dict, train_env_kwargs: dict, distill,
              wandb_id: str | None) -> RunSpec:
    """The run as the command line describes it (a fresh run's ``config.json``)."""
    extra: dict[str, Any] = {}
    preset = None if cmd.no_preset else find_preset(cmd.env, cmd.network)
    if preset is not None:
        extra["preset"] = {"env": preset.env, "network": preset.network}
    if distill is not None:
        extra["distillation"] = {"teacher_run": distill.teacher_run, **dataclasses.asdict(distill.config)}
    if wandb_id is not None:
        extra["wandb_id"] = wandb_id
    return RunSpec(env=cmd.env, network=spec.to_dict(), config=cmd.config, env_kwargs=env_kwargs,
                   train_env_kwargs=train_env_kwargs, seeds=tuple(cmd.seeds), extra=extra, command=(PROG, *argv))


def _announce(cmd: TrainCommand, run_dir: Path, env_kwargs: dict, resuming: bool) -> None:
    ppo = cmd.config.ppo
    total = ppo.n_iterations * ppo.steps_per_iteration
    print(f"run directory: {pretty_path(run_dir)}", flush=True)
    print(f"{'resuming' if resuming else 'training'} {_network_title(cmd)} on {cmd.env}"
          f"{' ' + json.dumps(env_kwargs) if env_kwargs else ''}: {total:,} env steps, "
          f"{ppo.n_envs} envs x {ppo.rollout_length} steps per iteration", flush=True)
    preset = None if cmd.no_preset else find_preset(cmd.env, cmd.network)
    if preset is not None and not resuming:
        print(f"starting from the tuned preset for {preset.env} ({preset.network}); flags given override it, "
              "--no-preset starts from the library defaults", flush=True)
    elif cmd.network in NETWORK_DEFAULTS and not resuming:
        print(f"starting from the library defaults for --network {cmd.network} (docs/training.md, \"The defaults "
              f"over a suite of tasks\"); flags given override them", flush=True)


def _summary(result, elapsed: float, stopped: bool, run_dir: Path, n_seeds: int = 1) -> None:
    import numpy as np

    if stopped:
        print(f"stopped early at {result.total_steps:,} env steps; continue with: "
              f"{shell_command(PROG, 'resume', pretty_path(run_dir))}")
    line = f"trained {result.total_steps:,} env steps{' per seed' if n_seeds > 1 else ''} in {fmt_seconds(elapsed)} " \
           f"(compile {result.compile_seconds:.1f} s)"
    if result.eval_history and n_seeds == 1:
        _, last = result.eval_history[-1]
        line += (
            f"; final eval return {last['eval/episode_return']:.3f}"
            f" ± {last.get('eval/episode_return_std', np.nan):.3f}"
        )
    elif result.metrics and n_seeds == 1:
        line += f"; last train return {result.metrics.get('train/episode_return', np.nan):.3f}"
    print(line)
    best = _best_policies(run_dir)
    if best:
        kept = shell_command(PROG, "eval", pretty_path(run_dir), "--best")
        print("best eval return " + ", ".join(best) + f" (kept: {kept})")
    print(f"evaluate with: {shell_command(PROG, 'eval', pretty_path(run_dir))}")


def _best_policies(run_dir: Path) -> list[str]:
    """``"R at step S"`` of each best policy kept in the run (``"seed N: ..."`` for a seed batch)."""
    from nnx_ppo.algorithms import checkpointing

    root = checkpointing.best_policy_dir(run_dir / rd.CHECKPOINT_DIR)
    found = []
    for path in [root, *sorted(root.glob("seed_*"), key=lambda p: int(p.name[5:]))] if root.is_dir() else []:
        latest = checkpointing.latest_checkpoint(path)
        if latest is not None:
            metadata = checkpointing.load_metadata(latest) or {}
            where = f"seed {path.name[5:]}: " if path != root else ""
            step = int(latest.name.removeprefix("step_"))
            found.append(f"{where}{metadata.get('eval', {}).get('eval/episode_return', float('nan')):.3f} at step "
                         f"{step:,}")
    return found


def _report_seeds(cmd: TrainCommand, run: Run, results) -> None:
    """After ``--seeds``: each seed's final evaluation, and each failure in one line."""
    finals = [(s, r.eval_history[-1][1]["eval/episode_return"]) for s, r in zip(cmd.seeds, results) if r.eval_history]
    if finals:
        run.write("final eval return per seed: " + ", ".join(f"{s}: {f:.3f}" for s, f in finals)
                  + f"; mean {sum(f for _, f in finals) / len(finals):.3f}")
    for s, r in zip(cmd.seeds, results):
        if r.failure is not None:
            print_error(f"seed {s} failed at iteration {r.failure.iteration} ({r.failure.env_steps} env steps) and "
                        f"keeps its parameters from iteration {r.failure.iteration - 1}: {r.failure.error}")


def run_train(cmd: TrainCommand, argv: list[str], saved: dict[str, Any] | None, distill=None) -> int:
    """``nnx-ppo train`` (and ``resume``): returns the exit code (0 done or
    stopped, 1 failed, 130 aborted). With ``distill`` (a
    :class:`nnx_ppo.app.distill.DistillSetup`), ``nnx-ppo distill``: the
    same run, trained by distillation from its teacher.

    The run directory is locked from the first check to the last line."""
    from nnx_ppo.algorithms.distributed import is_primary, process_count
    from nnx_ppo.user_code import normalized

    cmd = dataclasses.replace(cmd, env=normalized(cmd.env))  # a FILE.py:NAME env recorded by its absolute path
    env_kwargs = parse_env_kwargs(cmd.env_kwargs, cmd.env)
    train_env_kwargs = parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs")
    primary = is_primary()  # in a run of several processes only process 0 writes the run directory and logs
    if process_count() > 1 and cmd.run_dir is None and cmd.resume is None:
        raise CliError("--run-dir is required with several processes (every process must name the same directory)")
    if cmd.resume is not None:
        resume_changes(cmd, saved, env_kwargs, train_env_kwargs)  # (the run records them when training begins)
    if cmd.resume is not None and "distillation" in saved:  # a distillation run resumes as one, from its teacher
        from nnx_ppo.app.distill import resumed_distillation

        distill = resumed_distillation(saved)
    if not primary:
        return _train(cmd, argv, Path(cmd.resume or cmd.run_dir), env_kwargs, train_env_kwargs, distill,
                      primary=False)
    run_dir = _run_directory(cmd, saved, "distill" if distill is not None else "train")
    try:
        if cmd.resume is not None and process_count() == 1 and _already_trained(cmd, run_dir):
            return 0
        return _train(cmd, argv, run_dir, env_kwargs, train_env_kwargs, distill, primary=True)
    finally:
        rd.RunLock(run_dir).release()


def _open_run(cmd: TrainCommand, argv: list[str], run_dir: Path, spec, env_kwargs: dict, train_env_kwargs: dict,
              distill, primary: bool) -> Run:
    """The run's :class:`~nnx_ppo.runner.Run` (locked; config.json is
    written when training begins), with W&B for ``--wandb``."""
    resuming = cmd.resume is not None
    saved = rd.read_run_config(run_dir) if resuming else None
    wandb = import_wandb(cmd) if primary else None
    wandb_id = (saved or {}).get("wandb_id") or (uuid.uuid4().hex[:8] if wandb is not None else None)
    run_spec = _run_spec(cmd, argv, spec, env_kwargs, train_env_kwargs, distill, None if resuming else wandb_id)
    wandb_run = None
    if wandb is not None:
        wandb_run = wandb_init(wandb, project=cmd.wandb_project, name=run_dir.name, id=wandb_id, dir=str(run_dir),
                                config=saved or run_spec.to_dict(), resume="allow")
    return Run.open(run_dir, run_spec, resuming=resuming, progress=True, quiet=cmd.quiet, wandb_run=wandb_run,
                    primary=primary)


def _train(cmd: TrainCommand, argv: list[str], run_dir: Path, env_kwargs: dict, train_env_kwargs: dict,
           distill, primary: bool) -> int:
    """Build the envs and the network, open the run, train, and turn every
    way training can end into an exit code with the run directory intact."""
    train_env, env = _envs(cmd, env_kwargs, train_env_kwargs)
    spec = network_spec_of(cmd, env_kwargs, cmd.config.seed)
    network = build_network(spec, env, cmd)
    if cmd.video_every < 0:
        raise CliError(f"--video-every must be >= 0, got {cmd.video_every}")
    if cmd.video_every and cmd.seeds:
        raise CliError("--video-every is not available with --seeds")
    if cmd.video_every:
        check_video_target(str(run_dir / "videos" / "check.mp4"), env, cmd.env, flag="--video-every")
    run = _open_run(cmd, argv, run_dir, spec, env_kwargs, train_env_kwargs, distill, primary)
    if primary:
        _announce(cmd, run_dir, env_kwargs, cmd.resume is not None)
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
    from nnx_ppo.algorithms.ppo import new_training_state, train_ppo

    config = cmd.config
    options = dict(run=run, should_stop=stop, eval_env=env,
                   resume_from=run.checkpoint_dir if cmd.resume is not None else None)
    if cmd.seeds:
        from nnx_ppo.algorithms.seeds import train_seeds

        spec = NetworkSpec.from_dict(run.spec.network)
        results = train_seeds(train_env, lambda rngs: spec.build(env, rngs), config, list(cmd.seeds), **options)
        _report_seeds(cmd, run, results)
        failed = [s for s, r in zip(cmd.seeds, results) if r.failure is not None]
        if failed:
            print_error(f"seeds {failed} failed (the others trained on); the run directory is kept and "
                        f"resumable: {shell_command(PROG, 'resume', pretty_path(run.path))}")
        return (1 if failed else 0), results[0]
    on_evaluation = video_recorder(cmd, env, run) if cmd.video_every else None
    if distill is not None:
        from nnx_ppo.algorithms.distillation import train_distillation

        return 0, train_distillation(train_env, distill.teacher, network, config, distillation=distill.config,
                                     on_evaluation=on_evaluation, **options)
    state = new_training_state(train_env, network, config)
    return 0, train_ppo(train_env, network, config, state=state, on_evaluation=on_evaluation, **options)


# What a training run sends elsewhere: W&B (--wandb) and videos (--video-every).


def import_wandb(cmd: TrainCommand):
    if not cmd.wandb:
        return None
    try:
        import wandb
    except ImportError:
        raise CliError("--wandb needs Weights & Biases: pip install wandb  (or pip install 'nnx_ppo[wandb]')") from None
    return wandb


def _wandb_has_key() -> bool:
    """Whether W&B can log in without asking: a key in WANDB_API_KEY or in ~/.netrc (where `wandb login` puts it)."""
    import netrc
    import os

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
    import os

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
        if count[0] % cmd.video_every:
            return
        path = run.path / "videos" / f"step_{env_steps:010d}.mp4"
        frames = render_episode(env, policy, max_len, seed=cmd.config.seed)
        write_video(str(path), frames, fps)
        if run.logger is not None:
            run.logger.log_video(path, frames, fps, env_steps)
        run.write(f"video: {pretty_path(path)} ({len(frames)} frames)")

    return record
