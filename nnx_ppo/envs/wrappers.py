"""Environment wrappers. Each wraps an :class:`RLEnv` and is itself one."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.envs.spaces import Box
from nnx_ppo.envs.types import RLEnv, as_f32

__all__ = ["Wrapper", "TimeLimit", "RewardScale", "ObservationMask", "ActionRepeat", "ResetPool"]


class Wrapper(RLEnv):
    """Forwards everything to the wrapped env; subclasses override what they change."""

    def __init__(self, env: RLEnv):
        self.env = env

    def reset(self, key):
        return self._map_state(self.env.reset(key))

    def step(self, state, action):
        return self._map_state(self.env.step(state, action))

    def _map_state(self, state):
        """What the wrapper changes in the states ``reset`` and ``step`` return (here: nothing)."""
        return state

    @property
    def observation_space(self):
        return self.env.observation_space

    @property
    def action_space(self):
        return self.env.action_space

    def render(self, states, **kwargs):
        return self.env.render(states, **kwargs)

    @property
    def unwrapped(self):
        return self.env.unwrapped

    def __getattr__(self, name):
        # Only reached when normal lookup fails: expose the inner env's extras.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self):
        return f"{type(self).__name__}({self.env!r})"


class TimeLimit(Wrapper):
    """Ends episodes after ``max_steps`` steps, marking them truncated.

    Writes ``info["steps"]`` (int32 step count) and ``info["truncated"]``.
    When the count reaches ``max_steps`` and the wrapped env did not itself end
    the episode at that step, sets ``done = 1`` and ``info["truncated"] = 1``.
    A termination on the last step stays a termination (truncated = 0).

    With ``random_initial_steps=True``, :meth:`desynchronize` (which the
    trainer calls once, on the initial states) starts each env's counter
    uniformly in ``[0, max_steps)``, so the first episodes of vmapped envs end
    at different times and later ones stay out of step. Every later episode
    is full length.

    With ``random_reset_steps=k > 0``, every ``reset`` starts the counter
    uniformly in ``[0, k)``, so every episode lasts between
    ``max_steps - k + 1`` and ``max_steps`` steps and vmapped episodes never
    fall back into lock-step (``k = max_steps // 2`` is what the original
    nnx-ppo's episode wrapper does). Use it for training envs only: an
    evaluation env should run full episodes.
    """

    def __init__(self, env: RLEnv, max_steps: int, random_initial_steps: bool = False, random_reset_steps: int = 0):
        super().__init__(env)
        if int(max_steps) < 1:
            raise ValueError(f"TimeLimit max_steps must be >= 1, got {max_steps}")
        if not 0 <= int(random_reset_steps) <= int(max_steps):
            raise ValueError(f"TimeLimit random_reset_steps must be in [0, max_steps={max_steps}], "
                             f"got {random_reset_steps}")
        self.max_steps = int(max_steps)
        self.random_initial_steps = bool(random_initial_steps)
        self.random_reset_steps = int(random_reset_steps)

    def reset(self, key):
        state = self.env.reset(key)
        inner_trunc = as_f32(state.info.get("truncated", 0.0))
        steps = jnp.zeros((), jnp.int32)
        if self.random_reset_steps > 0:
            steps = jax.random.randint(jax.random.fold_in(key, 1), (), 0, self.random_reset_steps, dtype=jnp.int32)
        return state.replace(info={**state.info, "steps": steps, "truncated": inner_trunc})

    def desynchronize(self, state, key):
        """Start this (un-batched) state's episode at a random step of the time
        limit when ``random_initial_steps`` is set; otherwise return it as is."""
        if not self.random_initial_steps:
            return state
        steps = jax.random.randint(key, (), 0, self.max_steps, dtype=jnp.int32)
        return state.replace(info={**state.info, "steps": steps})

    def step(self, state, action):
        nxt = self.env.step(state, action)
        steps = state.info["steps"] + 1
        inner_done = as_f32(nxt.done)
        inner_trunc = as_f32(nxt.info.get("truncated", 0.0))
        hit_limit = jnp.logical_and(steps >= self.max_steps, inner_done == 0.0)
        truncated = jnp.where(hit_limit, 1.0, inner_trunc).astype(jnp.float32)
        done = jnp.where(hit_limit, 1.0, inner_done).astype(jnp.float32)
        return nxt.replace(done=done, info={**nxt.info, "steps": steps, "truncated": truncated})

    def __repr__(self):
        return f"TimeLimit({self.env!r}, max_steps={self.max_steps})"


class RewardScale(Wrapper):
    """Multiplies the reward (every leaf, for dict rewards) by ``scale``."""

    def __init__(self, env: RLEnv, scale: float):
        super().__init__(env)
        self.scale = float(scale)

    def _map_state(self, state):
        return state.replace(reward=jax.tree.map(lambda r: (r * self.scale).astype(r.dtype), state.reward))


class ObservationMask(Wrapper):
    """Removes parts of the observation (e.g. velocities, to make a memory task).

    ``hide`` is a list of keys for dict observations, or a list of integer
    indices along the last axis for flat (array) observations. The removed
    entries also disappear from ``observation_space``.
    """

    def __init__(self, env: RLEnv, hide: Sequence):
        super().__init__(env)
        self.hide = list(hide)
        space = env.observation_space
        if isinstance(space, dict):
            missing = [k for k in self.hide if k not in space]
            if missing:
                raise ValueError(f"ObservationMask: keys {missing} not in observation keys {list(space)}")
            self._keep = None
        elif isinstance(space, Box):
            if not space.shape:
                raise ValueError("ObservationMask: cannot mask a scalar observation")
            width = space.shape[-1]
            bad = [i for i in self.hide if not (-width <= int(i) < width)]
            if bad:
                raise ValueError(f"ObservationMask: indices {bad} out of range for width {width}")
            hidden = {int(i) % width for i in self.hide}
            self._keep = np.array([i for i in range(width) if i not in hidden], dtype=np.int32)
        else:
            raise TypeError(f"ObservationMask: unsupported observation space {space!r}")

    def _map_state(self, state):
        # Inner envs keep their own state in `data`, so they never read the masked obs.
        if self._keep is None:
            return state.replace(obs={k: v for k, v in state.obs.items() if k not in self.hide})
        return state.replace(obs=jnp.take(state.obs, jnp.asarray(self._keep), axis=-1))

    @property
    def observation_space(self):
        space = self.env.observation_space
        if self._keep is None:
            return {k: v for k, v in space.items() if k not in self.hide}
        return Box(space.shape[:-1] + (len(self._keep),), space.low[..., self._keep], space.high[..., self._keep],
                   space.dtype)


class ActionRepeat(Wrapper):
    """Repeats each action ``repeat`` times, summing rewards.

    Stops repeating as soon as the wrapped env reports ``done``: the returned
    state is the one of the step that ended the episode.
    """

    def __init__(self, env: RLEnv, repeat: int):
        super().__init__(env)
        if int(repeat) < 1:
            raise ValueError(f"ActionRepeat repeat must be >= 1, got {repeat}")
        self.repeat = int(repeat)

    def step(self, state, action):
        first = self.env.step(state, action)
        if self.repeat == 1:
            return first

        def body(_, carry):
            s, total = carry
            nxt = self.env.step(s, action)
            ended = s.done > 0
            total = jax.tree.map(lambda t, r: jnp.where(ended, t, t + r).astype(t.dtype), total, nxt.reward)
            s = jax.tree.map(lambda a, b: jnp.where(ended, a, b), s, nxt)
            return s, total

        last, total = jax.lax.fori_loop(0, self.repeat - 1, body, (first, first.reward))
        return last.replace(reward=total)


class ResetPool(Wrapper):
    """Resets drawn from a fixed pool of ``size`` initial states.

    For envs whose ``reset`` is expensive: Playground's CheetahRun, for one,
    runs 200 physics steps to settle the body at every reset. A trainer
    resets the envs that ended on every step where any did, so with
    de-synchronized episodes (``random_initial_steps``, ``random_reset_steps``,
    early terminations) it pays for a batch of resets on most steps. This
    wrapper runs the wrapped env's ``reset`` once, for ``size`` keys drawn
    from ``seed``, when it is built (eagerly: a compilation and a batch of
    resets); after that, ``reset(key)`` returns the pool's state at an index
    drawn from ``key``: a copy, no physics.

    What changes for training: episodes start from ``size`` initial states
    instead of a fresh draw each time (Brax's auto-reset reuses one initial
    state per env). A random key the wrapped env keeps in its state (to add
    noise while stepping) is reused with its pool entry; a reset's own key
    only picks the entry. Use it on training envs; an evaluation env should
    reset freshly. ``make(spec, reset_pool=size)`` puts it under the env's
    time limit.
    """

    def __init__(self, env: RLEnv, size: int, seed: int = 0):
        super().__init__(env)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or int(size) < 1:
            raise ValueError(f"ResetPool size must be a positive int (initial states to keep), got {size!r}")
        self.size, self.seed = int(size), int(seed)
        keys = jax.random.split(jax.random.key(self.seed), self.size)
        self.pool = jax.jit(jax.vmap(env.reset))(keys)

    def reset(self, key):
        index = jax.random.randint(key, (), 0, self.size)
        return jax.tree.map(lambda x: x[index], self.pool)

    def __repr__(self):
        return f"ResetPool({self.env!r}, size={self.size}, seed={self.seed})"
