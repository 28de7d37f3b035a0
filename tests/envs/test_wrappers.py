"""Wrappers: TimeLimit, RewardScale, ObservationMask, ActionRepeat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.envs import (
    ActionRepeat,
    Box,
    CartpoleNoVelocity,
    ConstantReward,
    CueMemory,
    EnvState,
    ObservationMask,
    RewardScale,
    RLEnv,
    TimeLimit,
)
from nnx_ppo.testing import check_env


class Countdown(RLEnv):
    """Dict obs; reward = step index; terminates after `n` steps."""

    def __init__(self, n=3):
        self.n = n

    @property
    def observation_space(self):
        return {"a": Box((2,)), "b": Box((3,))}

    @property
    def action_space(self):
        return Box((1,), -1, 1)

    def reset(self, key):
        del key
        return EnvState(
            obs={"a": jnp.zeros(2), "b": jnp.ones(3)},
            reward=jnp.float32(0),
            done=jnp.float32(0),
            info={"truncated": jnp.float32(0)},
            data=jnp.int32(0),
        )

    def step(self, state, action):
        t = state.data + 1
        return state.replace(
            obs={"a": jnp.full(2, t, jnp.float32), "b": jnp.ones(3)},
            reward=t.astype(jnp.float32),
            done=(t >= self.n).astype(jnp.float32),
            data=t,
        )


def run(env, n, action=None, key=0):
    s = env.reset(jax.random.PRNGKey(key))
    out = [s]
    step = jax.jit(env.step)
    a = jnp.zeros((1,)) if action is None else action
    for _ in range(n):
        s = step(s, a)
        out.append(s)
    return out


def test_time_limit_truncates():
    env = TimeLimit(ConstantReward(), 3)
    states = run(env, 3, jnp.int32(0))
    assert [int(s.info["steps"]) for s in states] == [0, 1, 2, 3]
    assert [float(s.done) for s in states] == [0, 0, 0, 1]
    assert [float(s.info["truncated"]) for s in states] == [0, 0, 0, 1]
    assert env.unwrapped.__class__ is ConstantReward
    assert env.observation_space == ConstantReward().observation_space
    check_env(env, n_steps=4)


def test_time_limit_termination_on_last_step_is_not_truncation():
    env = TimeLimit(Countdown(3), 3)
    last = run(env, 3)[-1]
    assert float(last.done) == 1.0 and float(last.info["truncated"]) == 0.0
    # Termination earlier than the limit: also not truncated.
    last = run(TimeLimit(Countdown(2), 5), 2)[-1]
    assert float(last.done) == 1.0 and float(last.info["truncated"]) == 0.0


def test_time_limit_random_initial_steps():
    env = RewardScale(TimeLimit(ConstantReward(), 50, random_initial_steps=True), 1.0)
    keys = jax.random.split(jax.random.PRNGKey(0), 64)
    fresh = jax.vmap(env.reset)(keys)
    np.testing.assert_array_equal(np.asarray(fresh.info["steps"]), 0)  # resets are always full length
    s = jax.vmap(env.desynchronize)(fresh, keys)  # forwarded through the outer wrapper
    steps = np.asarray(s.info["steps"])
    assert steps.dtype == np.int32
    assert steps.min() >= 0 and steps.max() < 50 and len(np.unique(steps)) > 10
    s = jax.vmap(env.step)(s, jnp.zeros(64, jnp.int32))
    np.testing.assert_array_equal(np.asarray(s.info["truncated"]), (steps + 1 >= 50).astype(np.float32))
    plain = TimeLimit(ConstantReward(), 50)
    same = jax.vmap(plain.desynchronize)(jax.vmap(plain.reset)(keys), keys)
    np.testing.assert_array_equal(np.asarray(same.info["steps"]), 0)


def test_time_limit_random_reset_steps_on_every_reset():
    env = TimeLimit(ConstantReward(), 50, random_reset_steps=25)
    keys = jax.random.split(jax.random.PRNGKey(1), 256)
    steps = np.asarray(jax.vmap(env.reset)(keys).info["steps"])
    assert steps.dtype == np.int32
    assert steps.min() >= 0 and steps.max() < 25 and len(np.unique(steps)) > 15
    # Each reset draws anew: the same env's next episodes start elsewhere too.
    again = np.asarray(jax.vmap(env.reset)(jax.random.split(jax.random.PRNGKey(2), 256)).info["steps"])
    assert not np.array_equal(steps, again)
    s = jax.vmap(env.step)(jax.vmap(env.reset)(keys), jnp.zeros(256, jnp.int32))
    np.testing.assert_array_equal(np.asarray(s.info["truncated"]), (steps + 1 >= 50).astype(np.float32))
    with pytest.raises(ValueError, match="random_reset_steps"):
        TimeLimit(ConstantReward(), 10, random_reset_steps=11)


def test_reward_scale():
    env = RewardScale(Countdown(5), 0.5)
    states = run(env, 3)
    assert [float(s.reward) for s in states] == [0, 0.5, 1.0, 1.5]
    assert states[-1].reward.dtype == jnp.float32


def test_observation_mask_dict_and_flat():
    env = ObservationMask(Countdown(), ["b"])
    assert set(env.observation_space) == {"a"}
    states = run(env, 2)
    assert set(states[-1].obs) == {"a"}
    check_env(env, n_steps=3)

    flat = ObservationMask(CartpoleNoVelocity(full_observation=True), [1, 3])
    assert flat.observation_space.shape == (2,)
    s = flat.reset(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(np.asarray(s.obs), np.asarray(s.data)[[0, 2]])
    np.testing.assert_allclose(flat.observation_space.low, [-4.8, -0.41887902], rtol=1e-6)
    check_env(flat, n_steps=3)
    with pytest.raises(ValueError, match="not in observation keys"):
        ObservationMask(Countdown(), ["zzz"])


def test_action_repeat_sums_and_stops_at_done():
    env = ActionRepeat(Countdown(5), 2)
    states = run(env, 3)
    # steps (1+2), (3+4), then only 5 (done at 5, no further repeat).
    assert [float(s.reward) for s in states[1:]] == [3.0, 7.0, 5.0]
    assert int(states[-1].data) == 5 and float(states[-1].done) == 1.0
    check_env(ActionRepeat(CueMemory(), 3), n_steps=3)


def test_wrappers_forward_render_and_unwrapped():
    env = RewardScale(TimeLimit(CueMemory(), 10), 2.0)
    assert isinstance(env.unwrapped, CueMemory)
    assert env.action_space == CueMemory().action_space
    with pytest.raises(NotImplementedError, match="does not support rendering"):
        env.render([])
