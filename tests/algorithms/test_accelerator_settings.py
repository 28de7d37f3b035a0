"""The minibatch partition (whole env sequences, every env once per epoch, blocks kept apart), the replay's
scan unroll and the matrix precision: the iteration's settings for accelerators."""

import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.algorithms.ppo import minibatch_indices, split_minibatches


@pytest.mark.parametrize("n_blocks", [1, 2])
def test_each_epoch_partitions_the_envs_and_keeps_blocks_apart(n_blocks):
    T, B, n_minibatches = 3, 16, 4
    data = {"x": jnp.arange(T * B * 2, dtype=jnp.float32).reshape(T, B, 2),
            "key": jax.random.split(jax.random.key(0), (T, B))}
    index = minibatch_indices(jax.random.key(7), B, n_minibatches, n_blocks)
    assert index.shape == (n_minibatches, n_blocks, B // (n_blocks * n_minibatches))
    envs = np.concatenate([np.asarray(index[:, g]) + g * (B // n_blocks) for g in range(n_blocks)], axis=1)
    assert sorted(envs.ravel().tolist()) == list(range(B))  # every env in exactly one minibatch
    split = split_minibatches(jax.random.key(7), data, n_minibatches, n_blocks)
    assert split["x"].shape == (n_minibatches, T, B // n_minibatches, 2)
    for k in range(n_minibatches):  # whole env sequences, in the order of the index
        np.testing.assert_array_equal(np.asarray(split["x"][k]), np.asarray(data["x"][:, envs[k]]))
        np.testing.assert_array_equal(jax.random.key_data(split["key"][k]),
                                      jax.random.key_data(data["key"][:, envs[k]]))
        if n_blocks > 1:  # each block gives the same share
            assert all(len(set(envs[k]) & set(range(g * B // n_blocks, (g + 1) * B // n_blocks))) == B // 8
                       for g in range(n_blocks))


def test_replay_unroll_defaults_to_the_whole_rollout_on_an_accelerator_only():
    ppo = PPOConfig(rollout_length=20)
    assert ppo.scan_unroll("cpu") == 1 and ppo.scan_unroll("tpu") == 20 and ppo.scan_unroll("gpu") == 20
    assert PPOConfig(rollout_length=20, replay_unroll=5).scan_unroll("tpu") == 5
    # bfloat16 replays the whole network step by step: unrolled, it compiles for minutes
    assert PPOConfig(rollout_length=20, precision="bfloat16").scan_unroll("tpu") == 1
    with pytest.raises(ValueError, match="PPOConfig.replay_unroll must be a positive integer or None, got 0"):
        PPOConfig(replay_unroll=0)


def test_training_with_the_replay_unrolled_passes_the_replay_check():
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = make("cue_memory", n_cues=2, delay=3)
    net = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,))
    rows = []
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=2, total_steps=8 * 8 * 2,
                                       replay_unroll=8), eval=EvalConfig(enabled=False))
    train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m))
    assert len(rows) == 2 and max(r["replay/max_error"] for r in rows) <= 1e-5


def test_bfloat16_precision_rounds_the_matrix_inputs_only():
    from flax import nnx

    from nnx_ppo.algorithms.config import Precision
    from nnx_ppo.networks.feedforward import PRECISIONS, Dense, compute_precision, matmul
    from nnx_ppo.networks.recurrent import LSTM

    assert PRECISIONS == typing.get_args(Precision)
    x = jax.random.normal(jax.random.key(0), (4, 8))
    w = jax.random.normal(jax.random.key(1), (8, 3))
    with compute_precision("bfloat16"):
        y = matmul(x, w)
        dense = Dense(8, 3, nnx.Rngs(0))
        lstm = LSTM(8, 3, nnx.Rngs(0))
        d16 = dense((), x).output
        l16 = lstm(lstm.initialize_state(4), x).output
    rounded = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(w.astype(jnp.bfloat16), np.float64)
    assert y.dtype == jnp.float32 and d16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), rounded, rtol=1e-5, atol=1e-5)
    assert not np.allclose(np.asarray(y), np.asarray(x @ w), rtol=1e-6, atol=1e-6)  # the inputs were rounded
    np.testing.assert_allclose(np.asarray(d16), np.asarray(dense((), x).output), atol=0.05)
    np.testing.assert_allclose(np.asarray(l16), np.asarray(lstm(lstm.initialize_state(4), x).output), atol=0.05)
    assert jax.tree.leaves(nnx.state(dense, nnx.Param))[0].dtype == jnp.float32  # the parameters stay float32
    with pytest.raises(ValueError, match="PPOConfig.precision must be one of 'default', 'bfloat16', got 'fp8'"):
        PPOConfig(precision="fp8")
    with pytest.raises(ValueError, match="precision must be one of"):
        with compute_precision("half"):
            pass


def _tiny_run(compiler_options):
    """Two iterations of a small LSTM on cue_memory with ``compiler_options``: (logged rows, final parameters)."""
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = make("cue_memory", n_cues=2, delay=3)
    net = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,))
    rows = []
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=2, total_steps=8 * 8 * 2),
                         eval=EvalConfig(enabled=False), compiler_options=compiler_options)
    train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m))
    return rows, jax.tree.leaves(nnx.state(net, nnx.Param))


