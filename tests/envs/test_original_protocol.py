"""Envs written for the original nnx-ppo train here unchanged (as_env adapts
them with a one-line note); dict actions and dict rewards train through the
adapters; a non-scalar regularization_loss is a named error.

The envs below are small stand-ins with the shapes of the original's test
dummies: the same protocol (``reset(rng)`` / ``step(state, action)``, a state
with ``obs``, ``reward``, ``done``, ``info``, ``metrics`` and no
``info["truncated"]``) and the same observation / action / reward structure.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import Box, EnvState, TimeLimit, as_env
from nnx_ppo.envs.adapters import EnvAdaptedWarning, OriginalEnv, PlaygroundEnv
from nnx_ppo.envs.types import EnvCheckError, check_env_structure
from nnx_ppo.networks.adapter import PPOAdapter
from nnx_ppo.networks.containers import Parallel, Sequential, Splitter
from nnx_ppo.networks.factories import make_actor_critic_for_env, make_mlp_actor_critic
from nnx_ppo.networks.feedforward import Dense
from nnx_ppo.networks.recurrent import LSTM
from nnx_ppo.networks.sampling_layers import NormalTanhSampler
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.networks.utils import Flattener, Map
from nnx_ppo.testing import check_env

NOTE = r"original nnx-ppo's env protocol; adapted with OriginalEnv"


@struct.dataclass
class PlaygroundLikeState:
    """A state with the fields of ``mujoco_playground.State``."""

    data: Any
    obs: Any
    reward: Any
    done: Any
    metrics: dict
    info: dict


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PlainState:
    """A frozen-dataclass state, the other kind the original's dummies use."""

    obs: Any
    reward: Any
    done: Any
    info: dict
    metrics: dict
    step_count: Any = None


class Walk2D:
    """A point in the plane moved by ``action`` (clipped to [-1, 1]); the
    episode ends past ``radius``. ``toward=True`` rewards being near the
    origin (shaped like MoveToCenterEnv), ``False`` penalizes it (MoveFromCenterEnv)."""

    def __init__(self, toward=True, radius=2.0):
        self.toward, self.radius = toward, radius

    @property
    def observation_size(self):
        return 2

    @property
    def action_size(self):
        return 2

    def reset(self, rng):
        angle, r = jax.random.uniform(rng, (2,))
        r = r * 0.9 * self.radius
        return self._state(jnp.stack([r * jnp.cos(2 * jnp.pi * angle), r * jnp.sin(2 * jnp.pi * angle)]))

    def step(self, state, action):
        return self._state(state.data["pos"] + jnp.clip(action, -1, 1))

    def _state(self, pos):
        dist = jnp.linalg.norm(pos)
        reward = jnp.exp(-2 * dist**2) if self.toward else dist / self.radius - 1.0
        return PlaygroundLikeState(data={"pos": pos}, obs=pos / 10.0, reward=reward,
                                   done=jnp.where(dist > self.radius, 1.0, 0.0), metrics={}, info={})


class Echo:
    """Reward for repeating the last observation (shaped like ParrotEnv):
    tuple sizes, a key in ``data``, never ends."""

    def __init__(self, shape=(3,)):
        self.shape = shape

    @property
    def observation_size(self):
        return self.shape

    @property
    def action_size(self):
        return self.shape

    def reset(self, rng):
        return self._state(rng, jnp.array(0.0))

    def step(self, state, action):
        return self._state(state.data["key"], jnp.exp(-jnp.sum((action - state.obs) ** 2)))

    def _state(self, key, reward):
        key, sub = jax.random.split(key)
        return PlaygroundLikeState(data={"key": key}, obs=jnp.tanh(jax.random.normal(sub, self.shape)),
                                   reward=reward, done=jnp.array(0.0), metrics={}, info={})


class CountSteps:
    """Reward 1 when the action equals the number of steps since the reset
    (shaped like DummyCounterEnv): no sizes, a Python int in ``info`` at
    reset, reward 1 at reset, ends at a random step in [3, 10)."""

    def reset(self, rng):
        return PlaygroundLikeState(data={"step": jnp.array(0), "end": jax.random.randint(rng, (), 3, 10)},
                                   obs=jnp.zeros(1), reward=jnp.array(1.0), done=jnp.array(0.0), metrics={},
                                   info={"step": 0})

    def step(self, state, action):
        step = state.data["step"] + 1
        return PlaygroundLikeState(data={"step": step, "end": state.data["end"]}, obs=jnp.zeros(1),
                                   reward=jnp.where(jnp.squeeze(action) == step, 1.0, 0.0),
                                   done=(step >= state.data["end"]).astype(float), metrics=state.metrics,
                                   info={"step": step})


