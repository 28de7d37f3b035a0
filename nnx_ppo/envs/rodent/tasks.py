"""The rodent tasks: ``rodent_run`` (:class:`RodentRun`, run forward without
falling) and ``rodent_imitation`` (:class:`RodentImitation`, track reference
clips), and what they share (:class:`RodentBase`): the MJX model, the
physics step, proprioception.

Observations are computed from a :class:`Pose` (root position and
quaternion, joint angles, velocities, actuator activations, tracked body
positions) rather than from ``mjx.Data``'s derived fields, so that a reset
can build its first observation from a stored pose without running
``mjx.forward`` (which would add a second copy of MJX's kinematics to every
compiled training iteration).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from flax import struct
from ml_collections import config_dict
from mujoco import mjx
from mujoco_playground._src import mjx_env

from nnx_ppo.envs.rodent import body as _body
from nnx_ppo.envs.rodent import clips as _clips

__all__ = ["RodentRun", "RodentImitation"]


def finite(tree: Any) -> Any:
    """``tree`` with non-finite entries set to 0. A step whose physics
    diverged (float32 MJX, violent actions) ends its episode; this keeps its
    observation, reward and metrics finite for the learner."""
    return jax.tree_util.tree_map(lambda x: jnp.where(jnp.isfinite(x), x, jnp.zeros_like(x)), tree)


def base_config(**overrides: Any) -> config_dict.ConfigDict:
    """The physics settings both tasks share (see :mod:`~nnx_ppo.envs.rodent.body`)."""
    return config_dict.create(sim_dt=0.002, ctrl_dt=0.02, solver="cg", iterations=4, ls_iterations=4,
                              body_contacts=True, **overrides)


def quat_mul(a: jax.Array, b: jax.Array) -> jax.Array:
    """Hamilton product of ``(w, x, y, z)`` quaternions ``[4]``."""
    aw, av = a[0], a[1:]
    bw, bv = b[0], b[1:]
    return jnp.concatenate([jnp.array([aw * bw - av @ bv]), aw * bv + bw * av + jnp.cross(av, bv)])


def quat_conj(q: jax.Array) -> jax.Array:
    """The conjugate (inverse for unit quaternions) ``[4]``."""
    return q * jnp.array([1.0, -1.0, -1.0, -1.0])


def quat_rotate(q: jax.Array, v: jax.Array) -> jax.Array:
    """``v [3]`` rotated by the unit quaternion ``q [4]`` (body frame to world)."""
    w, u = q[0], q[1:]
    t = 2.0 * jnp.cross(u, v)
    return v + w * t + jnp.cross(u, t)


def quat_rotate_inv(q: jax.Array, v: jax.Array) -> jax.Array:
    """``v [3]`` rotated by the inverse of ``q [4]`` (world to body frame)."""
    return quat_rotate(quat_conj(q), v)


@struct.dataclass
class Pose:
    """The state quantities observations and rewards read (one env, no batch axis).

    Attributes:
      qpos: ``[nq]``: root position ``[0:3]``, root quaternion ``[3:7]``, joint angles ``[7:]``.
      qvel: ``[nv]``: root linear (world frame) ``[0:3]`` and angular (body frame) ``[3:6]``, joints ``[6:]``.
      act: ``[na]`` actuator activations.
      body_pos: ``[len(TRACKED_BODIES), 3]`` world positions of the tracked bodies.
    """

    qpos: jax.Array
    qvel: jax.Array
    act: jax.Array
    body_pos: jax.Array

    @property
    def root_pos(self) -> jax.Array:
        return self.qpos[:3]

    @property
    def root_quat(self) -> jax.Array:
        return self.qpos[3:7]

    @property
    def joints(self) -> jax.Array:
        return self.qpos[7:]


class RodentBase(mjx_env.MjxEnv):
    """A MuJoCo Playground env of the edited rodent (MJX, ``impl="jax"``).

    Subclasses implement ``reset`` and ``step``; this class builds the model
    (``config``: :func:`base_config`'s keys), steps the physics
    (``ctrl_dt / sim_dt`` substeps per action) and computes proprioception.
    """

    def __init__(self, config: config_dict.ConfigDict, config_overrides: dict | None = None):
        super().__init__(config, config_overrides)
        cfg = self._config
        self._ctrl_dt, self._sim_dt = float(cfg.ctrl_dt), float(cfg.sim_dt)
        self._mj_model = _body.load_model(float(cfg.sim_dt), str(cfg.solver), int(cfg.iterations),
                                          int(cfg.ls_iterations), bool(cfg.body_contacts))
        self._mjx_model = mjx.put_model(self._mj_model, impl="jax")
        self._sites = _body.body_site_ids(self._mj_model)
        self._end_effectors = jnp.array([_body.TRACKED_BODIES.index(n) for n in _body.END_EFFECTORS])

    # ------------------------------------------------------------------ MjxEnv's abstract API

    @property
    def xml_path(self) -> str:
        return str(_body.rodent_xml_path())

    @property
    def action_size(self) -> int:
        return int(self._mj_model.nu)

    @property
    def mj_model(self) -> mujoco.MjModel:
        return self._mj_model

    @property
    def mjx_model(self) -> mjx.Model:
        return self._mjx_model

    def render(self, trajectory, height: int = 240, width: int = 320, camera: str | None = "side",
               **kwargs):
        """Frames of a trajectory, by default from the torso-tracking ``side`` camera."""
        return super().render(trajectory, height=height, width=width, camera=camera, **kwargs)

    # ------------------------------------------------------------------ physics

    def _data_at(self, pose: Pose) -> mjx.Data:
        """Fresh ``mjx.Data`` holding ``pose`` (derived fields are left for the next step's forward pass)."""
        data = mjx.make_data(self._mjx_model, impl="jax")
        return data.replace(qpos=pose.qpos, qvel=pose.qvel, act=pose.act)

    def _physics_step(self, data: mjx.Data, action: jax.Array) -> tuple[mjx.Data, Pose]:
        """``n_substeps`` physics steps with ``ctrl = action`` (clipped to [-1, 1]); the new data and pose."""
        data = mjx_env.step(self._mjx_model, data, jnp.clip(action, -1.0, 1.0), self.n_substeps)
        return data, Pose(qpos=data.qpos, qvel=data.qvel, act=data.act, body_pos=data.site_xpos[self._sites])

    # ------------------------------------------------------------------ observations

    def _proprioception(self, pose: Pose) -> dict[str, jax.Array]:
        """The body's own senses, in the torso frame where directional.

        Returns a dict: ``joint_angles [nq-7]``, ``joint_velocities [nv-6]``,
        ``actuator_activation [na]``, ``body_height [1]``, ``world_zaxis [3]``
        (gravity's direction in the torso frame), ``torso_velocity [3]``,
        ``torso_angular_velocity [3]``, ``appendages [len(END_EFFECTORS) * 3]``
        (hands, feet and head relative to the torso).
        """
        q = pose.root_quat
        relative = pose.body_pos[self._end_effectors] - pose.root_pos[None]
        appendages = jax.vmap(lambda v: quat_rotate_inv(q, v))(relative)
        return {
            "joint_angles": pose.joints,
            "joint_velocities": pose.qvel[6:],
            "actuator_activation": pose.act,
            "body_height": pose.qpos[2:3],
            "world_zaxis": quat_rotate_inv(q, jnp.array([0.0, 0.0, 1.0])),
            "torso_velocity": quat_rotate_inv(q, pose.qvel[:3]),
            "torso_angular_velocity": pose.qvel[3:6],
            "appendages": appendages.reshape(-1),
        }

    @staticmethod
    def _finite_state(pose: Pose) -> jax.Array:
        """Whether the physics state is finite (bool scalar; False once MJX diverged)."""
        return jnp.all(jnp.isfinite(pose.qpos)) & jnp.all(jnp.isfinite(pose.qvel))

    @staticmethod
    def _upright(pose: Pose) -> jax.Array:
        """The torso z-axis' world z component (1 upright, -1 upside down)."""
        return quat_rotate(pose.root_quat, jnp.array([0.0, 0.0, 1.0]))[2]


# ---------------------------------------------------------------------------- rodent_run


def run_config() -> config_dict.ConfigDict:
    """Physics (:func:`base_config`) and the reward and termination settings."""
    return base_config(target_speed=0.25, forward_weight=1.0, upright_weight=0.2, healthy_reward=0.2,
                       control_cost=0.01, min_height=0.025, min_upright=0.5, reset_noise=0.1,
                       settle_seconds=0.3)


class RodentRun(RodentBase):
    """``rodent_run``: run forward as fast as ``target_speed`` with the rodent
    body, without falling (no reference clips).

    * **Observation** ``{"proprioception": {...}}`` (see
      :meth:`RodentBase._proprioception`).
    * **Reward** per step: ``forward_weight * min(v, target_speed) /
      target_speed`` (``v``: the torso's velocity along its heading in the
      ground plane, m/s) ``+ upright_weight * (upright + 1) / 2`` (the torso's
      z-axis against the world's) ``+ healthy_reward`` while up, ``-
      control_cost * |a|^2``; each term is in ``metrics``.
    * **Termination** (a fall): the torso below ``min_height`` or its z-axis'
      world z component below ``min_upright``.
    * **Reset**: the rest crouch the body settles into with zero control
      (computed once with plain mujoco), joint velocities perturbed by
      ``N(0, reset_noise)``. No truncation of its own: ``make`` adds a
      ``TimeLimit`` (500 steps, 10 s).
    """

    def __init__(self, config: config_dict.ConfigDict | None = None, config_overrides: dict | None = None):
        super().__init__(run_config() if config is None else config, config_overrides)
        self._rest = self._rest_pose(float(self._config.settle_seconds))

    def _rest_pose(self, seconds: float) -> Pose:
        """The pose after ``seconds`` of zero control from the model's default pose (plain mujoco)."""
        model = self._mj_model
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        for _ in range(int(round(seconds / model.opt.timestep))):
            mujoco.mj_step(model, data)
        data.qvel[:] = 0.0
        mujoco.mj_forward(model, data)
        arrays = (data.qpos, data.qvel, data.act, data.site_xpos[self._sites])
        return Pose(*(jnp.asarray(np.asarray(a, np.float32)) for a in arrays))

    def _terms(self, pose: Pose, action: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(reward, metrics)`` for ``pose`` after ``action``."""
        cfg = self._config
        heading = quat_rotate(pose.root_quat, jnp.array([1.0, 0.0, 0.0]))[:2]
        heading = heading / (jnp.linalg.norm(heading) + 1e-6)
        speed = jnp.dot(pose.qvel[:2], heading)
        terms = {
            "forward": float(cfg.forward_weight) * jnp.minimum(speed, float(cfg.target_speed))
            / float(cfg.target_speed),
            "upright": float(cfg.upright_weight) * 0.5 * (self._upright(pose) + 1.0),
            "healthy": float(cfg.healthy_reward) * jnp.ones(()),
            "control_cost": -float(cfg.control_cost) * jnp.sum(jnp.square(action)),
        }
        metrics = {f"reward/{k}": v for k, v in terms.items()} | {"speed": speed}
        return sum(terms.values()), metrics

    def _fell(self, pose: Pose) -> jax.Array:
        cfg = self._config
        fell = (pose.qpos[2] < float(cfg.min_height)) | (self._upright(pose) < float(cfg.min_upright))
        return fell | jnp.logical_not(self._finite_state(pose))

    def reset(self, rng: jax.Array) -> mjx_env.State:
        """The rest pose with perturbed joint velocities."""
        noise = float(self._config.reset_noise) * jax.random.normal(rng, (self._mj_model.nv - 6,))
        pose = self._rest.replace(qvel=self._rest.qvel.at[6:].set(noise))
        _, metrics = self._terms(pose, jnp.zeros(self.action_size))
        metrics = jax.tree_util.tree_map(jnp.zeros_like, metrics)
        obs = {"proprioception": self._proprioception(pose)}
        return mjx_env.State(self._data_at(pose), obs, jnp.zeros(()), jnp.zeros(()), metrics,
                             {"truncated": jnp.zeros(())})

    def step(self, state: mjx_env.State, action: jax.Array) -> mjx_env.State:
        """Physics, then reward and the fall check."""
        data, pose = self._physics_step(state.data, action)
        reward, metrics = self._terms(pose, action)
        done = self._fell(pose).astype(jnp.float32)
        obs, reward, metrics = finite(({"proprioception": self._proprioception(pose)}, reward, metrics))
        return state.replace(data=data, obs=obs, reward=reward, done=done, metrics=metrics,
                             info={**state.info, "truncated": jnp.zeros(())})


# ---------------------------------------------------------------------------- rodent_imitation


def imitation_config() -> config_dict.ConfigDict:
    """Physics (:func:`base_config`), clips, reward terms and termination thresholds."""
    return base_config(
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


def _angle_between(q1: jax.Array, q2: jax.Array) -> jax.Array:
    """The rotation angle (radians) between unit quaternions ``q1`` and ``q2``."""
    cos_half = jnp.clip(jnp.abs(jnp.dot(q1, q2)), 0.0, 1.0)
    return 2.0 * jnp.arccos(cos_half)


class RodentImitation(RodentBase):
    """``rodent_imitation``: track reference clips generated from the rodent body.

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

    def __init__(self, config: config_dict.ConfigDict | None = None, config_overrides: dict | None = None,
                 clips: _clips.Clips | None = None):
        super().__init__(imitation_config() if config is None else config, config_overrides)
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
        """The exp-Gaussian tracking terms (scalars): ``weight * exp(-(distance / scale)^2 / 2)``."""
        terms = self._config.reward_terms
        g = lambda name, d: float(terms[name].weight) * jnp.exp(-0.5 * jnp.square(d / float(terms[name].scale)))
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
