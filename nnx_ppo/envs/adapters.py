"""Adapters from third-party JAX environment libraries to :class:`RLEnv`.

None of them auto-resets: ``step`` returns the true final observation of the
episode, and the trainer resets. The adapters do not apply time limits
themselves (except gymnax, whose ``max_steps_in_episode`` is part of the env
params); :func:`nnx_ppo.envs.make` wraps them in :class:`TimeLimit`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.envs.spaces import Box, Discrete
from nnx_ppo.envs.types import EnvState, RLEnv, as_f32

__all__ = ["GymnaxEnv", "PlaygroundEnv", "BraxEnv", "OriginalEnv", "EnvAdaptedWarning"]


class EnvAdaptedWarning(UserWarning):
    """The one-line note :func:`~nnx_ppo.envs.as_env` gives when it adapts an
    env written for the original nnx-ppo (see :class:`OriginalEnv`)."""


# --------------------------------------------------------------------------- gymnax


class GymnaxEnv(RLEnv):
    """Adapter for a gymnax environment.

    ``state.data`` holds ``(gymnax_state, key)``: the key is split on every
    step. Uses ``env.step_env`` (no auto-reset). ``done`` includes gymnax's
    time limit (``params.max_steps_in_episode``); ``info["truncated"]`` is 1
    when that limit (and not a true termination) ended the episode.

    Discrete action spaces become ``Discrete(n)``; Box action spaces become
    ``Box((k,), -1, 1)`` and actions are rescaled to the env's bounds and clipped;
    a ``Dict`` action space becomes a dict of those (dict actions).
    Observations are cast to float32.
    """

    def __init__(self, name_or_env, params=None, **param_overrides):
        import gymnax
        from gymnax.environments import spaces as gspaces

        if isinstance(name_or_env, str):
            self.name = name_or_env
            env, default_params = gymnax.make(name_or_env)
        else:
            env, default_params = name_or_env, name_or_env.default_params
            self.name = type(env).__name__
        self.env = env
        self.params = default_params if params is None else params
        if param_overrides:
            self.params = self.params.replace(**param_overrides)
        self._act_space, self._to_env_action = self._convert_action_space(env.action_space(self.params), gspaces)
        self._obs_space = self._convert_obs_space(env.observation_space(self.params), gspaces)

    def _convert_obs_space(self, s, gspaces):
        if isinstance(s, gspaces.Box):
            return Box(tuple(s.shape) if s.shape is not None else (), s.low, s.high)
        if isinstance(s, gspaces.Discrete):
            return Box((), 0, s.n - 1)
        if isinstance(s, gspaces.Dict):
            return {k: self._convert_obs_space(v, gspaces) for k, v in s.spaces.items()}
        raise TypeError(f"gymnax:{self.name}: unsupported observation space {s!r}")

    @property
    def observation_space(self):
        return self._obs_space

    @property
    def action_space(self):
        return self._act_space

    def _convert_action_space(self, s, gspaces):
        """``(space, to_env)``: this library's action space for the gymnax
        space ``s`` and the function mapping its actions to the env's."""
        if isinstance(s, gspaces.Discrete):
            return Discrete(int(s.n)), lambda a: jnp.asarray(a, jnp.int32).reshape(())
        if isinstance(s, gspaces.Box):
            shape = tuple(s.shape) if s.shape is not None else ()
            low = np.broadcast_to(np.asarray(s.low, np.float32), shape).reshape(-1)
            high = np.broadcast_to(np.asarray(s.high, np.float32), shape).reshape(-1)

            def to_env(a):  # [-1, 1] (clipped) to [low, high]
                a = jnp.clip(jnp.asarray(jnp.reshape(a, (-1,)), jnp.float32), -1.0, 1.0)
                return (jnp.asarray(low) + (a + 1.0) * 0.5 * (jnp.asarray(high) - jnp.asarray(low))).reshape(shape)

            return Box((int(np.prod(shape)),), -1.0, 1.0), to_env
        if isinstance(s, gspaces.Dict):
            parts = {k: self._convert_action_space(v, gspaces) for k, v in s.spaces.items()}
            return ({k: space for k, (space, _) in parts.items()},
                    lambda a: {k: to_env(a[k]) for k, (_, to_env) in parts.items()})
        raise TypeError(f"gymnax:{self.name}: unsupported action space {s!r}")

    def reset(self, key):
        key, sub = jax.random.split(key)
        obs, gstate = self.env.reset_env(sub, self.params)
        return EnvState(obs=jax.tree.map(as_f32, obs), reward=as_f32(0.0), done=as_f32(0.0), metrics={},
                        info={"truncated": as_f32(0.0)}, data=(gstate, key))

    def step(self, state, action):
        gstate, key = state.data
        key, sub = jax.random.split(key)
        obs, gstate2, reward, terminated, _ = self.env.step_env(sub, gstate, self._to_env_action(action), self.params)
        terminated = jnp.asarray(terminated).reshape(()).astype(bool)
        out_of_time = jnp.asarray(gstate2.time >= self.params.max_steps_in_episode).reshape(())
        truncated = jnp.logical_and(out_of_time, jnp.logical_not(terminated))
        done = jnp.logical_or(terminated, truncated)
        return EnvState(obs=jax.tree.map(as_f32, obs), reward=as_f32(jnp.asarray(reward).reshape(())),
                        done=as_f32(done), metrics={}, info={**state.info, "truncated": as_f32(truncated)},
                        data=(gstate2, key))

    def __repr__(self):
        return f"GymnaxEnv({self.name!r})"