class NoiseForSteps:
    """Noise observations, ends after ``max_steps`` (shaped like MockEnv):
    int sizes as instance attributes, a bool ``done``, a counter field."""

    def __init__(self, obs_size=3, action_size=2, max_steps=5):
        self.observation_size, self.action_size, self.max_steps = obs_size, action_size, max_steps

    def reset(self, rng):
        return PlainState(obs=jax.random.normal(rng, (self.observation_size,)), reward=jnp.array(0.0),
                          done=jnp.array(False), info={}, metrics={}, step_count=jnp.array(0))

    def step(self, state, action):
        count = state.step_count + 1
        obs = jax.random.normal(jax.random.PRNGKey(count), (self.observation_size,))
        return PlainState(obs=obs, reward=jnp.array(1.0), done=count >= self.max_steps, info={}, metrics={},
                          step_count=count)


class DictPoint:
    """Dict observations ``{"pos", "vel"}`` and a dict action ``{"force"}``
    (shaped like DictObsActEnv); no sizes; ends past distance 3."""

    def reset(self, rng):
        return self._state(jax.random.uniform(rng, (2,), minval=-1.0, maxval=1.0), jnp.zeros(2))

    def step(self, state, action):
        vel = state.obs["vel"] + 0.1 * action["force"]
        return self._state(state.obs["pos"] + vel, vel)

    def _state(self, pos, vel):
        dist = jnp.linalg.norm(pos)
        return PlainState(obs={"pos": pos, "vel": vel}, reward=jnp.exp(-dist), done=(dist > 3.0).astype(float),
                          info={}, metrics={})


class TwoArms:
    """Two arms, each its own entry of the observation, action and reward
    dicts (shaped like TwoArmEnv); a bool ``done``; ``sizes=True`` declares
    dict ``observation_size`` / ``action_size``."""

    def __init__(self, sizes=False):
        if sizes:
            self.observation_size = {arm: {"pos": 2, "vel": 2} for arm in ("arm1", "arm2")}
            self.action_size = {"arm1": 2, "arm2": 2}

    def reset(self, rng):
        k1, k2 = jax.random.split(rng)
        pos = {"arm1": jax.random.uniform(k1, (2,), minval=-1.0, maxval=1.0),
               "arm2": jax.random.uniform(k2, (2,), minval=-1.0, maxval=1.0)}
        return self._state(pos, {"arm1": jnp.zeros(2), "arm2": jnp.zeros(2)})

    def step(self, state, action):
        vel = {arm: state.obs[arm]["vel"] + 0.1 * action[arm] for arm in action}
        return self._state({arm: state.obs[arm]["pos"] + 0.1 * vel[arm] for arm in vel}, vel)

    def _state(self, pos, vel):
        dist = {arm: jnp.linalg.norm(p) for arm, p in pos.items()}
        return PlainState(obs={arm: {"pos": pos[arm], "vel": vel[arm]} for arm in pos},
                          reward={arm: jnp.exp(-d) for arm, d in dist.items()},
                          done=jnp.logical_or(dist["arm1"] > 3.0, dist["arm2"] > 3.0), info={}, metrics={})


def _config(**ppo):
    # replay_tolerance: the replay guard, on (its default) and explicit here
    return TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=2,
                                     replay_tolerance=1e-3, **ppo),
                       eval=EvalConfig(enabled=False))


def _dict_action_net(obs_width, keys, value_keys=None):
    """Flatten the (dict) observation; one tanh-Gaussian head per action key
    (2 dims each); one value head, or one per reward key."""
    rngs = nnx.Rngs(0)
    policy = Sequential(Dense(obs_width, 4 * len(keys), rngs, init_scale=0.01), Splitter(**{k: 4 for k in keys}),
                        Map(**{k: NormalTanhSampler(rngs, entropy_weight=1e-3) for k in keys}))
    value = Dense(obs_width, 1, rngs) if value_keys is None else Parallel(
        **{k: Dense(obs_width, 1, rngs) for k in value_keys})
    return Sequential(Flattener(), PPOAdapter(action=policy, value=value))


def _sized_net(env):
    with pytest.warns(EnvAdaptedWarning, match=NOTE):
        adapted = as_env(env)
    return make_actor_critic_for_env(adapted, "mlp", nnx.Rngs(0), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))


