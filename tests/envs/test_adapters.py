"""gymnax / playground / brax adapters and make()."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nnx_ppo.envs as envs
from nnx_ppo.envs import Box, Discrete, make
from nnx_ppo.testing import check_env


def test_make_unknown_and_list():
    names = envs.list_envs()
    for n in ["cue_memory", "cartpole_no_velocity", "constant_reward", "gymnax:CartPole-v1", "gymnax:Pendulum-v1"]:
        assert n in names
    assert any(n.startswith("playground:") for n in names) and any(n.startswith("brax:") for n in names)
    with pytest.raises(ValueError, match="nope.*Available.*cue_memory"):
        make("nope")
    with pytest.raises(ValueError, match="foo:bar"):
        make("foo:bar")
    with pytest.raises(ValueError, match="gymnax:NoSuchEnv"):
        make("gymnax:NoSuchEnv")


def test_missing_optional_package_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("mujoco_playground") or name.startswith("brax"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r'pip install "nnx_ppo\[playground\]"'):
        make("playground:CartpoleBalance")
    with pytest.raises(ImportError, match=r'pip install "nnx_ppo\[brax\]"'):
        make("brax:inverted_pendulum")


def test_gymnax_cartpole_terminates_without_autoreset():
    env = make("gymnax:CartPole-v1")
    assert env.action_space == Discrete(2)
    assert env.observation_space.shape == (4,)
    check_env(env, n_steps=4)
    reset, step = jax.jit(jax.vmap(env.reset)), jax.jit(jax.vmap(env.step))
    s = reset(jax.random.split(jax.random.PRNGKey(0), 8))
    first_obs = s.obs
    # Always push left: the pole falls in well under 100 steps (a true termination).
    ended = None
    for _ in range(100):
        s = step(s, jnp.zeros(8, jnp.int32))
        if ended is None and bool(np.all(np.asarray(s.done) == 1.0)):
            ended = s
            break
        s = jax.tree_util.tree_map(lambda x: x, s)
    assert ended is not None
    np.testing.assert_array_equal(np.asarray(ended.info["truncated"]), 0.0)
    # True final obs (not a fresh reset): the pole angle is beyond the 12 degree limit or x out.
    obs = np.asarray(ended.obs)
    assert np.all((np.abs(obs[:, 2]) > 0.2094) | (np.abs(obs[:, 0]) > 2.4))
    assert not np.allclose(obs, np.asarray(first_obs))
    assert ended.reward.dtype == jnp.float32 and ended.reward.shape == (8,)


def test_gymnax_pendulum_truncates_and_rescales():
    env = make("gymnax:Pendulum-v1", episode_length=5)
    assert env.action_space == Box((1,), -1, 1)
    rep = check_env(env, n_steps=5)
    np.testing.assert_array_equal(rep.done[:-1], 0.0)
    np.testing.assert_array_equal(rep.done[-1], 1.0)
    np.testing.assert_array_equal(rep.truncated[-1], 1.0)
    # Final obs is the true last obs, not a reset obs.
    assert int(rep.last_state.data[0].time[0]) == 5
    # Action +1 maps to the max torque (2.0); out-of-range actions are clipped.
    s = env.reset(jax.random.PRNGKey(0))
    s1 = env.step(s, jnp.array([1.0]))
    assert float(s1.data[0].last_u) == pytest.approx(2.0)
    s2 = env.step(s, jnp.array([-7.0]))
    assert float(s2.data[0].last_u) == pytest.approx(-2.0)
    s3 = env.step(s, jnp.array([0.0]))
    assert float(s3.data[0].last_u) == pytest.approx(0.0)
    # The key in data advances.
    assert not np.array_equal(np.asarray(s.data[1]), np.asarray(s1.data[1]))


def test_playground_adapter():
    pytest.importorskip("mujoco_playground")
    env = make("playground:CartpoleBalance", episode_length=3)
    assert hasattr(env, "render")
    assert env.action_space.shape == (1,) and isinstance(env.observation_space, Box)
    # The adapter allows rank promotion inside MuJoCo's code itself.
    rep = check_env(env, n_envs=2, n_steps=3)
    np.testing.assert_array_equal(rep.done[-1], 1.0)
    np.testing.assert_array_equal(rep.truncated[-1], 1.0)
    np.testing.assert_array_equal(rep.done[:-1], 0.0)
    # No auto-reset: the final state is the stepped one.
    np.testing.assert_array_equal(np.asarray(rep.last_state.info["steps"]), 3)
    assert not np.allclose(np.asarray(rep.last_state.obs), np.asarray(rep.reset_state.obs))


@pytest.mark.slow  # 20 s of Brax compilation on 2 cores; `make test ARGS="-m slow"`
def test_brax_adapter():
    pytest.importorskip("brax")
    # The positional pipeline compiles fastest.
    env = make("brax:inverted_pendulum", episode_length=3, backend="positional")
    assert env.action_space == Box((1,), -1, 1)
    rep = check_env(env, n_envs=2, n_steps=3)
    np.testing.assert_array_equal(rep.done[-1], 1.0)
    np.testing.assert_array_equal(rep.truncated[-1], 1.0)
    np.testing.assert_array_equal(rep.done[:-1], 0.0)
    np.testing.assert_array_equal(np.asarray(rep.last_state.info["steps"]), 3)
    assert not np.allclose(np.asarray(rep.last_state.obs), np.asarray(rep.reset_state.obs))


def test_raw_playground_env_is_accepted_as_it_ships():
    """What the original nnx-ppo's README passes to train_ppo: a raw
    Playground env. as_env (called by the trainer) wraps it like make does."""
    pytest.importorskip("mujoco_playground")
    from flax import nnx
    from mujoco_playground import registry

    from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.envs import TimeLimit, as_env
    from nnx_ppo.envs.types import check_env_structure
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    raw = registry.load("CartpoleBalance", config_overrides={"impl": "jax"})
    env = as_env(raw)
    assert isinstance(env, TimeLimit) and env.max_steps == 1000 and as_env(env) is env
    check_env_structure(env, 2)
    net = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0), actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    state = new_training_state(raw, net, TrainConfig(ppo=PPOConfig(n_envs=2, rollout_length=2, n_minibatches=1)))
    assert state.rollout.env_state.obs.shape == (2, 5)
    with pytest.raises(TypeError, match="expected an env with this library's API"):
        as_env(object())


@pytest.mark.slow  # MuJoCo Warp compiles its kernels on first use (about 80 s on 2 cores; cached in ~/.cache/warp)
def test_playground_warp_impl_trains_with_exact_replay():
    """impl="warp" (MuJoCo Warp, on the CPU here): episodes reset inside the
    rollout, the replay reproduces it, and training runs."""
    pytest.importorskip("mujoco_playground")
    pytest.importorskip("warp")
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.networks.factories import make_actor_critic_for_env
    from nnx_ppo.testing import check_replay_consistency

    env = make("playground:CartpoleBalance", impl="warp", episode_length=12)
    network = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8)
    report = check_replay_consistency(network, env, n_envs=8, rollout_length=16)
    assert report.passed and report.n_resets > 0, report
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=16, n_minibatches=2, total_steps=256),
                         eval=EvalConfig(n_envs=2, max_episode_length=12, every_steps=256))
    result = train_ppo(env, network, config)
    assert result.total_steps == 256 and np.isfinite(result.eval_history[-1][1]["eval/episode_return"])