def test_compiler_options_reach_the_training_program_and_a_foreign_option_fails_early():
    # An option this CPU's compiler does not have (a TPU's) fails before training, naming the field;
    # had the options not reached XLA, the run would train.
    with pytest.raises(ValueError, match=r"TrainConfig.compiler_options .*xla_tpu_scoped_vmem_limit_kib.*cpu"):
        _tiny_run({"xla_tpu_scoped_vmem_limit_kib": "4096"})
    # An option the CPU has, at its default value, trains exactly as no options do.
    rows, params = _tiny_run({"xla_cpu_enable_fast_math": "False"})  # (XLA reads a bool as "True"/"False")
    rows_default, params_default = _tiny_run(None)
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert len(rows) == 2 and untimed(rows) == untimed(rows_default)
    for a, b in zip(params, params_default):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_options_the_backend_accepted_are_not_compiled_for_again():
    from nnx_ppo.algorithms.ppo import check_backend_options
    from tests.algorithms.test_driver import backend_compiles

    options = {"xla_cpu_enable_fast_math": "False", "xla_cpu_fast_math_honor_nans": "True"}
    with backend_compiles() as compiled:
        check_backend_options(options)
        check_backend_options(dict(reversed(options.items())))  # (the same options in another order)
    assert len(compiled) <= 1, compiled  # (none if an earlier test checked them already)
    for _ in range(2):  # a rejected option is checked, and refused, every time
        with pytest.raises(ValueError, match="rejects them"):
            check_backend_options({"xla_tpu_scoped_vmem_limit_kib": "4096"})


def test_compiler_options_are_checked_and_saved_with_the_config():
    from nnx_ppo.algorithms.config import TrainConfig, config_from_dict, config_to_dict, resume_changes

    with pytest.raises(ValueError, match=r"TrainConfig.compiler_options must be a dict .* got list"):
        TrainConfig(compiler_options=["xla_tpu_scoped_vmem_limit_kib=4096"])
    with pytest.raises(ValueError, match=r"TrainConfig.compiler_options\['a'\] must be a string, a number or a bool"):
        TrainConfig(compiler_options={"a": [1]})
    with pytest.raises(ValueError, match="option names must be non-empty strings, got 3"):
        TrainConfig(compiler_options={3: "x"})
    config = TrainConfig(compiler_options={"xla_tpu_scoped_vmem_limit_kib": "8192"})
    assert config_from_dict(config_to_dict(config)) == config
    # how a run compiles may change when it resumes
    assert resume_changes(config_to_dict(TrainConfig()), config) == {
        "compiler_options": [None, {"xla_tpu_scoped_vmem_limit_kib": "8192"}]}


def test_the_initial_state_is_one_program_and_draws_what_its_parts_draw():
    # new_training_state builds the envs' first states, the carry and the optimizer state in one program
    # (each extra program costs a compile, seconds on a TPU); its values are those of the separate steps:
    # the same key splits, resets, carry and optimizer init.
    from flax import nnx

    from nnx_ppo.algorithms import ppo as ppo_module
    from nnx_ppo.algorithms.config import TrainConfig
    from nnx_ppo.algorithms.functional import NetworkFn
    from nnx_ppo.envs import TimeLimit, as_env, make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = TimeLimit(as_env(make("cue_memory", n_cues=2, delay=3)), 20, random_initial_steps=True)
    net = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,))
    ppo = PPOConfig(n_envs=4, rollout_length=4, n_minibatches=1)
    states = [ppo_module.new_training_state(env, net, TrainConfig(ppo=ppo, seed=seed)) for seed in (5, 6)]

    key, reset_key, sync_key = jax.random.split(jax.random.key(5), 3)
    env_state = jax.vmap(env.reset)(jax.random.split(reset_key, 4))
    env_state = jax.vmap(env.desynchronize)(env_state, jax.random.split(sync_key, 4))
    carry, fn = NetworkFn.of(net).initialize(4)
    expected = {"key": jax.random.key_data(key), "env_state": env_state, "carry": carry, "params": fn.params,
                "opt_state": ppo_module.make_optimizer(ppo).init(fn.params)}
    got = {"key": jax.random.key_data(states[0].key), "env_state": states[0].rollout.env_state,
           "carry": states[0].rollout.carry, "params": states[0].params, "opt_state": states[0].opt_state}
    for name in expected:
        for a, b in zip(jax.tree.leaves(got[name]), jax.tree.leaves(expected[name]), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
    assert not np.array_equal(np.asarray(states[0].rollout.env_state.obs), np.asarray(states[1].rollout.env_state.obs))
    # The run's compiler options reach this program too: a foreign one fails here, naming the field.
    with pytest.raises(ValueError, match=r"TrainConfig.compiler_options .*xla_tpu_scoped_vmem_limit_kib.*cpu"):
        ppo_module.new_training_state(env, net, TrainConfig(
            ppo=ppo, compiler_options={"xla_tpu_scoped_vmem_limit_kib": "4096"}))