ORIGINAL_ENVS = {
    "move_to_center": (lambda: Walk2D(toward=True), _sized_net, "from observation_size"),
    "move_from_center": (lambda: Walk2D(toward=False), _sized_net, "from observation_size"),
    "parrot": (Echo, _sized_net, "from observation_size"),
    "mock": (NoiseForSteps, _sized_net, "from observation_size"),
    "dummy_counter": (CountSteps, lambda env: make_mlp_actor_critic(1, 1, (8,), (8,), nnx.Rngs(0)),
                      "from the reset observation"),
    "dict_obs_act": (DictPoint, lambda env: _dict_action_net(4, ["force"]), "no action_size"),
    "two_arm": (TwoArms, lambda env: _dict_action_net(8, ["arm1", "arm2"], value_keys=["arm1", "arm2"]),
                "no action_size"),
}


_QUICK = ("move_to_center", "dummy_counter", "two_arm")  # one per way the spaces are found; the rest: -m slow


@pytest.mark.parametrize("name", [n if n in _QUICK else pytest.param(n, marks=pytest.mark.slow) for n in ORIGINAL_ENVS])
def test_original_env_trains_unchanged_with_a_note(name):
    make_env, make_net, how = ORIGINAL_ENVS[name]
    env = make_env()
    rows = []
    with pytest.warns(EnvAdaptedWarning, match=NOTE) as notes:
        result = train_ppo(env, make_net(env), _config(), log_fn=lambda m, s: rows.append(m))
    note = str(notes[0].message)
    assert "\n" not in note and how in note and "every done is a termination" in note
    assert result.total_steps == 32 and len(rows) == 2
    for row in rows:  # the replay guard (replay_tolerance, on by default) passed every iteration
        assert np.isfinite(row["loss/total"]) and row["replay/max_error"] < 1e-3


def test_adapted_spaces_and_state():
    with pytest.warns(EnvAdaptedWarning):
        echo, counter, arms = as_env(Echo((2, 3))), as_env(CountSteps()), as_env(TwoArms(sizes=True))
    assert isinstance(echo, OriginalEnv) and echo.observation_space == Box((2, 3))
    assert echo.action_space == Box((2, 3), -1, 1)
    assert counter.observation_space == Box((1,))
    with pytest.raises(AttributeError, match="CountSteps .* has no action_size"):
        counter.action_space  # noqa: B018
    assert arms.action_space == {"arm1": Box((2,), -1, 1), "arm2": Box((2,), -1, 1)}
    assert arms.observation_space["arm2"]["vel"] == Box((2,))
    report = check_env(arms, n_envs=2, n_steps=3)  # dict obs, actions and rewards pass the env check
    assert set(report.last_state.reward) == {"arm1", "arm2"}
    with pytest.warns(EnvAdaptedWarning, match=NOTE):  # check_env adapts as training does
        assert check_env(NoiseForSteps(max_steps=2), n_envs=2, n_steps=2).done[-1].tolist() == [1.0, 1.0]
    state = counter.reset(jax.random.key(0))
    assert isinstance(state, EnvState) and state.done.dtype == jnp.float32
    assert float(state.info["truncated"]) == 0.0 and not state.data.info["step"].weak_type
    # An env of this library's API (an EnvState) is not adapted, even one missing info["truncated"].
    plain = NoiseForSteps()
    plain.reset = lambda key: EnvState(obs=jnp.zeros(3), reward=jnp.float32(0), done=jnp.float32(0))
    assert as_env(plain) is plain
    with pytest.raises(EnvCheckError, match="is adapted by nnx_ppo.envs.as_env"):  # checked without as_env
        check_env_structure(Walk2D(), 2)


class EpisodeLimit:
    """The original's episode wrapper, in short: ``info["truncated"]`` is
    Python ``False`` at reset and set (with ``done``) at the step limit."""

    def __init__(self, env, max_len):
        self.env, self.max_len = env, max_len
        self.observation_size, self.action_size = env.observation_size, env.action_size

    def reset(self, rng):
        state = self.env.reset(rng)
        return state.replace(info={**state.info, "counter": jnp.array(0), "truncated": False})

    def step(self, state, action):
        nxt = self.env.step(state, action)
        counter = state.info["counter"] + 1
        truncated = counter >= self.max_len
        return nxt.replace(done=jnp.logical_or(nxt.done, truncated).astype(float),
                           info={**nxt.info, "counter": counter, "truncated": truncated})


