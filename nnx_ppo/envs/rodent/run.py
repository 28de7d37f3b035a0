"""``rodent_run``: run forward with the rodent body (no reference clips).

* **Observation** ``{"proprioception": {...}}`` (see
  :meth:`~nnx_ppo.envs.rodent.base.RodentBase._proprioception`).
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

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from ml_collections import config_dict
from mujoco_playground._src import mjx_env

from nnx_ppo.envs.rodent.base import Pose, RodentBase, base_config, finite, quat_rotate

__all__ = ["RodentRun", "default_config"]


def default_config() -> config_dict.ConfigDict:
    """Physics (:func:`base_config`) and the reward and termination settings."""
    return base_config(target_speed=0.25, forward_weight=1.0, upright_weight=0.2, healthy_reward=0.2,
                       control_cost=0.01, min_height=0.025, min_upright=0.5, reset_noise=0.1,
                       settle_seconds=0.3)


class RodentRun(RodentBase):
    """Run forward as fast as ``target_speed`` without falling (module docstring)."""

    def __init__(self, config: config_dict.ConfigDict | None = None, config_overrides: dict | None = None):
        super().__init__(default_config() if config is None else config, config_overrides)
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
