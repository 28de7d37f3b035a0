"""``nnx-ppo train``: build the envs and the network, write the run directory, train."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.algorithms.config import check_seed
from nnx_ppo.app.commands import (
    DEFAULT_HIDDEN_SIZE,
    PROG,
    CliError,
    TrainCommand,
    build_network,
    fresh_run_dir,
    has_checkpoint,
    make_env,
    network_spec_of,
    parse_env_kwargs,
    print_error,
    print_warning,
    read_run,
)
from nnx_ppo.app.evaluate import check_video_target
from nnx_ppo.network_spec import is_factory_reference, network_kwargs
from nnx_ppo.presets import find_preset
from nnx_ppo.progress import Progress, StopFlag, fmt_seconds, pretty_path


def resume_defaults(run_dir: str) -> tuple[TrainCommand, dict[str, Any]]:
    """A TrainCommand holding a run's saved settings (used as the parser's
    defaults for --resume, so only flags given explicitly change anything)."""
    saved = read_run(Path(run_dir), rebuild="resume it")
    try:
        if "distillation" in saved:
            raise CliError(f"{run_dir} is a distillation run (nnx-ppo distill); it cannot be resumed with "
                           "`train --resume` yet: distill again with a larger --total-steps")
        config = rd.train_config_from_dict(saved["config"])
        net = saved["network"]
        hidden_size = int(net.get("hidden_size") or DEFAULT_HIDDEN_SIZE)
        sized = network_kwargs(net["kind"], hidden_size)
        extra = {k: v for k, v in (net.get("kwargs") or {}).items() if k not in sized}
        cmd = TrainCommand(
            env=saved["env"],
            network=net["kind"],
            hidden_size=hidden_size,
            network_kwargs=json.dumps(extra) if extra else None,
            env_kwargs=json.dumps(saved.get("env_kwargs", {})),
            train_env_kwargs=json.dumps(saved.get("train_env_kwargs", {})),
            config=config,
            reward_scale=float(saved.get("reward_scale", 1.0)),
            no_preset=True,  # the run's own settings are the defaults
            seeds=tuple(int(s) for s in saved.get("seeds", ())),
            resume=run_dir,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CliError(f"cannot read {Path(run_dir) / rd.CONFIG_FILE}: {e}") from None
    return cmd, saved


def _run_directory(cmd: TrainCommand, saved: dict[str, Any] | None, env_kwargs: dict, train_env_kwargs: dict) -> Path:
    """The run directory; for ``--resume``, after checking that nothing that
    must stay fixed changed and that there is a checkpoint to resume from."""
    if cmd.seeds and len(set(cmd.seeds)) != len(cmd.seeds):
        raise CliError(f"--seeds: give distinct seeds, got {list(cmd.seeds)}")
    for seed in cmd.seeds:
        try:
            check_seed(seed, "--seeds: each seed")
        except ValueError as e:
            raise CliError(str(e)) from None
    if cmd.resume is None:
        run_dir = Path(cmd.run_dir) if cmd.run_dir else rd.default_run_dir(cmd.env)
        return fresh_run_dir(run_dir, "train")
    assert saved is not None
    for what, now, before in (
        ("env", cmd.env, saved["env"]),
        ("--network", _normalized_network(cmd.network), saved["network"]["kind"]),
        ("--hidden-size", cmd.hidden_size, saved["network"]["hidden_size"]),
        ("--env-kwargs", env_kwargs, saved.get("env_kwargs", {})),
        ("--ppo.n-envs", cmd.config.ppo.n_envs, saved["config"]["ppo"]["n_envs"]),
        ("--ppo.rollout-length", cmd.config.ppo.rollout_length, saved["config"]["ppo"]["rollout_length"]),
        ("--reward-scale", cmd.reward_scale, float(saved.get("reward_scale", 1.0))),
        ("--train-env-kwargs", train_env_kwargs, saved.get("train_env_kwargs", {})),
        ("--seeds", list(cmd.seeds), list(saved.get("seeds", []))),
    ):
        if now != before:
            raise CliError(f"cannot change {what} when resuming ({before!r} in the run, {now!r} given)")
    if cmd.run_dir is not None and Path(cmd.run_dir).resolve() != Path(cmd.resume).resolve():
        raise CliError("give either --run-dir or --resume, not both")
    run_dir = Path(cmd.resume)
    if not has_checkpoint(run_dir / rd.CHECKPOINT_DIR):
        raise CliError(f"{run_dir} has no checkpoints to resume from")
    return run_dir


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
          f"do. Train longer with: {PROG} train --resume {pretty_path(run_dir)} --ppo.total-steps N")
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
    """``(train_env, eval_env)``. Training envs start their time-limit counters
    at random steps so the vmapped episodes de-synchronize, and get the
    reward scale; evaluation keeps full-length episodes and plain rewards."""
    env = make_env(cmd.env, env_kwargs)
    train_env = make_env(cmd.env, {"random_initial_steps": True, **env_kwargs, **train_env_kwargs})
    if not cmd.reward_scale > 0:
        raise CliError(f"--reward-scale must be positive, got {cmd.reward_scale}")
    if cmd.reward_scale != 1.0:
        from nnx_ppo.envs.wrappers import RewardScale

        train_env = RewardScale(train_env, cmd.reward_scale)
    return train_env, env


def _import_wandb(cmd: TrainCommand):
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


def _wandb_init(wandb, **kwargs):
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


def _run_config(cmd: TrainCommand, argv: list[str], saved: dict[str, Any] | None, spec, env_kwargs: dict,
                train_env_kwargs: dict) -> dict[str, Any]:
    """What ``config.json`` records (a resumed run keeps its history)."""
    content = rd.run_content(env=cmd.env, env_kwargs=env_kwargs, train_env_kwargs=train_env_kwargs,
                             network=spec.to_dict(), config=cmd.config, reward_scale=cmd.reward_scale, seeds=cmd.seeds,
                             command=[PROG, *argv], saved=saved)
    preset = None if cmd.no_preset else find_preset(cmd.env, cmd.network)
    if preset is not None and "preset" not in content:
        content["preset"] = {"env": preset.env, "network": preset.network}
    return content


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


def _summary(result, elapsed: float, stopped: bool, run_dir: Path, n_seeds: int = 1, distill=None) -> None:
    import numpy as np

    if stopped and distill is None:
        print(f"stopped early at {result.total_steps:,} env steps; continue with: "
              f"{PROG} train --resume {pretty_path(run_dir)}")
    elif stopped:  # (a distillation run cannot be resumed yet)
        print(f"stopped early at {result.total_steps:,} env steps; the student is saved (evaluate it with: {PROG} "
              f"eval {pretty_path(run_dir)}). A distillation run is not resumable: to train longer, distill again: "
              f"{PROG} distill {pretty_path(Path(distill.teacher_run))} --total-steps N")
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
        print("best eval return " + ", ".join(best) + f" (kept: {PROG} eval {pretty_path(run_dir)} --best)")
    print(f"evaluate with: {PROG} eval {pretty_path(run_dir)}")


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


def _train_seeds(cmd: TrainCommand, train_env, env, spec, logger, progress, config, checkpoints: dict):
    """``--seeds``: every seed in one program; the progress bar counts all
    seeds' steps and shows the mean evaluation over the seeds still training.
    Returns the results, one per seed."""
    from nnx_ppo.algorithms.seeds import train_seeds

    seeds = list(cmd.seeds)
    shown = {"iteration": None, "eval": None}
    pending: list[dict[str, float]] = []

    def show_evaluation() -> None:
        if pending:
            mean = {k: sum(m[k] for m in pending) / len(pending) for k in pending[0]}
            progress.evaluation(mean, shown["eval"] * len(seeds))
            pending.clear()

    def log_fn(metrics: dict[str, float], env_steps: int, seed: int) -> None:
        logger(metrics, env_steps, seed)
        if shown["eval"] != env_steps:
            show_evaluation()  # (a failed seed logs no more, so the rows of one step are counted by step)
        if rd.RunLogger.is_eval(metrics):
            shown["eval"] = env_steps
            pending.append(metrics)
        elif shown["iteration"] != env_steps:
            shown["iteration"] = env_steps
            progress.iteration(metrics, env_steps * len(seeds))

    progress.start()
    results = train_seeds(train_env, lambda rngs: spec.build(env, rngs), config, seeds, log_fn=log_fn, eval_env=env,
                          **checkpoints)
    show_evaluation()
    finals = [(s, r.eval_history[-1][1]["eval/episode_return"]) for s, r in zip(seeds, results) if r.eval_history]
    if finals:
        progress.write("final eval return per seed: " + ", ".join(f"{s}: {f:.3f}" for s, f in finals)
                       + f"; mean {sum(f for _, f in finals) / len(finals):.3f}")
    for s, r in zip(seeds, results):
        if r.failure is not None:
            print_error(f"seed {s} failed at iteration {r.failure.iteration} ({r.failure.env_steps} env steps) and "
                        f"keeps its parameters from iteration {r.failure.iteration - 1}: {r.failure.error}")
    return results


class _SilentLogger:
    """The logger of processes other than 0 in a run of several processes."""

    def __call__(self, metrics, env_steps, seed=None) -> None:
        pass

    def log_video(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


def _video_recorder(cmd: TrainCommand, env, run_dir: Path, logger, progress):
    """``on_evaluation`` for ``--video-every N``: every N-th evaluation, one
    deterministic episode to ``<run>/videos/step_<env steps>.mp4``, TensorBoard and W&B."""
    from nnx_ppo.app.evaluate import render_episode, video_fps, write_video

    count = [0]
    max_len = cmd.config.eval.max_episode_length
    fps = video_fps(env, None)

    def record(policy, env_steps: int) -> None:
        count[0] += 1
        if count[0] % cmd.video_every:
            return
        path = run_dir / "videos" / f"step_{env_steps:010d}.mp4"
        frames = render_episode(env, policy, max_len, seed=cmd.config.seed)
        write_video(str(path), frames, fps)
        logger.log_video(path, frames, fps, env_steps)
        progress.write(f"video: {pretty_path(path)} ({len(frames)} frames)")

    return record


def run_train(cmd: TrainCommand, argv: list[str], saved: dict[str, Any] | None, distill=None) -> int:
    """``nnx-ppo train``: returns the exit code (0 done or stopped, 1 failed, 130 aborted).
    With ``distill`` (a :class:`nnx_ppo.app.distill.DistillSetup`), ``nnx-ppo
    distill``: the same run, trained by distillation from its teacher.

    The steps are named helpers; what stays here is the order of the run
    and the one ``try`` that turns every way training can end into an exit
    code with the run directory intact."""
    from nnx_ppo.algorithms.distributed import is_primary, process_count
    from nnx_ppo.algorithms.driver import NonFiniteError
    from nnx_ppo.algorithms.ppo import new_training_state, train_ppo

    resuming = cmd.resume is not None
    env_kwargs = parse_env_kwargs(cmd.env_kwargs, cmd.env)
    train_env_kwargs = parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs")
    primary = is_primary()  # in a run of several processes only process 0 writes the run directory and logs
    if process_count() > 1 and cmd.run_dir is None and cmd.resume is None:
        raise CliError("--run-dir is required with several processes (every process must name the same directory)")
    run_dir = _run_directory(cmd, saved, env_kwargs, train_env_kwargs) if primary else Path(cmd.resume or cmd.run_dir)
    if resuming and process_count() == 1 and _already_trained(cmd, run_dir):
        return 0
    train_env, env = _envs(cmd, env_kwargs, train_env_kwargs)
    config = cmd.config
    spec = network_spec_of(cmd, env_kwargs, config.seed)
    network = build_network(spec, env, cmd)
    wandb = _import_wandb(cmd) if primary else None
    if cmd.video_every < 0:
        raise CliError(f"--video-every must be >= 0, got {cmd.video_every}")
    if cmd.video_every and cmd.seeds:
        raise CliError("--video-every is not available with --seeds")
    if cmd.video_every:
        check_video_target(str(run_dir / "videos" / "check.mp4"), env, cmd.env, flag="--video-every")

    ppo = config.ppo
    if primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        content = _run_config(cmd, argv, saved, spec, env_kwargs, train_env_kwargs)
        if distill is not None:
            content["distillation"] = {"teacher_run": distill.teacher_run, **dataclasses.asdict(distill.config)}
        wandb_run = None
        if wandb is not None:
            content.setdefault("wandb_id", uuid.uuid4().hex[:8])  # wandb >= 0.31 has no util.generate_id
            wandb_run = _wandb_init(wandb, project=cmd.wandb_project, name=run_dir.name, id=content["wandb_id"],
                                    dir=str(run_dir), config=content, resume="allow")
        rd.write_run_config(run_dir, content)
        _announce(cmd, run_dir, env_kwargs, resuming)
        logger = rd.RunLogger(run_dir, steps_per_iteration=ppo.steps_per_iteration,
                              title=f"{cmd.network} on {cmd.env}", wandb_run=wandb_run, resumed=resuming)
    else:
        logger = _SilentLogger()
    n_runs = max(len(cmd.seeds), 1)
    progress = Progress(ppo.n_iterations * ppo.steps_per_iteration * n_runs, ppo.steps_per_iteration * n_runs,
                        cmd.quiet or not primary)

    def log_fn(metrics: dict[str, float], env_steps: int) -> None:
        logger(metrics, env_steps)
        if rd.RunLogger.is_eval(metrics):
            progress.evaluation(metrics, env_steps)
        else:
            progress.iteration(metrics, env_steps)

    on_evaluation = _video_recorder(cmd, env, run_dir, logger, progress) if cmd.video_every else None
    metadata = {"network": spec.to_dict(), "run_dir": str(run_dir.resolve())}
    ckpt_dir = str((run_dir / rd.CHECKPOINT_DIR).resolve())
    t0 = time.perf_counter()
    code, result = 0, None
    stop = StopFlag(progress.write)
    try:
        with stop:
            if cmd.seeds:
                results = _train_seeds(cmd, train_env, env, spec, logger, progress, config, dict(
                    checkpoint_dir=ckpt_dir, resume_from=ckpt_dir if resuming else None,
                    checkpoint_metadata=metadata, should_stop=stop))
                result = results[0]
                failed = [s for s, r in zip(cmd.seeds, results) if r.failure is not None]
                if failed:
                    print_error(f"seeds {failed} failed (the others trained on); the run directory is kept and "
                                f"resumable: {PROG} train --resume {pretty_path(run_dir)}")
                    code = 1
            elif distill is not None:
                from nnx_ppo.algorithms.distillation import train_distillation

                progress.start()
                result = train_distillation(
                    train_env, distill.teacher, network, config, distillation=distill.config, eval_env=env,
                    log_fn=log_fn, checkpoint_dir=ckpt_dir, checkpoint_metadata=metadata, should_stop=stop,
                    on_evaluation=on_evaluation,
                )
            else:
                state = new_training_state(train_env, network, config)
                progress.start()
                result = train_ppo(
                    train_env, network, config, eval_env=env, log_fn=log_fn, state=state, checkpoint_dir=ckpt_dir,
                    resume_from=ckpt_dir if resuming else None, checkpoint_metadata=metadata, should_stop=stop,
                    on_evaluation=on_evaluation,
                )
    except KeyboardInterrupt:
        progress.close()
        print_error("aborted; metrics so far are kept, and the last saved checkpoint (if any) is in "
                    f"{pretty_path(run_dir / rd.CHECKPOINT_DIR)}")
        code = 130
    except NonFiniteError as e:
        progress.close()
        print_error(str(e))
        code = 1
    except (ValueError, OSError, RuntimeError) as e:  # env checks, checkpoints, shapes, the disk
        progress.close()
        if process_count() > 1:  # a collective that failed because a peer is gone: the watch names the peer
            from nnx_ppo.algorithms.distributed import await_lost_peer

            await_lost_peer(e)
        print_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        code = 1
    finally:
        progress.close()
        logger.close()
    if result is not None and primary:
        _summary(result, time.perf_counter() - t0, stop.requested, run_dir, n_runs, distill)
    if primary:
        print(f"run directory: {pretty_path(run_dir)}", flush=True)
    return code
