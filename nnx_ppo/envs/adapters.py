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

__all__ = ["GymnaxEnv", "PlaygroundEnv", "BraxEnv"]



def _f32_tree(tree):
    return jax.tree_util.tree_map(as_f32, tree)


def _rescale_action(action, low, high):
    """Map an action in [-1, 1] to [low, high] (clipped)."""
    a = jnp.clip(jnp.asarray(action, jnp.float32), -1.0, 1.0)
    low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
    return low + (a + 1.0) * 0.5 * (high - low)


# --------------------------------------------------------------------------- gymnax


class GymnaxEnv(RLEnv):
    """Adapter for a gymnax environment.

    ``state.data`` holds ``(gymnax_state, key)``: the key is split on every
    step. Uses ``env.step_env`` (no auto-reset). ``done`` includes gymnax's
    time limit (``params.max_steps_in_episode``); ``info["truncated"]`` is 1
    when that limit (and not a true termination) ended the episode.

    Discrete action spaces become ``Discrete(n)``; Box action spaces become
    ``Box((k,), -1, 1)`` and actions are rescaled to the env's bounds and clipped.
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
        params = default_params if params is None else params
        if param_overrides:
            params = params.replace(**param_overrides)
        self.env = env
        self.params = params

        gact = env.action_space(params)
        if isinstance(gact, gspaces.Discrete):
            self._act_space = Discrete(int(gact.n))
            self._act_low = self._act_high = None
            self._act_shape = None
        elif isinstance(gact, gspaces.Box):
            shape = tuple(gact.shape) if gact.shape is not None else ()
            self._act_shape = shape
            self._act_low = np.broadcast_to(np.asarray(gact.low, np.float32), shape)
            self._act_high = np.broadcast_to(np.asarray(gact.high, np.float32), shape)
            size = int(np.prod(shape)) if shape else 1
            self._act_space = Box((size,), -1.0, 1.0)
        else:
            raise TypeError(f"gymnax:{self.name}: unsupported action space {gact!r}")

        gobs = env.observation_space(params)
        self._obs_space = self._convert_obs_space(gobs, gspaces)

    def _convert_obs_space(self, s, gspaces):
        if isinstance(s, gspaces.Box):
            shape = tuple(s.shape) if s.shape is not None else ()
            low = np.broadcast_to(np.asarray(s.low, np.float64), shape)
            high = np.broadcast_to(np.asarray(s.high, np.float64), shape)
            return Box(shape, low, high)
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

    def _env_action(self, action):
        if self._act_low is None:
            return jnp.asarray(action, jnp.int32).reshape(())
        a = _rescale_action(jnp.reshape(action, (-1,)), self._act_low.reshape(-1), self._act_high.reshape(-1))
        return a.reshape(self._act_shape)

    def reset(self, key):
        key, sub = jax.random.split(key)
        obs, gstate = self.env.reset_env(sub, self.params)
        return EnvState(
            obs=_f32_tree(obs),
            reward=as_f32(0.0),
            done=as_f32(0.0),
            metrics={},
            info={"truncated": as_f32(0.0)},
            data=(gstate, key),
        )

    def step(self, state, action):
        gstate, key = state.data
        key, sub = jax.random.split(key)
        obs, gstate2, reward, terminated, _ = self.env.step_env(
            sub, gstate, self._env_action(action), self.params
        )
        terminated = jnp.asarray(terminated).reshape(()).astype(bool)
        out_of_time = jnp.asarray(gstate2.time >= self.params.max_steps_in_episode).reshape(())
        truncated = jnp.logical_and(out_of_time, jnp.logical_not(terminated))
        done = jnp.logical_or(terminated, truncated)
        return EnvState(
            obs=_f32_tree(obs),
            reward=as_f32(jnp.asarray(reward).reshape(())),
            done=as_f32(done),
            metrics={},
            info={**state.info, "truncated": as_f32(truncated)},
            data=(gstate2, key),
        )

    def __repr__(self):
        return f"GymnaxEnv({self.name!r})"


# --------------------------------------------------------------------------- playground


def _allow_rank_promotion():
    """MuJoCo/MJX and Brax rely on implicit rank promotion; allow it while tracing them."""
    return jax.numpy_rank_promotion("allow")


def _space_from_size(size) -> Any:
    if isinstance(size, int):
        return Box((size,))
    if isinstance(size, (tuple, list)) and all(isinstance(d, int) for d in size):
        return Box(tuple(size))
    if isinstance(size, dict) or hasattr(size, "items"):
        return {k: _space_from_size(v) for k, v in size.items()}
    raise TypeError(f"cannot convert observation size {size!r} to a space")


class _JaxPhysicsEnv(RLEnv):
    """Shared adapter for envs whose state already has ``obs``, ``reward``,
    ``done`` and ``metrics`` (MuJoCo Playground, Brax): the env's own state is
    kept in ``data``; actions are in ``[-1, 1]``."""

    check_keys_in_data = False  # the wrapped env may keep a reset-only key

    def __init__(self, env, name: str = "?"):
        self.env = env
        self.name = name

    @property
    def observation_space(self):
        with _allow_rank_promotion():
            return _space_from_size(self.env.observation_size)

    @property
    def action_space(self):
        return Box((int(self.env.action_size),), -1.0, 1.0)

    def _wrap(self, inner, info):
        inner = inner.replace(reward=_f32_tree(inner.reward), done=as_f32(inner.done))
        return EnvState(
            obs=inner.obs,
            reward=inner.reward,
            done=inner.done,
            metrics={k: as_f32(v) for k, v in inner.metrics.items()},
            info=info,
            data=inner,
        )

    def reset(self, key):
        with _allow_rank_promotion():
            inner = self.env.reset(key)
        return self._wrap(inner, {"truncated": as_f32(0.0)})

    def step(self, state, action):
        with _allow_rank_promotion():
            inner = self.env.step(state.data, jnp.asarray(action, jnp.float32))
        return self._wrap(inner, {**state.info, "truncated": as_f32(0.0)})

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
            raise RuntimeError(
                f"Rendering playground:{self.name} failed ({type(e).__name__}: {e}). "
                "Headless machines need an OpenGL backend, e.g. set MUJOCO_GL=egl "
                "(or osmesa) before importing mujoco."
            ) from e


# --------------------------------------------------------------------------- brax


class BraxEnv(_JaxPhysicsEnv):
    """Adapter for a Brax environment (``brax.envs.Env``).

    ``state.data`` holds the Brax state. Brax envs take actions in ``[-1, 1]``.
    Brax's own info (e.g. ``time_out``) stays inside ``data``; ``make`` wraps
    this adapter in :class:`TimeLimit`.
    """
