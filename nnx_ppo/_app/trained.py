"""The commands on a trained run: ``nnx-ppo eval`` (evaluate its policy,
record a video or the activations of chosen modules, see
:mod:`nnx_ppo.algorithms.evaluation`) and ``nnx-ppo export`` (its policy as a
:mod:`jax.export` artifact, see :mod:`nnx_ppo.policy`).

A run of several seeds (or a sweep's members) is evaluated seed by seed;
the line of a seed that failed in training ends with its failure (``FAILED
at iteration I (env steps S): reason``, from the failure rows of
``metrics.jsonl``), and a sweep member's label names the member whose state
population-based training copied over it after its failure (``revived from
member K at iteration I``)."""

from __future__ import annotations

import errno
from pathlib import Path

from nnx_ppo import runner as rd
from nnx_ppo._app.commands import CliError, EvalCommand, ExportCommand, check_writable_target
from nnx_ppo._app.runs import checkpoint_choice, load_run_network, read_run, run_policy_spec, usage_errors
from nnx_ppo._app.sweep import failure_text, lineage_text, member_lineage
from nnx_ppo.runner import pretty_path

# ----------------------------------------------------------------------------- nnx-ppo eval


def _policy_name(which: int | str | None) -> str:
    """``final policy``, ``best evaluated policy`` or ``policy at step N``: what ``--best`` / ``--step`` picked."""
    return {None: "final policy", "best": "best evaluated policy"}.get(which, f"policy at step {which}")


def run_eval(cmd: EvalCommand) -> int:
    from nnx_ppo.algorithms.evaluation import evaluate
    from nnx_ppo.algorithms.functional import NetworkFn

    run_dir = Path(cmd.run_dir)
    if cmd.episodes <= 0:
        raise CliError(f"--episodes must be positive, got {cmd.episodes}")
    if cmd.max_episode_length is not None and cmd.max_episode_length <= 0:
        raise CliError(f"--max-episode-length must be positive, got {cmd.max_episode_length}")
    saved = read_run(run_dir, rebuild="evaluate it")
    which = checkpoint_choice(cmd)
    env, spec, ckpt_dir = run_policy_spec(run_dir, saved, which)
    max_len = cmd.max_episode_length or int(saved.get("config", {}).get("eval", {}).get("max_episode_length", 1000))
    if cmd.video is not None:
        check_video_target(cmd.video, env, saved["env"])
    check_record_flags(cmd)
    if cmd.list_modules:
        return print_module_paths(spec.build(env))
    if cmd.record_activations:
        check_record_paths(spec.build(env), cmd.record_activations)
    # A run of several seeds (a sweep: members) holds one policy each: each is evaluated (the video shows the first).
    training_seeds = [int(s) for s in saved.get("seeds", [])] or [None]
    members = saved.get("members")
    if cmd.member is not None:
        if members is None:
            raise CliError(f"--member: {run_dir} is not a sweep (nnx-ppo sweep); it has no members")
        if cmd.member not in training_seeds:
            raise CliError(f"--member must be one of 0 .. {len(members) - 1} (see {run_dir}/sweep.md), "
                           f"got {cmd.member}")
        training_seeds = [cmd.member]
    rows = rd.read_metrics(run_dir)
    failures, lineage = rd.failure_rows(rows), member_lineage(rows)
    loaded = {}  # training seed -> (network, step, the step it fell back from or None); loaded before any line
    for training_seed in training_seeds:
        try:
            loaded[training_seed] = _load(ckpt_dir, spec.build(env), training_seed, which)
        except CliError:
            if failures.get(training_seed) is None or which != "best":
                raise
            loaded[training_seed] = (None, None, None)
    steps = sorted({step for _, step, _ in loaded.values() if step is not None})
    per_line = which == "best" and len(steps) > 1  # the seeds' best policies were saved at different steps
    where = f", saved at step {steps[0]:,}" if len(steps) == 1 and not isinstance(which, int) else ""
    skipped = sorted({s for _, _, s in loaded.values() if s is not None})
    if skipped:
        where += f" (the newest checkpoint, step {skipped[-1]:,}, cannot be read: fell back to the newest intact one)"
    kind = "stochastic" if cmd.stochastic else "deterministic"
    print(f"{saved['env']}: {cmd.episodes} {kind} episodes (max {max_len} steps) with the {_policy_name(which)} of "
          f"{pretty_path(run_dir)}{where}")
    first = None
    for training_seed in training_seeds:
        network, step, _ = loaded[training_seed]
        failure = failures.get(training_seed)
        mark = "" if failure is None else f"  {failure_text(failure)}"
        indent = "  " if training_seed is None else f"  {_label(training_seed, members, lineage.get(training_seed))}: "
        mark = (f"  (saved at step {step:,})" if per_line and step is not None else "") + mark
        if network is None:
            print(f"{indent}no best policy (it failed before an evaluation saved one){mark}")
            continue
        first = first or network
        metrics = evaluate(env, network, n_envs=cmd.episodes, max_episode_length=max_len, seed=cmd.seed,
                           deterministic=not cmd.stochastic)
        print(f"{indent}return  mean {metrics['eval/episode_return']:.4f}  std {metrics['eval/episode_return_std']:.4f}"
              f"  min {metrics['eval/episode_return_min']:.4f}  max {metrics['eval/episode_return_max']:.4f}"
              f"  length  mean {metrics['eval/episode_length']:.1f}{mark}")
    if cmd.video is not None:  # one episode of the first policy, batch of 1
        frames = render_episode(env, NetworkFn.of(first, deterministic=not cmd.stochastic), max_len, cmd.seed)
        write_video(cmd.video, frames, video_fps(env, cmd.fps))
        print(f"video: {cmd.video} ({len(frames)} frames)")
    if cmd.record_activations:
        record_to_file(cmd, env, first, max_len)
    return 0


