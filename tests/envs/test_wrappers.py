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


class _CountedReset(RLEnv):
    """ConstantReward-like env whose reset draws a random obs and counts its
    runs on the host (jax.debug.callback), standing in for an expensive reset."""

    calls = 0

    @property
    def observation_space(self):
        return Box((2,))

    @property
    def action_space(self):
        return Box((1,), -1, 1)

    def reset(self, key):
        jax.debug.callback(self._count)
        return EnvState(obs=jax.random.normal(key, (2,)), reward=jnp.float32(0), done=jnp.float32(0),
                        info={"truncated": jnp.float32(0)})

    @classmethod
    def _count(cls):
        cls.calls += 1

    def step(self, state, action):
        return state.replace(reward=jnp.float32(1), done=jnp.float32(0))


def test_reset_pool_draws_the_states_it_computed_once():
    """ResetPool runs the wrapped reset once per pool entry when it is built;
    every later reset is one of those states, picked by the key; make puts it
    under the time limit, whose random start steps are drawn at every reset."""
    from nnx_ppo.envs import ResetPool, make

    inner = _CountedReset()
    pool = ResetPool(inner, 8, seed=3)
    built = _CountedReset.calls
    assert built >= 1
    expected = jax.vmap(inner.reset)(jax.random.split(jax.random.key(3), 8)).obs
    np.testing.assert_array_equal(np.asarray(pool.pool.obs), np.asarray(expected))
    _CountedReset.calls = built
    keys = jax.random.split(jax.random.key(0), 256)
    drawn = np.asarray(jax.jit(jax.vmap(pool.reset))(keys).obs)
    assert _CountedReset.calls == built  # no reset of the wrapped env ran
    rows = {tuple(r) for r in drawn}
    assert rows == {tuple(r) for r in np.asarray(expected)}  # 256 draws reach all 8 entries, nothing else
    np.testing.assert_array_equal(np.asarray(pool.reset(keys[5]).obs), drawn[5])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="ResetPool size must be a positive int"):
            ResetPool(inner, bad)

    env = make("cartpole_no_velocity", reset_pool=4, random_reset_steps=50)
    assert isinstance(env, TimeLimit) and isinstance(env.env, ResetPool) and env.env.size == 4
    states = jax.vmap(env.reset)(keys)
    assert len({tuple(r) for r in np.asarray(states.obs)}) <= 4
    assert len(np.unique(np.asarray(states.info["steps"]))) > 25


def test_trainer_runs_on_a_reset_pool():
    """A training env with reset_pool trains (auto-resets inside the rollout
    draw from the pool; the replay guard of every iteration passes)."""
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_mlp_actor_critic

    env = make("cartpole_no_velocity", reset_pool=16, random_reset_steps=150)
    net = make_mlp_actor_critic(env.observation_space.shape[0], env.action_space.shape[0], rngs=nnx.Rngs(0),
                                actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=64, n_minibatches=2, total_steps=1024),
                         eval=EvalConfig(enabled=False))
    result = train_ppo(env, net, config)
    assert result.total_steps == 1024 and result.failure is None
