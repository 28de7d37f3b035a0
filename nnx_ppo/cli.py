"""``nnx-ppo``: train, evaluate and list environments from the command line.

    nnx-ppo train                      # the default agent: an LSTM on cue_memory
    nnx-ppo train gymnax:CartPole-v1 --network mlp --ppo.total-steps 200000
    nnx-ppo train --resume runs/cue_memory-20250101-120000
    nnx-ppo eval runs/cue_memory-20250101-120000 --episodes 100
    nnx-ppo envs

Every :class:`~nnx_ppo.algorithms.config.TrainConfig` field is a flag
(``--ppo.n-envs``, ``--eval.every-steps``, ``--seed`` ...), with its
documentation as help. See docs/cli.md.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import tyro

from nnx_ppo.algorithms.config import TrainConfig
from nnx_ppo import run_dir as rd
from nnx_ppo.presets import find_preset, get_preset, network_kwargs

__all__ = ["main", "TrainCommand", "EvalCommand", "EnvsCommand", "DEFAULT_ENV", "DEFAULT_TRAIN_CONFIG"]

PROG = "nnx-ppo"


def _has_checkpoint(directory: Path) -> bool:
    """A complete checkpoint exists (a crashed save's temp dir does not count)."""
    from nnx_ppo.algorithms.checkpointing import latest_checkpoint

    return directory.is_dir() and latest_checkpoint(directory) is not None

# ----------------------------------------------------------------------------- the default agent
#
# An LSTM actor-critic on the built-in memory task: a cue (one of 4) is shown
# at the first step and must be reported after 8 blank steps. A memoryless
# policy gets 0.25; the trained LSTM gets 1.0. On a laptop CPU this takes a
# couple of minutes. It is the cue_memory preset (nnx_ppo.presets); every
# env with a preset starts from it (see `nnx-ppo envs`).

DEFAULT_ENV = "cue_memory"
_DEFAULT_PRESET = get_preset(DEFAULT_ENV)
DEFAULT_ENV_KWARGS: dict[str, Any] = dict(_DEFAULT_PRESET.env_kwargs)
"""Used only when the env is the default one and ``--env-kwargs`` is not given."""

DEFAULT_NETWORK = _DEFAULT_PRESET.network
DEFAULT_HIDDEN_SIZE = _DEFAULT_PRESET.hidden_size
DEFAULT_TRAIN_CONFIG = _DEFAULT_PRESET.config


class CliError(Exception):
    """A user-facing error: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass
class TrainCommand:
    """Train a PPO agent. With no arguments: the default agent (an LSTM on the
    cue_memory memory task), which learns in a few minutes on a CPU. An env
    with a tuned preset (`nnx-ppo envs` lists them) starts from the preset's
    network and hyperparameters; flags given here override them.

    Writes a run directory (config.json, metrics.jsonl, TensorBoard events in
    tb/, learning_curve.png, checkpoints/). Ctrl-C stops cleanly after the
    current compiled call and saves a final checkpoint; continue with --resume.
    """

    env: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV_SPEC")] = DEFAULT_ENV
    """environment spec for nnx_ppo.envs.make, e.g. cue_memory, gymnax:CartPole-v1, playground:CartpoleBalance (see `nnx-ppo envs`)."""

    network: Literal["mlp", "lstm", "gru"] = DEFAULT_NETWORK
    """actor-critic architecture: feed-forward MLP, or an encoder + LSTM/GRU core."""

    hidden_size: int = DEFAULT_HIDDEN_SIZE
    """width of the hidden layers (mlp: two layers per actor/critic; lstm/gru: one encoder layer and the recurrent core)."""

    env_kwargs: Optional[str] = None
    """JSON object of keyword arguments for nnx_ppo.envs.make, e.g. '{"episode_length": 500}'. Default: {} (the default env cue_memory uses {"n_cues": 4, "delay": 8})."""

    config: Annotated[TrainConfig, tyro.conf.arg(name="")] = DEFAULT_TRAIN_CONFIG
    """training configuration."""

    train_env_kwargs: Optional[str] = None
    """JSON object of extra keyword arguments for the training env only, e.g. '{"random_reset_steps": 500}' (evaluation keeps full episodes)."""

    reward_scale: float = 1.0
    """multiply the training rewards by this (evaluation reports unscaled returns)."""

    no_preset: bool = False
    """ignore the env's tuned preset (see `nnx-ppo envs`): start from the library's defaults instead."""

    run_dir: Optional[str] = None
    """where to write the run (default: runs/<env>-<YYYYmmdd-HHMMSS>)."""

    resume: Optional[str] = None
    """continue the run in this directory (reads its config.json; flags given here override its training config, e.g. a larger --ppo.total-steps)."""

    quiet: bool = False
    """no progress bar; print only a few log lines (evaluations, summary)."""

    wandb: bool = False
    """also log metrics to Weights & Biases (needs `pip install wandb`)."""

    wandb_project: str = "nnx-ppo"
    """Weights & Biases project name (with --wandb)."""


@dataclasses.dataclass
class EvalCommand:
    """Evaluate the final policy of a run with deterministic episodes and print
    return statistics; optionally record a video (MP4/GIF, renderable envs only)."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """a run directory written by `nnx-ppo train`."""

    episodes: int = 16
    """number of evaluation episodes (run in parallel)."""

    max_episode_length: Optional[int] = None
    """step limit per episode (default: the run's eval.max_episode_length)."""

    seed: int = 0
    """seeds the env resets."""

    stochastic: bool = False
    """sample actions instead of taking the policy's mode/mean."""

    video: Optional[str] = None
    """also record one episode to this file (.mp4 or .gif); the env must be able to render (MuJoCo Playground envs)."""

    fps: Optional[float] = None
    """video frame rate (default: the env's control rate, else 30)."""


@dataclasses.dataclass
class EnvsCommand:
    """List the available environment specs."""


# ----------------------------------------------------------------------------- helpers


def _err(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr)


def _parse_env_kwargs(text: str | None, env: str, flag: str = "--env-kwargs") -> dict[str, Any]:
    if text is None:
        return dict(DEFAULT_ENV_KWARGS) if env == DEFAULT_ENV and flag == "--env-kwargs" else {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{flag} must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object, got {text!r}")
    return value


def _make_env(spec: str, kwargs: dict[str, Any]):
    from nnx_ppo import envs

    try:
        return envs.make(spec, **kwargs)
    except ValueError as e:
        raise CliError(str(e).splitlines()[0] if str(e) else f"invalid environment {spec!r}") from None
    except TypeError as e:
        raise CliError(f"bad keyword arguments for environment {spec!r}: {e}") from None
    except ImportError as e:
        raise CliError(str(e), code=1) from None


def _network_kwargs(kind: str, hidden_size: int) -> dict[str, Any]:
    if hidden_size <= 0:
        raise CliError(f"--hidden-size must be positive, got {hidden_size}")
    return network_kwargs(kind, hidden_size)


def _build_network(env, kind: str, kwargs: dict[str, Any], seed: int):
    from flax import nnx

    from nnx_ppo.networks.factories import make_actor_critic_for_env

    return make_actor_critic_for_env(env, kind, nnx.Rngs(seed), **kwargs)


def _pretty_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p.resolve())


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:d}:{sec:02d}"


class _StopFlag:
    """First Ctrl-C (or SIGTERM): ask training to stop after the current
    compiled call. A second Ctrl-C aborts immediately."""

    def __init__(self, announce):
        self.requested = False
        self._announce = announce
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._announce("stop requested: finishing the current step and saving a checkpoint "
                       "(Ctrl-C again to abort without saving)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    self._previous[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def __call__(self) -> bool:
        return self.requested


class _Progress:
    """Progress bar over env steps (tqdm), or a few plain lines with --quiet."""

    def __init__(self, total_steps: int, steps_per_iteration: int, quiet: bool):
        self.total = total_steps
        self.spi = steps_per_iteration
        self.quiet = quiet
        self.bar = None
        self.t_start = time.perf_counter()
        self.compile_reported = False
        self.eval_return: float | None = None
        self.train_return: float | None = None

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def start(self) -> None:
        self.t_start = time.perf_counter()
        self.write("compiling... (the first call compiles the training step; this can take a while)")

    def iteration(self, metrics: dict[str, float], env_steps: int) -> None:
        if not self.compile_reported:
            self.compile_reported = True
            self.write(f"compiled in {time.perf_counter() - self.t_start:.1f} s")
            if not self.quiet:
                from tqdm.auto import tqdm

                self.bar = tqdm(
                    total=self.total,
                    initial=max(env_steps - self.spi, 0),
                    unit="step",
                    unit_scale=True,
                    dynamic_ncols=True,
                    smoothing=0.1,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]{postfix}",
                )
        if metrics.get("train/completed_episodes", 0) > 0:
            self.train_return = metrics.get("train/episode_return")
        if self.bar is not None:
            self.bar.update(min(env_steps, self.total) - self.bar.n)
            self._postfix()

    def evaluation(self, metrics: dict[str, float], env_steps: int) -> None:
        self.eval_return = metrics.get("eval/episode_return")
        msg = (f"[{env_steps:>{len(str(self.total))}d}/{self.total}] eval return "
               f"{self.eval_return:.3f} ± {metrics.get('eval/episode_return_std', float('nan')):.3f}"
               f"  (length {metrics.get('eval/episode_length', float('nan')):.1f})")
        if self.train_return is not None:
            msg += f"  train return {self.train_return:.3f}"
        if self.quiet:
            msg += f"  elapsed {_fmt_seconds(time.perf_counter() - self.t_start)}"
        self.write(msg)
        if self.bar is not None:
            self._postfix()

    def _postfix(self) -> None:
        parts = []
        if self.eval_return is not None:
            parts.append(f"eval {self.eval_return:.3f}")
        if self.train_return is not None:
            parts.append(f"train {self.train_return:.3f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# ----------------------------------------------------------------------------- train


def _resume_defaults(run_dir: str) -> tuple[TrainCommand, dict[str, Any]]:
    """A TrainCommand holding a run's saved settings (used as the parser's
    defaults for --resume, so only flags given explicitly change anything)."""
    try:
        saved = rd.read_run_config(run_dir)
        config = rd.train_config_from_dict(saved["config"])
        net = saved["network"]
        cmd = TrainCommand(
            env=saved["env"],
            network=net["kind"],
            hidden_size=int(net["hidden_size"]),
            env_kwargs=json.dumps(saved.get("env_kwargs", {})),
            train_env_kwargs=json.dumps(saved.get("train_env_kwargs", {})),
            config=config,
            reward_scale=float(saved.get("reward_scale", 1.0)),
            no_preset=True,  # the run's own settings are the defaults
            resume=run_dir,
        )
    except FileNotFoundError as e:
        raise CliError(str(e)) from None
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise CliError(f"cannot read {Path(run_dir) / rd.CONFIG_FILE}: {e}") from None
    return cmd, saved


def _run_train(cmd: TrainCommand, argv: list[str], saved: dict[str, Any] | None) -> int:
    import numpy as np

    from nnx_ppo.algorithms.ppo import NonFiniteError, new_training_state, train_ppo

    resuming = cmd.resume is not None
    env_kwargs = _parse_env_kwargs(cmd.env_kwargs, cmd.env)
    train_env_kwargs = _parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs")
    if resuming:
        assert saved is not None
        for what, now, before in (
            ("env", cmd.env, saved["env"]),
            ("--network", cmd.network, saved["network"]["kind"]),
            ("--hidden-size", cmd.hidden_size, saved["network"]["hidden_size"]),
            ("--env-kwargs", env_kwargs, saved.get("env_kwargs", {})),
            ("--ppo.n-envs", cmd.config.ppo.n_envs, saved["config"]["ppo"]["n_envs"]),
            ("--reward-scale", cmd.reward_scale, float(saved.get("reward_scale", 1.0))),
            ("--train-env-kwargs", train_env_kwargs, saved.get("train_env_kwargs", {})),
        ):
            if now != before:
                raise CliError(f"cannot change {what} when resuming ({before!r} in the run, {now!r} given)")
        if cmd.run_dir is not None and Path(cmd.run_dir).resolve() != Path(cmd.resume).resolve():
            raise CliError("give either --run-dir or --resume, not both")
        run_dir = Path(cmd.resume)
        ckpt_dir = run_dir / rd.CHECKPOINT_DIR
        if not _has_checkpoint(ckpt_dir):
            raise CliError(f"{run_dir} has no checkpoints to resume from")
    else:
        run_dir = Path(cmd.run_dir) if cmd.run_dir else rd.default_run_dir(cmd.env)
        if (run_dir / rd.CONFIG_FILE).exists():
            raise CliError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or pick another --run-dir")

    env = _make_env(cmd.env, env_kwargs)
    # Training envs start their time-limit counters at random steps so the
    # vmapped episodes de-synchronise (evaluation keeps full-length episodes).
    train_env = _make_env(cmd.env, {"random_initial_steps": True, **env_kwargs, **train_env_kwargs})
    if not cmd.reward_scale > 0:
        raise CliError(f"--reward-scale must be positive, got {cmd.reward_scale}")
    if cmd.reward_scale != 1.0:
        from nnx_ppo.envs.wrappers import RewardScale

        train_env = RewardScale(train_env, cmd.reward_scale)
    net_kwargs = _network_kwargs(cmd.network, cmd.hidden_size)
    config = cmd.config
    try:
        network = _build_network(env, cmd.network, net_kwargs, config.seed)
    except ValueError as e:
        raise CliError(f"cannot build a {cmd.network} network for {cmd.env}: {e}") from None

    wandb_mod = None
    if cmd.wandb:
        try:
            import wandb as wandb_mod  # noqa: F401
        except ImportError:
            raise CliError("--wandb needs Weights & Biases: pip install wandb  (or pip install 'nnx_ppo[wandb]')") from None

    run_dir.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now().isoformat(timespec="seconds")
    network_info = {"kind": cmd.network, "hidden_size": cmd.hidden_size, "kwargs": net_kwargs, "seed": config.seed}
    content = {
        "env": cmd.env,
        "env_kwargs": env_kwargs,
        "train_env_kwargs": train_env_kwargs,
        "network": network_info,
        "config": rd.train_config_to_dict(config),
        "reward_scale": cmd.reward_scale,
        "created": saved.get("created", now) if saved else now,
        "command": [PROG, *argv],
    }
    preset = None if cmd.no_preset else find_preset(cmd.env, cmd.network)
    if preset is not None:
        content["preset"] = {"env": preset.env, "network": preset.network}
    if saved:
        content["resumed"] = [*saved.get("resumed", []), now]
        if "preset" in saved:
            content["preset"] = saved["preset"]
        if "wandb_id" in saved:
            content["wandb_id"] = saved["wandb_id"]
    wandb_run = None
    if wandb_mod is not None:
        content.setdefault("wandb_id", wandb_mod.util.generate_id())
        wandb_run = wandb_mod.init(project=cmd.wandb_project, name=run_dir.name, id=content["wandb_id"],
                                   dir=str(run_dir), config=content, resume="allow")
    rd.write_run_config(run_dir, content)

    ppo = config.ppo
    total = ppo.n_iterations * ppo.steps_per_iteration
    print(f"run directory: {_pretty_path(run_dir)}", flush=True)
    print(f"{'resuming' if resuming else 'training'} {cmd.network} (hidden {cmd.hidden_size}) on {cmd.env}"
          f"{' ' + json.dumps(env_kwargs) if env_kwargs else ''}: {total:,} env steps, "
          f"{ppo.n_envs} envs x {ppo.rollout_length} steps per iteration", flush=True)
    if preset is not None and not resuming:
        print(f"starting from the tuned preset for {preset.env} ({preset.network}); flags given override it, "
              "--no-preset starts from the library defaults", flush=True)

    logger = rd.RunLogger(run_dir, steps_per_iteration=ppo.steps_per_iteration,
                          title=f"{cmd.network} on {cmd.env}", wandb_run=wandb_run, resumed=resuming)
    progress = _Progress(total, ppo.steps_per_iteration, cmd.quiet)

    def log_fn(metrics: dict[str, float], env_steps: int) -> None:
        logger(metrics, env_steps)
        if rd.RunLogger.is_eval(metrics):
            progress.evaluation(metrics, env_steps)
        else:
            progress.iteration(metrics, env_steps)

    metadata = {"network": {"env": cmd.env, "env_kwargs": env_kwargs, "kind": cmd.network,
                            "kwargs": net_kwargs, "seed": config.seed},
                "run_dir": str(run_dir.resolve())}
    ckpt_dir = str((run_dir / rd.CHECKPOINT_DIR).resolve())
    t0 = time.perf_counter()
    code = 0
    result = None
    stop = _StopFlag(progress.write)
    try:
        with stop:
            state = new_training_state(train_env, network, config)
            progress.start()
            result = train_ppo(
                train_env, network, config, eval_env=env, log_fn=log_fn, state=state, checkpoint_dir=ckpt_dir,
                resume_from=ckpt_dir if resuming else None, checkpoint_metadata=metadata, should_stop=stop,
            )
    except KeyboardInterrupt:
        progress.close()
        _err("aborted; metrics so far are kept, and the last saved checkpoint (if any) is in "
             f"{_pretty_path(run_dir / rd.CHECKPOINT_DIR)}")
        code = 130
    except NonFiniteError as e:
        progress.close()
        _err(str(e))
        code = 1
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # env checks, checkpoints, shapes
        progress.close()
        _err(f"{type(e).__name__}: {e}")
        code = 1
    finally:
        progress.close()
        logger.close()

    elapsed = time.perf_counter() - t0
    if result is not None:
        if stop.requested:
            print(f"stopped early at {result.total_steps:,} env steps; continue with: "
                  f"{PROG} train --resume {_pretty_path(run_dir)}")
        line = f"trained {result.total_steps:,} env steps in {_fmt_seconds(elapsed)} " \
               f"(compile {result.compile_seconds:.1f} s)"
        if result.eval_history:
            steps, last = result.eval_history[-1]
            line += f"; final eval return {last['eval/episode_return']:.3f} ± {last.get('eval/episode_return_std', np.nan):.3f}"
        elif result.metrics:
            line += f"; last train return {result.metrics.get('train/episode_return', np.nan):.3f}"
        print(line)
        print(f"evaluate with: {PROG} eval {_pretty_path(run_dir)}")
    print(f"run directory: {_pretty_path(run_dir)}", flush=True)
    return code


# ----------------------------------------------------------------------------- eval


def _run_eval(cmd: EvalCommand) -> int:
    from nnx_ppo.algorithms import checkpointing
    from nnx_ppo.algorithms.ppo import evaluate

    run_dir = Path(cmd.run_dir)
    if cmd.episodes <= 0:
        raise CliError(f"--episodes must be positive, got {cmd.episodes}")
    try:
        saved = rd.read_run_config(run_dir)
    except FileNotFoundError as e:
        raise CliError(str(e)) from None
    ckpt_dir = run_dir / rd.CHECKPOINT_DIR
    if not _has_checkpoint(ckpt_dir):
        raise CliError(f"{run_dir} has no checkpoints (was training stopped before the first one?)")
    env = _make_env(saved["env"], saved.get("env_kwargs", {}))
    net_info = saved["network"]
    template = _build_network(env, net_info["kind"], net_info["kwargs"], int(net_info.get("seed", 0)))
    network = checkpointing.load_network(str(ckpt_dir.resolve()), template)

    max_len = cmd.max_episode_length or int(saved.get("config", {}).get("eval", {}).get("max_episode_length", 1000))
    if cmd.video is not None:
        _check_video_target(cmd.video, env, saved["env"])
    metrics = evaluate(env, network, n_envs=cmd.episodes, max_episode_length=max_len, seed=cmd.seed,
                       deterministic=not cmd.stochastic)
    kind = "stochastic" if cmd.stochastic else "deterministic"
    print(f"{saved['env']}: {cmd.episodes} {kind} episodes (max {max_len} steps) with the final policy of "
          f"{_pretty_path(run_dir)}")
    print(f"  return  mean {metrics['eval/episode_return']:.4f}  std {metrics['eval/episode_return_std']:.4f}  "
          f"min {metrics['eval/episode_return_min']:.4f}  max {metrics['eval/episode_return_max']:.4f}")
    print(f"  length  mean {metrics['eval/episode_length']:.1f}")
    if cmd.video is not None:
        n_frames = _record_video(env, network, cmd.video, max_len, cmd.seed, cmd.stochastic, cmd.fps)
        print(f"video: {cmd.video} ({n_frames} frames)")
    return 0


def _can_render(env) -> bool:
    from nnx_ppo.envs.types import RLEnv

    base = getattr(env, "unwrapped", env)
    return type(base).render is not RLEnv.render


def _check_video_target(path: str, env, spec: str) -> None:
    suffix = Path(path).suffix.lower()
    if suffix not in (".mp4", ".gif"):
        raise CliError(f"--video must end in .mp4 or .gif, got {path!r}")
    if not _can_render(env):
        raise CliError(f"environment {spec!r} cannot render, so no video can be recorded "
                       "(only MuJoCo Playground envs, 'playground:...', can render)")


def _record_video(env, network, path: str, max_len: int, seed: int, stochastic: bool, fps: float | None) -> int:
    """One episode, batch of 1, rendered with ``env.render``."""
    import jax
    import numpy as np

    from nnx_ppo.algorithms.ppo import split_in_mode
    from nnx_ppo.algorithms.rollout import apply_network

    graphdef, params, rest = split_in_mode(network, deterministic=not stochastic)
    carry = network.initialize_state(1)
    env_state = jax.jit(lambda k: jax.vmap(env.reset)(k[None]))(jax.random.key(seed))

    @jax.jit
    def step(rest, env_state, carry):
        out, rest = apply_network(graphdef, params, rest, carry, env_state.obs)
        return rest, jax.vmap(env.step)(env_state, out.output.actions), out.next_state

    unbatch = lambda s: jax.tree.map(lambda x: x[0], s)
    states = [unbatch(env_state)]
    for _ in range(max_len):
        rest, env_state, carry = step(rest, env_state, carry)
        states.append(unbatch(env_state))
        if float(env_state.done[0]) > 0:
            break
    try:
        frames = env.render(states)
    except NotImplementedError as e:
        raise CliError(str(e)) from None
    except RuntimeError as e:
        raise CliError(str(e).splitlines()[0], code=1) from None
    frames = [np.asarray(f) for f in frames]
    if fps is None:
        dt = getattr(env, "dt", None)
        try:
            fps = 1.0 / float(dt) if dt else 30.0
        except (TypeError, ValueError):
            fps = 30.0
    import imageio

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.lower().endswith(".gif"):
            imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
        else:
            imageio.mimsave(path, frames, fps=fps)
    except (ImportError, ValueError, RuntimeError) as e:
        raise CliError(f"could not write {path}: {e} (MP4 needs `pip install imageio-ffmpeg`; "
                       "or write a .gif)", code=1) from None
    return len(frames)


# ----------------------------------------------------------------------------- envs


def _run_envs() -> int:
    from nnx_ppo.envs import list_envs

    from nnx_ppo.presets import PRESETS

    print("built-in tasks and example specs (any gymnax:NAME, playground:NAME, brax:NAME works):")
    for spec in list_envs():
        print(f"  {spec}")
    print("\ntuned presets (`nnx-ppo train ENV [--network KIND]` starts from them; nnx_ppo.presets in Python):")
    for p in PRESETS:
        ppo = p.config.ppo
        print(f"  {p.env:<28} {p.network:<5} {ppo.total_steps:>9,} steps  target {p.target:g}  {p.description}")
    return 0


# ----------------------------------------------------------------------------- main


def _find_resume(argv: list[str]) -> str | None:
    """The value of ``--resume`` in a ``train`` command line, if any."""
    if not argv or argv[0] != "train":
        return None
    for i, a in enumerate(argv[1:], start=1):
        if a == "--resume" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--resume="):
            return a.split("=", 1)[1]
    return None


def _preset_defaults(preset) -> TrainCommand:
    """A TrainCommand holding a preset's settings (the parser's defaults for
    an env with a preset, so that flags given explicitly override them)."""
    return TrainCommand(
        env=preset.env,
        network=preset.network,
        hidden_size=preset.hidden_size,
        env_kwargs=json.dumps(preset.env_kwargs) if preset.env_kwargs else None,
        train_env_kwargs=json.dumps(preset.train_env_kwargs) if preset.train_env_kwargs else None,
        config=preset.config,
        reward_scale=preset.reward_scale,
    )


def _tyro_parse(argv: list[str], train_default: TrainCommand):
    commands = Union[
        Annotated[TrainCommand, tyro.conf.subcommand("train", default=train_default, prefix_name=False)],
        Annotated[EvalCommand, tyro.conf.subcommand("eval", prefix_name=False)],
        Annotated[EnvsCommand, tyro.conf.subcommand("envs", prefix_name=False)],
    ]
    try:
        return tyro.cli(commands, args=argv, prog=PROG,
                        description="PPO for stateful (recurrent) networks in JAX + Flax NNX.")
    except ValueError as e:  # a config's __post_init__ rejected a value
        raise CliError(str(e)) from None


def _parse(argv: list[str]):
    """Parse the command line. ``train --resume`` takes its defaults from the
    run; ``train ENV`` from ENV's preset (of ``--network``, when given)."""
    saved = None
    resume = _find_resume(argv)
    helping = any(a in ("-h", "--help") for a in argv)
    if resume is not None and not helping:
        train_default, saved = _resume_defaults(resume)
        return _tyro_parse(argv, train_default), saved
    cmd = _tyro_parse(argv, TrainCommand())
    if isinstance(cmd, TrainCommand) and not cmd.no_preset:
        network_given = any(a == "--network" or a.startswith("--network=") for a in argv)
        preset = find_preset(cmd.env, cmd.network if network_given else None)
        if preset is not None:
            cmd = _tyro_parse(argv, _preset_defaults(preset))
    return cmd, saved


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nnx-ppo`` console script. Returns the exit code
    (0 ok, 1 failure, 2 bad usage, 130 aborted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cmd, saved = _parse(argv)
        if isinstance(cmd, TrainCommand):
            return _run_train(cmd, argv, saved)
        if isinstance(cmd, EvalCommand):
            return _run_eval(cmd)
        return _run_envs()
    except CliError as e:
        _err(str(e))
        return e.code


if __name__ == "__main__":
    sys.exit(main())