def _load(ckpt_dir: Path, network, training_seed: int | None, which: int | str | None):
    """``(network, the env step of the checkpoint loaded, the step of a newer
    one it fell back from, or None)``; a fallback's warning is still shown."""
    import warnings

    from nnx_ppo.algorithms.checkpointing import CheckpointFallbackWarning, find_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointFallbackWarning)
        network = load_run_network(ckpt_dir, network, seed=training_seed, step=which)
    for w in caught:  # shown as without the catch (once, for the seeds of one checkpoint)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source,
                               registry=globals().setdefault("__warningregistry__", {}))
    fallbacks = [w.message for w in caught if isinstance(w.message, CheckpointFallbackWarning)]
    if fallbacks and fallbacks[-1].loaded is not None:
        return network, _step(fallbacks[-1].loaded), _step(fallbacks[0].skipped)
    path = find_checkpoint(ckpt_dir.resolve(), which, training_seed if which == "best" else None)
    return network, _step(path), None


def _step(checkpoint: Path) -> int:
    """The env step of a checkpoint (its folder ``step_<N>``)."""
    return int(Path(checkpoint).name.removeprefix("step_"))


def _label(index: int, members: list[dict] | None, lineage: list[dict] | None = None) -> str:
    """``seed 3``, or for a sweep ``member 5 (seed 1, learning_rate 0.001)``
    (its starting values), with its revival when PBT copied a healthy state
    over it after it failed (``..., revived from member 2 at iteration 4)``;
    ``lineage``: its entry of :func:`~nnx_ppo._app.sweep.member_lineage`)."""
    if members is None:
        return f"seed {index}"
    member = members[index]
    values = [f"{k} {v:g}" for k, v in member["hyperparameters"].items()
              if len({m["hyperparameters"].get(k) for m in members}) > 1]
    revival = lineage_text(lineage or [], only_revival=True)
    parts = [f"seed {member['seed']}", *values, *([revival] if revival else [])]
    return f"member {index} ({', '.join(parts)})"

# ---------------------------------------- activations: eval --list-modules, --record-activations