def test_original_truncated_flag_is_read_and_a_time_limit_can_be_added():
    with pytest.warns(EnvAdaptedWarning, match="info\\['truncated'\\] read from the env"):
        env = as_env(EpisodeLimit(Echo(), max_len=3))
    report = check_env(env, n_envs=2, n_steps=3)
    np.testing.assert_array_equal(report.truncated[:, 0], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(report.done[:, 0], [0.0, 0.0, 1.0])
    with pytest.warns(EnvAdaptedWarning):
        limited = as_env(Echo(), episode_length=2)
    assert isinstance(limited, TimeLimit) and isinstance(limited.env, OriginalEnv)
    np.testing.assert_array_equal(check_env(limited, n_envs=2, n_steps=2).truncated[:, 0], [0.0, 1.0])


def test_dict_action_env_trains_through_the_playground_adapter():
    """PlaygroundEnv takes dict observation and action sizes: dict actions
    (one Box each), dict rewards with one value head per key."""
    env = PlaygroundEnv(TwoArms(sizes=True), "two_arms")
    assert env.action_space == {"arm1": Box((2,), -1, 1), "arm2": Box((2,), -1, 1)}
    check_env(env, n_envs=2, n_steps=2)
    net = _dict_action_net(8, ["arm1", "arm2"], value_keys=["arm1", "arm2"])
    rows = []
    train_ppo(env, net, _config(), log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 2 and all(np.isfinite(r["loss/total"]) for r in rows)


def test_dict_reward_env_trains_with_combine_advantages():
    rows = []
    net = _dict_action_net(8, ["arm1", "arm2"], value_keys=["arm1", "arm2"])
    with pytest.warns(EnvAdaptedWarning):
        train_ppo(TwoArms(), net, _config(combine_advantages=True), log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 2 and all(np.isfinite(r["loss/total"]) and r["replay/max_error"] < 1e-3 for r in rows)


class PerEnvPenalty(StatefulModule):
    """Passes its input through with a per-env ``[B]`` regularization_loss (the mistake)."""

    def __call__(self, state, x, rollout_extras=None):
        return StatefulModuleOutput(next_state=state, output=x, regularization_loss=jnp.sum(x**2, axis=-1),
                                    metrics={}, rollout_extras=None)

    def initialize_state(self, batch_size):
        return ()


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_non_scalar_regularization_loss_names_the_module(core):
    """Named when the loss is traced, whether the replay is flat (MLP) or a
    scan over time (LSTM, which would otherwise average the [B] term)."""
    rngs = nnx.Rngs(0)
    first = Dense(2, 8, rngs) if core == "mlp" else LSTM(2, 8, rngs)
    policy = Sequential(first, PerEnvPenalty(), Dense(8, 4, rngs), NormalTanhSampler(rngs, entropy_weight=1e-3))
    net = PPOAdapter(action=policy, value=Dense(2, 1, rngs))
    with pytest.warns(EnvAdaptedWarning), pytest.raises(
        ValueError, match=r"^module components/action/layers/1 \(\S*PerEnvPenalty\) returns a regularization_loss "
                          r"of shape \(2,\); regularization_loss must be a scalar"):
        train_ppo(Walk2D(), net, _config())


def test_gymnax_dict_action_space_gives_dict_actions():
    """A gymnax env whose action space is a Dict (a Box and a Discrete) gets dict actions, each rescaled or
    cast as its own space says."""
    from gymnax.environments import environment, spaces

    from nnx_ppo.envs.adapters import GymnaxEnv
    from nnx_ppo.envs.spaces import Discrete

    @struct.dataclass
    class ArmState(environment.EnvState):
        pos: jax.Array

    class Gripper(environment.Environment):
        @property
        def default_params(self):
            return environment.EnvParams(max_steps_in_episode=3)

        def reset_env(self, key, params):
            state = ArmState(time=0, pos=jnp.zeros(2))
            return state.pos, state

        def step_env(self, key, state, action, params):
            pos = state.pos + action["move"] * action["grip"]
            state = ArmState(time=state.time + 1, pos=pos)
            return state.pos, state, -jnp.sum(pos**2), jnp.array(False), {}

        def action_space(self, params=None):
            return spaces.Dict({"move": spaces.Box(-2.0, 2.0, (2,)), "grip": spaces.Discrete(2)})

        def observation_space(self, params):
            return spaces.Box(-jnp.inf, jnp.inf, (2,))

    env = GymnaxEnv(Gripper())
    assert env.action_space == {"move": Box((2,), -1, 1), "grip": Discrete(2)}
    report = check_env(env, n_envs=2, n_steps=3)
    np.testing.assert_array_equal(report.truncated[-1], 1.0)
    state = env.step(env.reset(jax.random.key(0)), {"move": jnp.array([1.0, -0.5]), "grip": jnp.array(1)})
    np.testing.assert_allclose(np.asarray(state.obs), [2.0, -1.0])  # [-1, 1] rescaled to the Box's [-2, 2]
