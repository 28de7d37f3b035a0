"""A task of ``bench/suite.py`` as each peer library takes its envs, built once.

Runs in the peers' venv (``/tmp/peers-venv``; no import of this repository's
``nnx_ppo``). :class:`SuiteEnv` builds the suite's env from its spec and
``--env-kwargs`` the way ``nnx_ppo.envs.make`` does:

* ``gymnax:NAME``: ``gymnax.make(NAME)``; the kwargs (``memory_length``, ...)
  replace fields of its env params (``episode_length`` is
  ``max_steps_in_episode``); ``step_env`` (no auto-reset) ends an episode on
  a termination or when ``state.time`` reaches ``max_steps_in_episode``, and
  the latter alone is a truncation (``nnx_ppo.envs.adapters.GymnaxEnv``).
  Observations are float32 in their gymnax shape (MinAtar: 10 x 10 x C).
* ``playground:NAME``: ``registry.load(NAME, config_overrides={"impl":
  "jax", **kwargs})`` under a time limit of its configured
  ``episode_length`` (1000), a truncation (``nnx_ppo``'s ``TimeLimit``).
* ``xminigrid:NAME``: ``xminigrid.make(NAME, **kwargs)``, its observation
  (view x view cells of tile and colour ids) one-hot encoded and flattened,
  done on its last step, truncated when that step has discount 1
  (``bench/suite_envs.py``'s ``XMiniGridEnv``).

``hide_obs`` removes those indices of the observation's last axis, after
everything else, as ``nnx_ppo``'s ``ObservationMask`` does (for MinAtar the
last axis is the channel axis: ``[2]`` removes Breakout's trail channel).

Views of one :class:`SuiteEnv`, each in the API its library expects:

* :class:`SuiteEnv` itself is a gymnax environment of the API rejax 0.1.3
  was written for (gymnax < 1.0: ``step`` auto-resets and returns ``obs,
  state, reward, done, info``; actions in the env's own bounds);
* :class:`StateView`: ``reset(key)`` / ``step(state, action)`` states with
  ``obs``, ``reward``, ``done`` and ``info["truncated"]`` (MuJoCo
  Playground's shape of API), for the original nnx-ppo; continuous actions
  in [-1, 1], rescaled to the env's bounds as ``nnx_ppo`` does;
* :func:`brax_env`: a ``brax.envs.Env`` (its ``done`` a termination only,
  Brax's episode wrapper adds the time limit), actions in [-1, 1].

:func:`evaluator` plays fresh episodes of a :class:`SuiteEnv` with a policy
function to their end (or the time limit), as ``nnx-ppo eval`` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def _strong(tree):
    """Every leaf strongly typed (a weakly typed reset leaf would change a scan carry's type)."""
    def leaf(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return x
        x = jnp.asarray(x)
        return jax.lax.convert_element_type(x, x.dtype)

    return jax.tree.map(leaf, tree)


@struct.dataclass
class Params:
    """The env params the views pass around: only the time limit (rejax reads it)."""

    max_steps_in_episode: int = 1000


# ----------------------------------------------------------------------------- sources


class _GymnaxSource:
    def __init__(self, name: str, kwargs: dict):
        import gymnax
        from gymnax.environments import spaces

        if name not in gymnax.registered_envs:
            raise ValueError(f"gymnax has no {name!r}")
        self.env, params = gymnax.make(name)
        if "episode_length" in kwargs:
            kwargs["max_steps_in_episode"] = int(kwargs.pop("episode_length"))
        self.params = params.replace(**kwargs) if kwargs else params
        self.max_steps = int(self.params.max_steps_in_episode)
        self.obs_shape = tuple(int(d) for d in self.env.observation_space(self.params).shape)
        space = self.env.action_space(self.params)
        if isinstance(space, spaces.Discrete):
            self.num_actions, self.action_shape, self.low, self.high = int(space.n), None, None, None
        else:
            shape = tuple(int(d) for d in space.shape)
            self.num_actions, self.action_shape = None, shape
            self.low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
            self.high = np.broadcast_to(np.asarray(space.high, np.float32), shape)

    def reset(self, key):
        obs, state = self.env.reset_env(key, self.params)
        return obs, state

    def step(self, key, state, action):
        obs, state, reward, terminated, _ = self.env.step_env(key, state, action, self.params)
        terminated = jnp.asarray(terminated).reshape(()).astype(bool)
        out_of_time = jnp.asarray(state.time >= self.params.max_steps_in_episode).reshape(())
        return obs, state, jnp.asarray(reward).reshape(()), terminated, out_of_time & ~terminated


@struct.dataclass
class _TimedState:
    inner: Any
    time: jax.Array


class _PlaygroundSource:
    def __init__(self, name: str, kwargs: dict):
        from mujoco_playground import registry

        if name not in registry.ALL_ENVS:
            raise ValueError(f"MuJoCo Playground has no {name!r}")
        episode_length = kwargs.pop("episode_length", None)
        self.env = registry.load(name, config_overrides={"impl": "jax", **kwargs})
        if episode_length is None:
            cfg = getattr(self.env, "_config", None)
            episode_length = cfg.get("episode_length", 1000) if cfg is not None and hasattr(cfg, "get") else 1000
        self.max_steps = int(episode_length)
        size = self.env.observation_size
        if not isinstance(size, (int, np.integer)):
            raise TypeError(f"playground:{name}: only flat observations are supported here, got {size!r}")
        self.obs_shape = (int(size),)
        self.num_actions, self.action_shape = None, (int(self.env.action_size),)
        self.low = np.full(self.action_shape, -1.0, np.float32)
        self.high = np.full(self.action_shape, 1.0, np.float32)

    def reset(self, key):
        s = self.env.reset(key)
        return s.obs, _TimedState(s, jnp.zeros((), jnp.int32))

    def step(self, key, state, action):
        s = self.env.step(state.inner, action)
        time = state.time + 1
        terminated = jnp.asarray(s.done).reshape(()) > 0
        truncated = (time >= self.max_steps) & ~terminated
        return s.obs, _TimedState(s, time), jnp.asarray(s.reward).reshape(()), terminated, truncated


class _XMiniGridSource:
    def __init__(self, name: str, kwargs: dict):
        import xminigrid
        from xminigrid.core.constants import NUM_COLORS, NUM_TILES

        if name not in xminigrid.registered_environments():
            raise ValueError(f"xminigrid has no {name!r}")
        if "episode_length" in kwargs:
            kwargs["max_steps"] = int(kwargs.pop("episode_length"))
        self.env, self.params = xminigrid.make(name, **kwargs)
        self.n_tiles, self.n_colors = int(NUM_TILES), int(NUM_COLORS)
        view = int(self.params.view_size)
        self.max_steps = int(self.params.max_steps)
        self.obs_shape = (view * view * (self.n_tiles + self.n_colors),)
        self.num_actions, self.action_shape = int(self.env.num_actions(self.params)), None
        self.low = self.high = None

    def _encode(self, obs):
        tiles = jax.nn.one_hot(obs[..., 0], self.n_tiles, dtype=jnp.float32)
        colors = jax.nn.one_hot(obs[..., 1], self.n_colors, dtype=jnp.float32)
        return jnp.concatenate([tiles, colors], axis=-1).reshape(-1)

    def reset(self, key):
        ts = _strong(self.env.reset(self.params, key))
        return self._encode(ts.observation), ts

    def step(self, key, state, action):
        ts = _strong(self.env.step(self.params, state, action))
        done = ts.step_type == 2  # StepType.LAST
        truncated = done & (ts.discount > 0)
        return self._encode(ts.observation), ts, jnp.asarray(ts.reward).reshape(()), done & ~truncated, truncated


_SOURCES = {"gymnax": _GymnaxSource, "playground": _PlaygroundSource, "xminigrid": _XMiniGridSource}


# ----------------------------------------------------------------------------- the env


class SuiteEnv:
    """A suite task (``env`` spec and ``env_kwargs`` as in ``bench/suite.py``)
    as a gymnax environment of the pre-1.0 API (what rejax 0.1.3 calls).

    ``step_env(key, state, action, params)`` takes actions in the env's own
    bounds (an int for a discrete action) and returns ``obs, state, reward,
    done, {"truncated": ...}`` with ``done`` a termination or the time limit;
    ``step`` resets finished episodes (gymnax's auto-reset).
    """

    def __init__(self, spec: str, env_kwargs: dict | None = None):
        kwargs = dict(env_kwargs or {})
        hide = kwargs.pop("hide_obs", None)
        prefix, sep, name = spec.partition(":")
        if not sep or prefix not in _SOURCES:
            raise ValueError(f"unsupported env spec {spec!r} (expected one of {', '.join(p + ':' for p in _SOURCES)})")
        self.spec = spec
        self.source = _SOURCES[prefix](name, kwargs)
        shape = self.source.obs_shape
        self._keep = None
        if hide is not None:  # nnx_ppo's ObservationMask: indices of the last axis, outside everything else
            if isinstance(hide, (str, int)) or not hide:
                raise ValueError(f"hide_obs must be a non-empty list of indices, got {hide!r}")
            width = shape[-1]
            bad = [i for i in hide if not (-width <= int(i) < width)]
            if bad:
                raise ValueError(f"hide_obs: indices {bad} out of range for width {width}")
            hidden = {int(i) % width for i in hide}
            self._keep = np.array([i for i in range(width) if i not in hidden], dtype=np.int32)
            shape = shape[:-1] + (len(self._keep),)
        self.obs_shape = shape
        self.max_steps = self.source.max_steps
        self.default_params = Params(max_steps_in_episode=self.max_steps)
        self.discrete = self.source.num_actions is not None
        self.num_actions = self.source.num_actions
        self.action_shape = self.source.action_shape
        self.low, self.high = self.source.low, self.source.high

    # -- observations and actions
    def _obs(self, obs):
        obs = jnp.asarray(obs, jnp.float32)
        return obs if self._keep is None else jnp.take(obs, jnp.asarray(self._keep), axis=-1)

    @property
    def obs_size(self) -> int:
        """The flattened observation's size."""
        return int(np.prod(self.obs_shape))

    @property
    def action_size(self) -> int:
        """Actions of a discrete env, or the size of a continuous action."""
        return self.num_actions if self.discrete else int(np.prod(self.action_shape))

    def native_action(self, action):
        """An action of the env's own kind: an int32 scalar, or the Box's shape (not rescaled)."""
        if self.discrete:
            return jnp.asarray(action, jnp.int32).reshape(())
        return jnp.asarray(action, jnp.float32).reshape(self.action_shape)

    def from_unit(self, action):
        """A continuous action in [-1, 1] (a tanh policy's) mapped to the env's bounds, clipped
        (``nnx_ppo``'s gymnax adapter); a discrete action is passed on."""
        if self.discrete:
            return self.native_action(action)
        a = jnp.clip(jnp.asarray(action, jnp.float32).reshape(self.action_shape), -1.0, 1.0)
        return jnp.asarray(self.low) + (a + 1.0) * 0.5 * jnp.asarray(self.high - self.low)

    # -- gymnax API (pre-1.0)
    def reset_env(self, key, params=None):
        obs, state = self.source.reset(key)
        return self._obs(obs), _strong(state)

    def step_env(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated = self.source.step(key, state, self.native_action(action))
        done = terminated | truncated
        return (self._obs(obs), _strong(state), jnp.asarray(reward, jnp.float32), done,
                {"truncated": truncated.astype(jnp.float32)})

    def reset(self, key, params=None):
        return self.reset_env(key, params)

    def step(self, key, state, action, params=None):
        key_step, key_reset = jax.random.split(key)
        obs, state, reward, done, info = self.step_env(key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        state = jax.tree.map(lambda a, b: jax.lax.select(done, a, b), state_re, state)
        obs = jax.lax.select(done, obs_re, obs)
        return obs, state, reward, done, info

    def action_space(self, params=None):
        from gymnax.environments import spaces

        if self.discrete:
            return spaces.Discrete(self.num_actions)
        return spaces.Box(self.low, self.high, self.action_shape, jnp.float32)

    def observation_space(self, params=None):
        from gymnax.environments import spaces

        return spaces.Box(-jnp.inf, jnp.inf, self.obs_shape, jnp.float32)

    @property
    def name(self) -> str:
        return self.spec

    def __repr__(self):
        return f"SuiteEnv({self.spec!r})"


# ----------------------------------------------------------------------------- the original's API


@struct.dataclass
class State:
    """The state of :class:`StateView` (MuJoCo Playground's fields, which the original reads)."""

    obs: Any
    reward: Any
    done: Any
    metrics: dict
    info: dict
    env_state: Any = None

    def replace(self, **changes) -> "State":
        return dataclasses.replace(self, **changes)


class StateView:
    """``reset(key)`` / ``step(state, action)`` over a :class:`SuiteEnv`, with
    flattened observations, ``done`` (termination or time limit) and
    ``info["truncated"]`` (the time limit alone); continuous actions in [-1, 1]."""

    def __init__(self, env: SuiteEnv):
        self.env = env
        self.observation_size = env.obs_size
        self.action_size = env.action_size

    def reset(self, key):
        key, sub = jax.random.split(key)
        obs, state = self.env.reset_env(sub)
        return State(obs=obs.reshape(-1), reward=jnp.zeros((), jnp.float32), done=jnp.zeros((), jnp.float32),
                     metrics={}, info={"key": key, "truncated": jnp.zeros((), jnp.float32)}, env_state=state)

    def step(self, state, action):
        key, sub = jax.random.split(state.info["key"])
        obs, env_state, reward, done, info = self.env.step_env(sub, state.env_state, self.env.from_unit(action))
        return State(obs=obs.reshape(-1), reward=reward, done=done.astype(jnp.float32), metrics={},
                     info={"key": key, "truncated": info["truncated"]}, env_state=env_state)


# ----------------------------------------------------------------------------- Brax


def brax_env(env: SuiteEnv):
    """A ``brax.envs.Env`` over ``env``: flattened observations, actions in
    [-1, 1]; ``done`` only on a termination, since Brax's own episode
    wrapper (``episode_length`` = the env's time limit) ends and marks
    truncated episodes."""
    from brax.envs.base import Env
    from brax.envs.base import State as BraxState

    class _Brax(Env):
        def reset(self, rng):
            key, sub = jax.random.split(rng)
            obs, state = env.reset_env(sub)
            return BraxState(pipeline_state=state, obs=obs.reshape(-1), reward=jnp.zeros(()), done=jnp.zeros(()),
                             metrics={}, info={"key": key})

        def step(self, state, action):
            key, sub = jax.random.split(state.info["key"])
            obs, env_state, reward, done, info = env.step_env(sub, state.pipeline_state, env.from_unit(action))
            terminated = done.astype(jnp.float32) * (1.0 - info["truncated"])
            return state.replace(pipeline_state=env_state, obs=obs.reshape(-1), reward=reward, done=terminated,
                                 info={**state.info, "key": key})

        @property
        def observation_size(self):
            return env.obs_size

        @property
        def action_size(self):
            return env.action_size

        @property
        def backend(self):
            return "suite"

    return _Brax()


# ----------------------------------------------------------------------------- evaluation


def evaluator(env: SuiteEnv, act, episodes: int):
    """A function ``run(params, carry, key)`` that plays ``episodes`` fresh
    episodes of ``env`` to their end (at most its time limit), as ``nnx-ppo
    eval`` does, compiled once for every ``params`` of the same structure.

    ``act(params, carry, obs, key) -> (actions, carry)`` acts for the whole
    batch: ``obs`` is ``[episodes, *env.obs_shape]`` float32, the actions are
    the env's own (ints, or continuous in its bounds). ``run`` returns the
    returns and lengths (numpy) and their statistics.
    """
    env_params = env.default_params

    @jax.jit
    def play(params, carry, key):
        reset_key, loop_key = jax.random.split(key)
        obs, states = jax.vmap(env.reset_env, (0, None))(jax.random.split(reset_key, episodes), env_params)
        zeros = jnp.zeros(episodes, jnp.float32)
        init = (jnp.zeros((), jnp.int32), loop_key, obs, states, carry, zeros, zeros, jnp.zeros(episodes, bool))

        def cond(c):
            return (c[0] < env.max_steps) & ~jnp.all(c[7])

        def body(c):
            t, key, obs, states, carry, ret, length, done = c
            key, act_key, step_key = jax.random.split(key, 3)
            actions, carry = act(params, carry, obs, act_key)
            obs, states, reward, d, _ = jax.vmap(env.step_env, (0, 0, 0, None))(
                jax.random.split(step_key, episodes), states, actions, env_params)
            alive = ~done
            ret = ret + jnp.where(alive, reward, 0.0)
            length = length + alive.astype(jnp.float32)
            return t + 1, key, obs, states, carry, ret, length, done | d

        out = jax.lax.while_loop(cond, body, init)
        return out[5], out[6]

    def run(params, carry, key) -> dict:
        returns, lengths = (np.asarray(x, np.float64) for x in play(params, carry, key))
        return {"returns": returns, "lengths": lengths, "mean": float(returns.mean()), "std": float(returns.std()),
                "min": float(returns.min()), "max": float(returns.max()), "length": float(lengths.mean())}

    return run
