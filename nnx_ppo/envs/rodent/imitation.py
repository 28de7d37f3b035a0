"""``rodent_imitation``: track a reference clip with the rodent body.

The structure follows vnl-playground's rodent ``Imitation`` task:

* **Observation** ``{"proprioception": {...}, "imitation_target": {...}}``:
  the body's own senses (:meth:`RodentBase._proprioception`) and the next
  ``reference_length`` reference frames relative to the current state, in
  the torso frame: ``root [W, 3]`` (reference root position minus the
  root's), ``quat [W, 4]`` (the rotation from the torso to the reference
  root), ``joint [W, n_joints]`` (reference minus current joint angles),
  ``body [W, n_bodies, 3]`` (reference minus current tracked body positions).
* **Reward**: the sum of exp-Gaussian tracking terms
  ``weight * exp(-(distance / scale)^2 / 2)`` (root position, root
  orientation, joint angles, joint velocities, tracked bodies, end
  effectors) minus control costs (``|a|^2`` and ``|a - a_prev|^2``); each
  term is in ``metrics``.
* **Termination** when the root is more than ``max_root_distance`` from the
  reference root, turned more than ``max_root_degrees`` away from it, or the
  joint-angle error exceeds ``max_pose_error``.
* **Truncation** when the reference window reaches the clip's end:
  ``done = 1`` with ``info["truncated"] = 1`` (the adapter passes it on, so
  PPO bootstraps there).
* **Reset** draws a clip and a start frame in ``[0, max_start_frame]`` and
  puts the body in that frame's pose (reference velocities and activations).

One env step is one clip frame (``ctrl_dt = 1 / fps``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_dict
from mujoco_playground._src import mjx_env

from nnx_ppo.envs.rodent import body as _body
from nnx_ppo.envs.rodent import clips as _clips
from nnx_ppo.envs.rodent.base import Pose, RodentBase, base_config, finite, quat_conj, quat_mul, quat_rotate_inv

__all__ = ["RodentImitation", "default_config"]


def default_config() -> config_dict.ConfigDict:
    """Physics (:func:`base_config`), clips, reward terms and termination thresholds."""
    cfg = base_config(
        n_clips=8, clip_frames=150, clip_seed=0, clip_min_speed=0.05, reference_length=5, max_start_frame=50,
        reward_terms=config_dict.create(
            root_pos=config_dict.create(weight=1.0, scale=0.035),       # m
            root_quat=config_dict.create(weight=1.0, scale=20.0),       # degrees
            joints=config_dict.create(weight=1.0, scale=1.4),           # rad, L2 over joints
            joints_vel=config_dict.create(weight=1.0, scale=8.0),       # rad/s, L2 over joints
            bodies_pos=config_dict.create(weight=1.0, scale=0.05),      # m, L2 over tracked bodies
            end_eff=config_dict.create(weight=1.0, scale=0.032),        # m, L2 over end effectors
        ),
        control_cost=0.02, control_diff_cost=0.02,
        max_root_distance=0.1, max_root_degrees=60.0, max_pose_error=4.5,
    )
    return cfg


def _gauss(distance: jax.Array, weight: float, scale: float) -> jax.Array:
    return weight * jnp.exp(-0.5 * jnp.square(distance / scale))


def _angle_between(q1: jax.Array, q2: jax.Array) -> jax.Array:
    """The rotation angle (radians) between unit quaternions ``q1`` and ``q2``."""
    cos_half = jnp.clip(jnp.abs(jnp.dot(q1, q2)), 0.0, 1.0)
    return 2.0 * jnp.arccos(cos_half)


class RodentImitation(RodentBase):
    """Track reference clips generated from the body (module docstring)."""

    def __init__(self, config: config_dict.ConfigDict | None = None, config_overrides: dict | None = None,
                 clips: _clips.Clips | None = None):
        super().__init__(default_config() if config is None else config, config_overrides)
        cfg = self._config
        if clips is None:
            clips = _clips.load_clips(int(cfg.n_clips), int(cfg.clip_frames), 1.0 / float(cfg.ctrl_dt),
                                      int(cfg.clip_seed), min_speed=float(cfg.clip_min_speed))
        self._window = int(cfg.reference_length)
        self._last_frame = clips.n_frames - 1 - self._window  # the last frame with a full window ahead
        if self._last_frame < 1:
            raise ValueError(f"clips of {clips.n_frames} frames are too short for a reference window of "
                             f"{self._window}")
        self._max_start = int(min(int(cfg.max_start_frame), self._last_frame - 1))
        self._clips = jax.tree_util.tree_map(jnp.asarray, Pose(clips.qpos, clips.qvel, clips.act, clips.body_pos))
        self._n_clips = clips.n_clips
        self._ee = np.array([_body.TRACKED_BODIES.index(n) for n in _body.END_EFFECTORS])

    # ------------------------------------------------------------------ reference

    def _frame(self, clip: jax.Array, frame: jax.Array) -> Pose:
        """The reference pose at ``frame`` of ``clip`` (scalars)."""
        return jax.tree_util.tree_map(lambda x: x[clip, frame], self._clips)

    def _window_after(self, clip: jax.Array, frame: jax.Array) -> Pose:
        """The reference poses of frames ``frame + 1 .. frame + W`` (leaves ``[W, ...]``)."""
        return jax.tree_util.tree_map(
            lambda x: jax.lax.dynamic_slice_in_dim(x[clip], frame + 1, self._window, axis=0), self._clips)

    def _target(self, pose: Pose, ref: Pose) -> dict[str, jax.Array]:
        """The reference window ``ref`` (leaves ``[W, ...]``) relative to ``pose``, in the torso frame."""
        q = pose.root_quat
        to_local = jax.vmap(lambda v: quat_rotate_inv(q, v))
        return {
            "root": to_local(ref.qpos[:, :3] - pose.root_pos[None]),
            "quat": jax.vmap(lambda r: quat_mul(quat_conj(q), r))(ref.qpos[:, 3:7]),
            "joint": ref.qpos[:, 7:] - pose.joints[None],
            "body": jax.vmap(to_local)(ref.body_pos - pose.body_pos[None]),
        }

    def _obs(self, pose: Pose, clip: jax.Array, frame: jax.Array) -> dict[str, Any]:
        return {"proprioception": self._proprioception(pose),
                "imitation_target": self._target(pose, self._window_after(clip, frame))}

    # ------------------------------------------------------------------ reward and termination

    def _tracking(self, pose: Pose, ref: Pose) -> dict[str, jax.Array]:
        """The exp-Gaussian tracking terms (scalars)."""
        terms = self._config.reward_terms
        g = lambda name, d: _gauss(d, float(terms[name].weight), float(terms[name].scale))  # noqa: E731
        body_err = pose.body_pos - ref.body_pos
        return {
            "root_pos": g("root_pos", jnp.linalg.norm(pose.root_pos - ref.root_pos)),
            "root_quat": g("root_quat", jnp.rad2deg(_angle_between(pose.root_quat, ref.root_quat))),
            "joints": g("joints", jnp.linalg.norm(pose.joints - ref.joints)),
            "joints_vel": g("joints_vel", jnp.linalg.norm(pose.qvel[6:] - ref.qvel[6:])),
            "bodies_pos": g("bodies_pos", jnp.sqrt(jnp.sum(jnp.square(body_err)))),
            "end_eff": g("end_eff", jnp.sqrt(jnp.sum(jnp.square(body_err[self._ee])))),
        }

    def _costs(self, action: jax.Array, prev_action: jax.Array) -> dict[str, jax.Array]:
        cfg = self._config
        return {"control_cost": float(cfg.control_cost) * jnp.sum(jnp.square(action)),
                "control_diff_cost": float(cfg.control_diff_cost) * jnp.sum(jnp.square(action - prev_action))}

    def _terminated(self, pose: Pose, ref: Pose) -> jax.Array:
        """Whether the body strayed too far from the reference (bool scalar)."""
        cfg = self._config
        too_far = jnp.linalg.norm(pose.root_pos - ref.root_pos) > float(cfg.max_root_distance)
        too_rotated = _angle_between(pose.root_quat, ref.root_quat) > np.deg2rad(float(cfg.max_root_degrees))
        bad_pose = jnp.linalg.norm(pose.joints - ref.joints) > float(cfg.max_pose_error)
        unstable = jnp.logical_not(self._finite_state(pose))
        return too_far | too_rotated | bad_pose | unstable

    def _episode_end(self, terminated: jax.Array, frame: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(done, truncated)`` float32 scalars: truncated when ``frame`` is the
        last with a full reference window ahead and the body did not fail there."""
        truncated = jnp.logical_and(frame >= self._last_frame, jnp.logical_not(terminated))
        return jnp.logical_or(terminated, truncated).astype(jnp.float32), truncated.astype(jnp.float32)

    def _reward(self, pose: Pose, ref: Pose, action, prev_action) -> tuple[jax.Array, dict[str, jax.Array]]:
        terms, costs = self._tracking(pose, ref), self._costs(action, prev_action)
        reward = sum(terms.values()) - sum(costs.values())
        metrics = {f"reward/{k}": v for k, v in terms.items()} | {f"cost/{k}": v for k, v in costs.items()}
        return reward, metrics

    # ------------------------------------------------------------------ the env API

    def reset(self, rng: jax.Array) -> mjx_env.State:
        """A random clip at a random start frame; the body in that frame's pose."""
        clip_key, frame_key = jax.random.split(rng)
        clip = jax.random.randint(clip_key, (), 0, self._n_clips)
        frame = jax.random.randint(frame_key, (), 0, self._max_start + 1)
        pose = self._frame(clip, frame)
        zeros = jnp.zeros(self.action_size)
        _, metrics = self._reward(pose, pose, zeros, zeros)
        info = {"clip": clip, "frame": frame, "action": zeros, "truncated": jnp.zeros(()),
                "start_frame": frame}
        metrics = jax.tree_util.tree_map(jnp.zeros_like, metrics)
        return mjx_env.State(self._data_at(pose), self._obs(pose, clip, frame), jnp.zeros(()), jnp.zeros(()),
                             metrics, info)

    def step(self, state: mjx_env.State, action: jax.Array) -> mjx_env.State:
        """One frame: physics, then tracking reward, termination and truncation against the next frame."""
        data, pose = self._physics_step(state.data, action)
        clip, frame = state.info["clip"], state.info["frame"] + 1
        ref = self._frame(clip, frame)
        reward, metrics = self._reward(pose, ref, action, state.info["action"])
        done, truncated = self._episode_end(self._terminated(pose, ref), frame)
        info = {**state.info, "frame": frame, "action": action, "truncated": truncated}
        obs, reward, metrics = finite((self._obs(pose, clip, frame), reward, metrics))
        return state.replace(data=data, obs=obs, reward=reward, done=done, metrics=metrics, info=info)
