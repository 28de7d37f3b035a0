"""Reference clips for ``rodent_imitation``, generated from the body itself.

There is no motion capture here. Each clip is the rodent (the edited body of
:mod:`~nnx_ppo.envs.rodent.body`) simulated with plain ``mujoco`` on the CPU
under a scripted, smooth actuator signal: it settles in its resting crouch,
then a trot-like rhythm on the limbs (diagonal pairs in phase, random
frequency and amplitude) plus slow random drift on every actuator. The state
is recorded at ``fps`` frames per second. A clip is rejected (and redrawn)
when the torso drops below 2.5 cm, tilts more than ~37 degrees, or any
velocity is non-finite or above 50 (an explosion), and when its root moves
slower than ``min_speed`` (start-to-end horizontal distance over the clip's
duration): clips that go somewhere, so that holding still does not track
them. Every clip is physically consistent with the body (it came out of the
same model), so a tracker can reproduce it exactly.

Clips are cached as ``.npz`` under ``~/.cache/nnx_ppo/rodent_clips`` keyed
by a hash of the body version, the generator version, the arguments and the
MuJoCo version. Generating the default 8 clips of 150 frames (about 110
candidates) takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile

import mujoco
import numpy as np

from nnx_ppo.envs.rodent import body as _body

__all__ = []

# bumped whenever generate_clips changes what it produces
CLIP_VERSION = 2

_MIN_HEIGHT = 0.025  # m: torso height below this is a fall
_MIN_UPRIGHT = 0.8  # torso z-axis . world z below this is tipping over
_MAX_QVEL = 50.0

# diagonal gait groups: (actuator name, phase offset in cycles, sign)
_GAIT = (("hip_L_extend", 0.0, 1), ("knee_L", 0.0, -1), ("ankle_L", 0.0, 1),
         ("hip_R_extend", 0.5, 1), ("knee_R", 0.5, -1), ("ankle_R", 0.5, 1),
         ("shoulder_L", 0.5, 1), ("elbow_L", 0.5, 1), ("wrist_L", 0.5, -1),
         ("shoulder_R", 0.0, 1), ("elbow_R", 0.0, 1), ("wrist_R", 0.0, -1))


@dataclasses.dataclass(frozen=True)
class Clips:
    """A set of equal-length reference clips (numpy arrays).

    Attributes:
      qpos: ``[n_clips, n_frames, nq]`` (free joint first: position, quaternion, then hinges).
      qvel: ``[n_clips, n_frames, nv]``.
      act: ``[n_clips, n_frames, na]`` actuator activations.
      body_pos: ``[n_clips, n_frames, len(TRACKED_BODIES), 3]`` world positions of the tracked bodies.
      fps: frames per second.
    """

    qpos: np.ndarray
    qvel: np.ndarray
    act: np.ndarray
    body_pos: np.ndarray
    fps: float

    @property
    def n_clips(self) -> int:
        return int(self.qpos.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.qpos.shape[1])


def _signal(rng: np.random.Generator, model: mujoco.MjModel, gait_ids: np.ndarray):
    """A function ``t -> ctrl [nu]``: rest posture + a gait rhythm + slow drift."""
    freq = rng.uniform(1.5, 3.5)
    amp = rng.uniform(0.15, 0.45)
    phase = np.array([p for _, p, _ in _GAIT])
    sign = np.array([s for _, _, s in _GAIT], float)
    n_drift = 3
    drift_f = rng.uniform(0.1, 0.8, (n_drift, model.nu))
    drift_p = rng.uniform(0, 2 * np.pi, (n_drift, model.nu))
    drift_a = rng.uniform(0.0, 0.08, (n_drift, model.nu))

    def ctrl(t: float) -> np.ndarray:
        u = (drift_a * np.sin(2 * np.pi * drift_f * t + drift_p)).sum(0)
        ramp = min(1.0, t / 0.3)
        u[gait_ids] += ramp * amp * sign * np.sin(2 * np.pi * (freq * t + phase))
        return np.clip(u, -1.0, 1.0)

    return ctrl


def _simulate(model: mujoco.MjModel, rng: np.random.Generator, n_frames: int, fps: float, settle: float,
              sites: np.ndarray, gait_ids: np.ndarray):
    """One candidate clip: ``(qpos [T, nq], qvel [T, nv], act [T, na], body_pos [T, K, 3])``, or None if rejected."""
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    for _ in range(int(round(settle / model.opt.timestep))):
        mujoco.mj_step(model, data)
    data.time = 0.0
    per_frame = max(1, int(round(1.0 / (fps * model.opt.timestep))))
    ctrl = _signal(rng, model, gait_ids)
    qpos, qvel, act, pos = [], [], [], []
    for _ in range(n_frames):
        mujoco.mj_kinematics(model, data)  # positions of this qpos (mj_step leaves the previous ones)
        qpos.append(data.qpos.copy())
        qvel.append(data.qvel.copy())
        act.append(data.act.copy())
        pos.append(data.site_xpos[sites].copy())
        if not _plausible(data):
            return None
        data.ctrl[:] = ctrl(data.time)
        for _ in range(per_frame):
            mujoco.mj_step(model, data)
    return np.stack(qpos), np.stack(qvel), np.stack(act), np.stack(pos)


def _speed(qpos: np.ndarray, fps: float) -> float:
    """The root's mean horizontal speed (m/s) over a clip's ``qpos [T, nq]``: start-to-end distance / duration."""
    return float(np.linalg.norm(qpos[-1, :2] - qpos[0, :2]) * fps / max(1, len(qpos) - 1))


def _plausible(data: mujoco.MjData) -> bool:
    """The body is up (torso high enough and upright) and nothing exploded."""
    finite = np.all(np.isfinite(data.qvel)) and np.all(np.isfinite(data.qpos))
    upright = data.xmat[1][8]
    return bool(finite and np.abs(data.qvel).max() < _MAX_QVEL and data.qpos[2] > _MIN_HEIGHT
                and upright > _MIN_UPRIGHT)


def generate_clips(n_clips: int = 8, n_frames: int = 150, fps: float = 50.0, seed: int = 0,
                   settle: float = 0.3, max_tries: int = 1000, min_speed: float = 0.05) -> Clips:
    """Simulate ``n_clips`` plausible clips of ``n_frames`` frames (plain mujoco, CPU).

    Each clip starts at the origin in the settled rest pose; ``seed`` fixes
    the signals. ``min_speed`` (m/s) rejects clips whose root moves slower
    (0: keep every plausible clip); at the default, about 1 candidate in 14
    is kept. Raises ``RuntimeError`` if fewer than ``n_clips`` of
    ``max_tries`` candidates were kept.
    """
    model = _body.load_model()
    sites = _body.body_site_ids(model)
    gait_ids = np.array([mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, n) for n, _, _ in _GAIT])
    rng = np.random.default_rng(seed)
    clips = []
    for _ in range(max_tries):
        clip = _simulate(model, rng, n_frames, fps, settle, sites, gait_ids)
        if clip is not None and _speed(clip[0], fps) >= min_speed:
            clips.append(clip)
        if len(clips) == n_clips:
            qpos, qvel, act, pos = (np.stack(x).astype(np.float32) for x in zip(*clips))
            return Clips(qpos, qvel, act, pos, float(fps))
    raise RuntimeError(f"only {len(clips)} of {max_tries} generated rodent clips were plausible and moved at "
                       f"min_speed={min_speed} m/s or faster (asked for {n_clips}); lower min_speed or n_clips")


def clip_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/nnx_ppo/rodent_clips`` (default ``~/.cache/nnx_ppo/rodent_clips``)."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base, "nnx_ppo", "rodent_clips")


def _cache_key(**kwargs) -> str:
    record = {"body": _body.BODY_VERSION, "clips": CLIP_VERSION, "mujoco": mujoco.__version__, **kwargs}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def load_clips(n_clips: int = 8, n_frames: int = 150, fps: float = 50.0, seed: int = 0,
               cache_dir: str | os.PathLike | None = None, min_speed: float = 0.05) -> Clips:
    """The clips of :func:`generate_clips` with these arguments, from the
    cache when there, else generated and cached (written atomically)."""
    folder = pathlib.Path(cache_dir) if cache_dir is not None else clip_cache_dir()
    key = _cache_key(n_clips=n_clips, n_frames=n_frames, fps=fps, seed=seed, min_speed=min_speed)
    path = folder / f"clips-{key}.npz"
    if path.is_file():
        with np.load(path) as f:
            return Clips(f["qpos"], f["qvel"], f["act"], f["body_pos"], float(f["fps"]))
    clips = generate_clips(n_clips, n_frames, fps, seed, min_speed=min_speed)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npz")
    with os.fdopen(fd, "wb") as f:
        np.savez(f, qpos=clips.qpos, qvel=clips.qvel, act=clips.act, body_pos=clips.body_pos, fps=clips.fps)
    os.replace(tmp, path)
    return clips
