"""check_env passes on shipped envs and names the field of each planted mistake."""

import jax
import jax.numpy as jnp
import pytest

from nnx_ppo.envs import Box, Discrete, EnvState, RLEnv, make
from nnx_ppo.testing import EnvCheckError, check_env


@pytest.mark.parametrize(
    "spec,kwargs",
    [
        ("cue_memory", {}),
        ("cartpole_no_velocity", {"episode_length": 5}),
        ("constant_reward", {"episode_length": 3}),
        ("gymnax:CartPole-v1", {}),
        ("gymnax:Pendulum-v1", {"episode_length": 4}),
    ],
)
def test_check_env_passes_on_shipped_envs(spec, kwargs):
    rep = check_env(make(spec, **kwargs), n_envs=3, n_steps=6)
    assert rep.done.shape == (6, 3)
# Playground and Brax envs are checked in test_adapters.py (slow to compile, done once).


class Good(RLEnv):
    """A correct stochastic env: dict obs, key in data that advances each step."""

    @property
    def observation_space(self):
        return {"pos": Box((2,)), "vel": Box((1,))}

    @property
    def action_space(self):
        return Discrete(3)

    def obs(self, key):
        return {"pos": jax.random.normal(key, (2,)), "vel": jnp.zeros((1,))}

    def reset(self, key):
        return EnvState(
            obs=self.obs(key),
            reward=jnp.float32(0),
            done=jnp.float32(0),
            metrics={"m": jnp.float32(0)},
            info={"truncated": jnp.float32(0)},
            data={"key": key},
        )

    def step(self, state, action):
        key, sub = jax.random.split(state.data["key"])
        return state.replace(obs=self.obs(sub), reward=jnp.float32(1), data={"key": key})


def test_good_env_passes():
    check_env(Good())


def broken(step_fix=None, reset_fix=None):
    class Broken(Good):
        def reset(self, key):
            s = super().reset(key)
            return reset_fix(s) if reset_fix else s

        def step(self, state, action):
            s = super().step(state, action)
            return step_fix(s, state) if step_fix else s

    return Broken()


@pytest.mark.parametrize(
    "env,pattern",
    [
        # obs shape differs between reset and step
        (broken(step_fix=lambda s, _: s.replace(obs={**s.obs, "vel": jnp.zeros((2,))})), r"obs\['vel'\]"),
        # obs dtype differs between reset and step
        (
            broken(step_fix=lambda s, _: s.replace(obs={**s.obs, "pos": s.obs["pos"].astype(jnp.int32)})),
            r"obs\['pos'\].*dtype",
        ),
        # obs does not match observation_space
        (
            broken(
                step_fix=lambda s, _: s.replace(obs={**s.obs, "vel": jnp.zeros((3,))}),
                reset_fix=lambda s: s.replace(obs={**s.obs, "vel": jnp.zeros((3,))}),
            ),
            r"obs\['vel'\].*observation_space",
        ),
        # reward not a scalar
        (broken(step_fix=lambda s, _: s.replace(reward=jnp.ones((2,)))), r"reward"),
        # reward wrong dtype (in both reset and step)
        (
            broken(
                step_fix=lambda s, _: s.replace(reward=jnp.int32(1)),
                reset_fix=lambda s: s.replace(reward=jnp.int32(0)),
            ),
            r"reward: dtype must be float32",
        ),
        # done is a bool
        (
            broken(
                step_fix=lambda s, _: s.replace(done=jnp.bool_(False)),
                reset_fix=lambda s: s.replace(done=jnp.bool_(False)),
            ),
            r"done: dtype must be float32",
        ),
        # done not scalar
        (broken(step_fix=lambda s, _: s.replace(done=jnp.zeros((1,)))), r"done"),
        # missing info["truncated"]
        (
            broken(step_fix=lambda s, _: s.replace(info={}), reset_fix=lambda s: s.replace(info={})),
            r"info\[\"truncated\"\]",
        ),
        # step adds an info key that reset lacks
        (broken(step_fix=lambda s, _: s.replace(info={**s.info, "extra": jnp.float32(0)})), r"extra"),
        # step drops a metric
        (broken(step_fix=lambda s, _: s.replace(metrics={})), r"metrics\['m'\]"),
        # key never advances
        (broken(step_fix=lambda s, old: s.replace(data=old.data)), r"data\['key'\].*never changes"),
        # NaN in obs
        (broken(step_fix=lambda s, _: s.replace(obs={**s.obs, "vel": jnp.full((1,), jnp.nan)})), r"obs\['vel'\].*NaN"),
        # inf reward
        (broken(step_fix=lambda s, _: s.replace(reward=jnp.float32(jnp.inf))), r"reward.*NaN or inf"),
        # truncated without done
        (broken(step_fix=lambda s, _: s.replace(info={"truncated": jnp.float32(1)})), r"truncated.*implies done"),
    ],
)
def test_planted_mistakes_are_named(env, pattern):
    with pytest.raises(EnvCheckError, match=pattern):
        check_env(env, n_envs=2, n_steps=2)


def test_typed_key_that_never_changes():
    class TypedKeyEnv(Good):
        def reset(self, key):
            return super().reset(key).replace(info={"truncated": jnp.float32(0), "rng": jax.random.key(0)})

        def step(self, state, action):
            return super().step(state, action).replace(info=state.info)

    with pytest.raises(EnvCheckError, match=r"info\['rng'\]"):
        check_env(TypedKeyEnv(), n_envs=2, n_steps=2)
    # Opting out is possible for keys only used at reset.
    check_env(TypedKeyEnv(), n_envs=2, n_steps=2, check_keys=False)


def test_env_check_error_is_value_error():
    assert issubclass(EnvCheckError, ValueError)
