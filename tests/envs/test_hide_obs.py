"""``make(spec, hide_obs=[...])``: observation entries hidden by an
ObservationMask outside every other wrapper (a control task made a memory task)."""

import jax
import numpy as np
import pytest

from nnx_ppo.envs import ObservationMask, make
from nnx_ppo.envs.registry import spec_of
from tests.xla_flags import old_emitters, run_with_fusion_emitters


def test_hide_obs_removes_the_indices_from_observations_and_space():
    """The masked env's observations are the full env's at the kept indices
    (to float32 rounding: with XLA's fusion emitters, in a process of its
    own), and its observation space says so."""
    if old_emitters():
        run_with_fusion_emitters(__file__, "test_hide_obs_removes_the_indices_from_observations_and_space")
        return
    full = make("gymnax:CartPole-v1")
    env = make("gymnax:CartPole-v1", hide_obs=[1, 3])  # velocities
    assert isinstance(env, ObservationMask)
    assert env.observation_space.shape == (2,)

    @jax.jit
    def first_two(key):
        s_full, s = full.reset(key), env.reset(key)
        return s_full.obs, s.obs, full.step(s_full, 1).obs, env.step(s, 1).obs

    full_reset, reset, full_step, step = first_two(jax.random.key(3))
    np.testing.assert_allclose(reset, full_reset[np.array([0, 2])])
    np.testing.assert_allclose(step, full_step[np.array([0, 2])])


def test_hide_obs_keeps_the_time_limit_options_and_is_remembered():
    env = make("gymnax:Pendulum-v1", hide_obs=[-1], random_initial_steps=True, random_reset_steps=10)
    assert env.observation_space.shape == (2,)
    assert hasattr(env, "desynchronize") and env.random_initial_steps and env.random_reset_steps == 10
    assert spec_of(env) == ("gymnax:Pendulum-v1",
                            {"hide_obs": [-1], "random_initial_steps": True, "random_reset_steps": 10})


@pytest.mark.parametrize("hide", [[], 1, "x", [4]])
def test_hide_obs_rejects_what_is_not_a_list_of_indices_in_range(hide):
    with pytest.raises(ValueError):
        make("gymnax:CartPole-v1", hide_obs=hide)