def check_record_flags(cmd: EvalCommand) -> None:
    """Named errors, before anything runs, for ``--record-activations``
    without ``--out`` (or the reverse) and an ``--out`` that is not .npz or
    cannot be written."""
    if cmd.record_activations and cmd.out is None:
        raise CliError("--record-activations needs --out FILE.npz")
    if cmd.out is not None and not cmd.record_activations:
        raise CliError("--out needs --record-activations PATH [PATH ...] (see --list-modules for the paths)")
    if cmd.out is not None and not cmd.out.endswith(".npz"):
        raise CliError(f"--out must end in .npz, got {cmd.out!r}")
    if cmd.out is not None:  # before the recording, not after it
        import os

        folder = Path(cmd.out).resolve().parent
        if not folder.is_dir():
            raise CliError(f"--out: the folder {folder} does not exist")
        if not os.access(folder, os.W_OK) or Path(cmd.out).is_dir():
            raise CliError(f"--out: cannot write {cmd.out} (the folder is not writable, or it is a directory)")


def print_module_paths(network) -> int:
    """Print every recordable module path with its class; returns exit code 0."""
    from flax import nnx

    from nnx_ppo.algorithms.evaluation import module_paths

    kinds = {"/".join(str(p) for p in path): type(m).__name__ for path, m in nnx.iter_modules(network)}
    print("recordable module paths (for --record-activations):")
    for path in module_paths(network):
        print(f"  {path:<48} {kinds[path]}")
    return 0


def check_record_paths(network, paths: tuple[str, ...]) -> None:
    """A :class:`CliError` naming the first unknown path and listing the valid ones."""
    from nnx_ppo.algorithms.evaluation import module_paths

    known = module_paths(network)
    for path in paths:
        if path.strip("/") not in known:
            raise CliError(f"--record-activations: unknown module path {path!r}; recordable paths "
                           f"(see --list-modules): {', '.join(known)}")


def record_to_file(cmd: EvalCommand, env, network, n_steps: int) -> None:
    """Record ``cmd.record_activations`` of ``network`` over ``cmd.episodes``
    envs x ``n_steps`` steps (seeded like the evaluation) into ``cmd.out``."""
    from nnx_ppo.algorithms.evaluation import record_activations

    recording = record_activations(env, network, cmd.record_activations, n_envs=cmd.episodes, n_steps=n_steps,
                                   seed=cmd.seed, deterministic=not cmd.stochastic)
    recording.save(cmd.out)
    episodes = int(recording.done.sum())
    print(f"activations: {pretty_path(Path(cmd.out))} ({n_steps} steps x {cmd.episodes} envs, "
          f"{episodes} episodes ended; {len(recording.activations)} modules)")

# ---------------------------------------- videos: eval --video, train --video-every


def check_video_target(path: str, env, spec: str, flag: str = "--video") -> None:
    """Named errors, before any training or rendering, when ``path`` is not
    .mp4/.gif, the env cannot render, or the video writer does not work."""
    from nnx_ppo.envs.types import RLEnv

    suffix = Path(path).suffix.lower()
    if suffix not in (".mp4", ".gif"):
        raise CliError(f"{flag} must end in .mp4 or .gif, got {path!r}")
    if type(getattr(env, "unwrapped", env)).render is RLEnv.render:  # (the base class's: none of its own)
        raise CliError(f"environment {spec!r} cannot render, so no video can be recorded "
                       "(only MuJoCo Playground envs, 'playground:...', can render)")
    check_writable_target(path, f"{flag} {path}")
    check_video_writer(path)


def check_video_writer(path: str) -> None:
    """Write two tiny frames to a temporary file of ``path``'s kind, so that a
    missing MP4 encoder is reported before any rendering (which can take
    minutes)."""
    import tempfile

    import numpy as np

    suffix = Path(path).suffix.lower()
    with tempfile.TemporaryDirectory() as tmp:
        probe = str(Path(tmp) / f"probe{suffix}")
        write_video(probe, [np.zeros((16, 16, 3), np.uint8)] * 2, fps=10.0)


