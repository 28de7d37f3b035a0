"""What a training run of the command line sends elsewhere: Weights & Biases
(``--wandb``, offline when W&B cannot be reached) and videos of the policy
(``--video-every``)."""

from __future__ import annotations

from nnx_ppo.app.commands import CliError, TrainCommand, print_warning
from nnx_ppo.progress import pretty_path
from nnx_ppo.runner import Run

__all__ = ["import_wandb", "wandb_init", "video_recorder"]


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
    from nnx_ppo.app.evaluate import render_episode, video_fps, write_video

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
