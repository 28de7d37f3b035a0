"""What the rodent tasks share: the MJX model, the physics step, proprioception.

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
from flax import struct
from ml_collections import config_dict
from mujoco import mjx
from mujoco_playground._src import mjx_env

from nnx_ppo.envs.rodent import body as _body

__all__ = ["Pose", "RodentBase", "base_config", "quat_rotate", "quat_rotate_inv", "quat_mul", "quat_conj",
           "finite"]


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
        return data, self._pose(data)

    def _pose(self, data: mjx.Data) -> Pose:
        return Pose(qpos=data.qpos, qvel=data.qvel, act=data.act, body_pos=data.site_xpos[self._sites])

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