def video_fps(env, fps: float | None) -> float:
    """``fps``, else the env's control rate (``1 / env.dt``), else 30."""
    if fps is not None:
        return float(fps)
    dt = getattr(env, "dt", None)
    try:
        return 1.0 / float(dt) if dt else 30.0
    except (TypeError, ValueError):
        return 30.0


def render_episode(env, policy, max_len: int, seed: int) -> list:
    """Frames ``[H, W, 3]`` of one episode of ``policy`` (a
    :class:`~nnx_ppo.algorithms.functional.NetworkFn`), rendered with
    ``env.render``: the reset state, then one frame per step until the
    episode ends or ``max_len`` steps."""
    import jax
    import numpy as np

    from nnx_ppo.algorithms.evaluation import run_episodes

    record = jax.jit(lambda net, key: run_episodes(env, net, key, 1, max_len, record_states=True))
    episodes = jax.device_get(record(policy, jax.random.key(seed)))
    n_states = int(episodes.lengths[0]) + 1
    states = [jax.tree.map(lambda x, t=t: x[t, 0], episodes.states) for t in range(n_states)]
    try:
        frames = env.render(states)
    except NotImplementedError as e:
        raise CliError(str(e)) from None
    except RuntimeError as e:
        raise CliError(str(e).splitlines()[0], code=1) from None
    return [np.asarray(f) for f in frames]


def write_video(path: str, frames: list, fps: float) -> None:
    """Write ``frames`` to ``path`` (.mp4 through imageio-ffmpeg, or .gif)."""
    import imageio

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        if path.lower().endswith(".gif"):
            imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
        else:
            imageio.mimsave(path, frames, fps=fps)
    except (ImportError, ValueError, RuntimeError, OSError) as e:
        raise CliError(f"cannot write {path}: {e} (MP4 needs imageio-ffmpeg: pip install 'nnx_ppo[playground]' or "
                       "pip install imageio-ffmpeg; or write a .gif)", code=1) from None


# ----------------------------------------------------------------------------- nnx-ppo export


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


def run_export(cmd: ExportCommand) -> int:
    from nnx_ppo.policy import Policy, export_info

    run_dir = Path(cmd.run_dir)
    if cmd.batch_size is not None and cmd.batch_size <= 0:
        raise CliError(f"--batch-size must be positive, got {cmd.batch_size}")
    which = checkpoint_choice(cmd)
    saved = read_run(run_dir, rebuild="export it")
    env, spec, ckpt_dir = run_policy_spec(run_dir, saved, which)
    seeds = [int(s) for s in saved.get("seeds", [])]
    if cmd.seed is not None and cmd.seed not in seeds:
        raise CliError(f"--seed {cmd.seed}: this run trained " +
                       (f"seeds {seeds}" if seeds else "one seed; leave --seed out"))
    seed = cmd.seed if cmd.seed is not None else (seeds[0] if seeds else None)
    replaced = check_out_directory(cmd)  # before the network is loaded and compiled
    # (e.g. a network function that no longer returns a network)
    with usage_errors(ValueError, TypeError, prefix=f"cannot rebuild the network of {run_dir}: "):
        network = spec.build(env)
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
    # what was exported, for which batch sizes, where, and what it replaced
    any_batch = info.get("batch_size") == "any"
    batches = "any batch size" if any_batch else f"batches of {info.get('batch_size')}"
    note = (f" (--batch-size {cmd.batch_size} is initial_carry()'s default number of envs)"
            if any_batch and cmd.batch_size is not None else "")
    replacing = f"; replaced the previous export's {', '.join(replaced)}" if replaced else ""
    of_seed = f" (seed {seed})" if seed is not None else ""
    print(f"exported the {_policy_name(which)} of {pretty_path(run_dir)}{of_seed} for {batches}{note} to {out}: "
          "step.jax, initial_carry.jax, params.npz, policy.json "
          f"(load with jax.export alone; see nnx_ppo.policy.load_exported){replacing}")
    return 0