# --------------------------------------------------------------------------- playground


# MuJoCo/MJX and Brax rely on implicit rank promotion: the adapters allow it
# (jax.numpy_rank_promotion("allow")) while tracing them.


def _space_from_size(size, low=-np.inf, high=np.inf, what="observation") -> Any:
    """A space (tree) from an ``observation_size`` / ``action_size`` as the
    original nnx-ppo and MuJoCo Playground give them: an int ``n`` (a vector
    ``(n,)``), a shape tuple, or a dict (nested) of those."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        return Box((int(size),), low, high)
    if isinstance(size, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in size):
        return Box(tuple(int(d) for d in size), low, high)
    if isinstance(size, dict) or hasattr(size, "items"):
        return {k: _space_from_size(v, low, high, what) for k, v in size.items()}
    raise TypeError(f"cannot convert {what} size {size!r} to a space (expected an int, a shape tuple or a dict)")


def _strong(x):
    """``x`` as an array that is not weakly typed: a Python scalar (the
    original's ``info={"step": 0}`` at reset) or a weakly typed array
    (``jnp.where(c, 1.0, 0.0)``) gets its default dtype for good, so reset and
    step states keep the same dtypes through the trainer's scans."""
    if isinstance(x, (bool, int, float, complex)) or getattr(x, "weak_type", False):
        x = jnp.asarray(x)
        return jax.lax.convert_element_type(x, x.dtype)
    return x


def _f32_action(a):
    """A floating action leaf as float32 (an integer leaf, a categorical
    head's choice, is passed unchanged)."""
    a = jnp.asarray(a)
    return a if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_ else a.astype(jnp.float32)


class _JaxPhysicsEnv(RLEnv):
    """Shared adapter for envs whose state already has ``obs``, ``reward``,
    ``done``, ``metrics`` and ``info`` (MuJoCo Playground, Brax, envs written
    for the original nnx-ppo): the env's own state is kept in ``data``;
    ``observation_size`` and ``action_size`` (ints, shape tuples or dicts of
    them) give the spaces, continuous actions are in ``[-1, 1]`` (a dict
    ``action_size`` gives dict actions). Rewards may be dicts; a
    ``"truncated"`` flag in the wrapped state's ``info`` becomes
    ``info["truncated"]``."""

    check_keys_in_data = False  # the wrapped env may keep a reset-only key

    def __init__(self, env, name: str = "?"):
        self.env = env
        self.name = name

    @property
    def observation_space(self):
        with jax.numpy_rank_promotion("allow"):
            return _space_from_size(self.env.observation_size)

    @property
    def action_space(self):
        return _space_from_size(self.env.action_size, -1.0, 1.0, what="action")

    def _wrap(self, inner, info):
        inner = jax.tree.map(_strong, inner)
        done = as_f32(inner.done)
        # the wrapped state's info["truncated"] (where it has one), only where done
        inner_info = getattr(inner, "info", None)
        truncated = as_f32(0.0)
        if isinstance(inner_info, dict) and "truncated" in inner_info:
            truncated = as_f32(jnp.logical_and(jnp.asarray(inner_info["truncated"]) > 0, done > 0))
        return EnvState(obs=jax.tree.map(as_f32, inner.obs), reward=jax.tree.map(as_f32, inner.reward), done=done,
                        metrics=jax.tree.map(as_f32, dict(getattr(inner, "metrics", None) or {})),
                        info={**info, "truncated": truncated}, data=inner)

    def reset(self, key):
        with jax.numpy_rank_promotion("allow"):
            inner = self.env.reset(key)
        return self._wrap(inner, {})

    def step(self, state, action):
        with jax.numpy_rank_promotion("allow"):
            inner = self.env.step(state.data, jax.tree.map(_f32_action, action))
        return self._wrap(inner, state.info)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"


class PlaygroundEnv(_JaxPhysicsEnv):
    """Adapter for a MuJoCo Playground environment (``mujoco_playground.MjxEnv``).

    ``state.data`` holds the Playground state itself (obs/reward/done kept in
    sync). Playground envs have no time limit of their own: ``make`` wraps
    this adapter in :class:`TimeLimit`. Actions are in ``[-1, 1]``.
    """

    def render(self, states, **kwargs):
        """Render a list of (un-batched) states with Playground's renderer.

        Needs an OpenGL context (e.g. ``MUJOCO_GL=egl`` on a headless machine).
        """
        if not hasattr(self.env, "render"):
            raise NotImplementedError(f"playground:{self.name} has no render method")
        trajectory = [s.data if isinstance(s, EnvState) else s for s in states]
        try:
            return self.env.render(trajectory, **kwargs)
        except Exception as e:  # noqa: BLE001 -- re-raise with guidance
            raise RuntimeError(f"Rendering playground:{self.name} failed ({type(e).__name__}: {e}). "
                               "Headless machines need an OpenGL backend, e.g. set MUJOCO_GL=egl "
                               "(or osmesa) before importing mujoco.") from e


# --------------------------------------------------------------------------- brax


class BraxEnv(_JaxPhysicsEnv):
    """Adapter for a Brax environment (``brax.envs.Env``).

    ``state.data`` holds the Brax state. Brax envs take actions in ``[-1, 1]``.
    Brax's own info (e.g. ``time_out``) stays inside ``data``; ``make`` wraps
    this adapter in :class:`TimeLimit`.
    """


# --------------------------------------------------------------------------- the original nnx-ppo's envs


class OriginalEnv(_JaxPhysicsEnv):
    """Adapter for an env written for the original nnx-ppo (0.3.0).

    The original's protocol: ``reset(key)`` and ``step(state, action)``
    returning a state with ``obs``, ``reward`` (a float or a dict of them),
    ``done`` (bool or float: termination *or* truncation) and ``info``;
    ``observation_size`` / ``action_size`` (ints, shape tuples or dicts of
    them) where the env declares them. :func:`~nnx_ppo.envs.as_env` (and so
    ``train_ppo``) wraps such an env in this adapter, with a one-line
    :class:`EnvAdaptedWarning`.

    * ``state.data`` holds the env's own state, passed back to its ``step``;
      obs, rewards, ``done`` and metrics are cast to float32, and leaves
      without a fixed dtype (a Python ``0`` in ``info`` at reset) get one.
    * ``info["truncated"]``: the env's own ``info["truncated"]`` where it has
      one (the original's episode wrapper sets it), else 0. The original's
      ``done`` does not tell a time limit from a real end, so without it every
      ``done`` is a termination: the value after it is 0, not bootstrapped
      from the last observation (what the original did too). Add a
      ``TimeLimit`` (``as_env(env, episode_length=N)``) or set
      ``info["truncated"]`` to bootstrap on time limits.
    * ``observation_space``: from ``observation_size``, else the shapes of the
      reset observation (float32 ``Box`` leaves).
    * ``action_space``: from ``action_size``: ``Box(shape, -1, 1)`` leaves
      (the original's policies are tanh-Gaussian: continuous actions in
      ``[-1, 1]``; it has no discrete actions), a dict for a dict
      ``action_size``. An env without ``action_size`` has no action space:
      training passes the network's actions as they are (build the network
      by hand), and ``make_actor_critic_for_env`` / ``check_env`` ask for one.
    """

    def __init__(self, env, name: str | None = None):
        super().__init__(env, name if name is not None else type(env).__name__)

    def reset_shapes(self) -> Any:
        """The shapes of one reset state of the wrapped env (``jax.eval_shape``: nothing runs)."""
        with jax.numpy_rank_promotion("allow"):
            return jax.eval_shape(self.env.reset, jax.random.key(0))

    @property
    def observation_space(self):
        if getattr(self.env, "observation_size", None) is not None:
            return super().observation_space
        obs = self.reset_shapes().obs
        return jax.tree_util.tree_map(lambda x: Box(x.shape), obs)

    @property
    def action_space(self):
        if getattr(self.env, "action_size", None) is None:
            raise AttributeError(f"{self.name} (an env written for the original nnx-ppo) has no action_size, so its "
                                 "action space is unknown: give the env an action_size (an int, a shape tuple or a "
                                 "dict of them), or build the network by hand (training passes the network's actions "
                                 "to the env as they are)")
        return super().action_space

    def describe(self, reset_shapes: Any = None) -> str:
        """How the env is adapted, for the one-line note: where the spaces
        come from and what ``done`` means (``reset_shapes``: those of
        :meth:`reset_shapes`, if already at hand)."""
        has_obs = getattr(self.env, "observation_size", None) is not None
        has_act = getattr(self.env, "action_size", None) is not None
        info = getattr(self.reset_shapes() if reset_shapes is None else reset_shapes, "info", None)
        has_truncated = isinstance(info, dict) and "truncated" in info
        parts = [
            "observation space from observation_size" if has_obs else "observation space from the reset observation",
            "actions Box(-1, 1) from action_size" if has_act else "no action_size: actions passed as the network "
                                                                  "gives them",
            "info['truncated'] read from the env" if has_truncated else
            "info['truncated'] filled with 0: every done is a termination (no bootstrap on time limits)",
        ]
        return "; ".join(parts)
