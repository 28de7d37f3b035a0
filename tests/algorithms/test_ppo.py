"""PPO end to end on toy envs: value learning, bad input, learning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import NonFiniteError, over_seeds
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks.factories import make_mlp_actor_critic
from tests.algorithms.toy_envs import Constant, Target
from tests.xla_flags import old_emitters, run_with_fusion_emitters


def test_constant_reward_value_with_truncation_bootstrap():
    """Reward 1, no termination, 8-step time limit, gamma 0.98: with
    bootstrapping on truncation, V = 1 / (1 - 0.98) = 50 everywhere."""
    env = Constant(max_steps=8)
    net = make_mlp_actor_critic(2, 1, (16,), (32, 32), nnx.Rngs(0), normalize_obs=False)
    config = TrainConfig(
        ppo=PPOConfig(n_envs=16, rollout_length=16, total_steps=16 * 16 * 400, discounting_factor=0.98,
                      learning_rate=3e-3, normalize_advantages=True, n_minibatches=2, gradient_clipping=None),
        eval=EvalConfig(enabled=False),
        iterations_per_call=50,
    )
    train_ppo(env, net, config)
    state = env.reset(jax.random.key(0))
    obs = state.obs[None]
    out = net(net.initialize_state(1), obs)
    value = float(out.output.value_estimates[0])
    assert abs(value - 50.0) <= 5.0, value


def test_bad_config_errors_name_the_argument():
    with pytest.raises(ValueError, match="n_envs .* divisible by n_minibatches"):
        PPOConfig(n_envs=10, n_minibatches=4)
    with pytest.raises(ValueError, match="rollout_length"):
        PPOConfig(rollout_length=0)
    with pytest.raises(ValueError, match="n_envs"):
        PPOConfig(n_envs=-4, n_minibatches=1)
    with pytest.raises(ValueError, match="TrainConfig.seed_batching must be one of 'vmap', 'map', got 'loop'"):
        TrainConfig(seed_batching="loop")
    with pytest.raises(ValueError, match="^seed_batching must be one of 'vmap', 'map', got 'loop'"):
        over_seeds(lambda state: state, "loop")  # public: compile_iterations and make_train_fn pass it on
    with pytest.raises(TypeError, match="'log_fm'.* takes log_fn, eval_env"):
        train_ppo(Target(), make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)), TrainConfig(), log_fm=print)
    from nnx_ppo.algorithms.trainer import PPO, train

    with pytest.raises(ValueError, match="give a network .* or make_network and seeds"):
        train(PPO, Target(), TrainConfig(), seeds=[0])


def test_value_structure_mismatch_is_reported():
    class DictReward(Target):
        def reset(self, key):
            s = super().reset(key)
            return dataclasses.replace(s, reward={"a": s.reward, "b": s.reward})

        def step(self, state, action):
            s = super().step(dataclasses.replace(state, reward=state.reward["a"]), action)
            return dataclasses.replace(s, reward={"a": s.reward, "b": s.reward})

    env = DictReward()
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=16, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    with pytest.raises(ValueError, match="value_estimates .* rewards"):
        train_ppo(env, net, config)


class NaNAfter(Target):
    """Rewards turn NaN from the 3rd step of an episode on."""

    def step(self, state, action):
        s = super().step(state, action)
        return dataclasses.replace(s, reward=jnp.where(s.info["steps"] >= 3, jnp.nan, s.reward))


def test_nan_reward_raises_at_that_iteration():
    env = NaNAfter(max_steps=50, p_end=0.0)
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=40, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    with pytest.raises(NonFiniteError, match="rewards at iteration 2"):
        train_ppo(env, net, config)


def test_log_fn_gets_flat_metrics():
    env = Target()
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    rows = []
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2),
                         eval=EvalConfig(every_steps=32, n_envs=2, max_episode_length=8))
    train_ppo(env, net, config, log_fn=lambda m, s: rows.append((s, m)))
    train_rows = [m for _, m in rows if "loss/total" in m]
    assert len(train_rows) == 2
    keys = set(train_rows[0])
    for key in ("loss/policy", "loss/value", "policy/approx_kl", "policy/clip_fraction",
                "value/explained_variance", "optimizer/grad_norm", "train/episode_return",
                "time/steps_per_second"):
        assert key in keys, (key, sorted(keys))
    assert any(k.startswith("network/") and k.endswith("/entropy") for k in keys), sorted(keys)
    assert all(isinstance(v, float) for v in train_rows[0].values())
    assert any("eval/episode_return" in m for _, m in rows)


def test_advantage_normalization_is_safe_for_one_element():
    from nnx_ppo.algorithms.ppo import normalize_advantages

    single = normalize_advantages(jnp.array([[3.0]]))
    assert jnp.all(jnp.isfinite(single)) and float(single[0, 0]) == 0.0
    constant = normalize_advantages(jnp.full((4, 2), 7.0))
    assert jnp.all(constant == 0.0)


def test_single_env_minibatches_train_without_nan():
    env = Target(max_steps=3)
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=2, rollout_length=1, total_steps=8, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    result = train_ppo(env, net, config)
    assert np.isfinite(result.metrics["loss/total"])


def test_dict_rewards_get_per_key_values():
    class TwoRewards(Target):
        def reset(self, key):
            s = super().reset(key)
            return dataclasses.replace(s, reward={"task": s.reward, "effort": s.reward})

        def step(self, state, action):
            s = super().step(dataclasses.replace(state, reward=state.reward["task"]), action)
            return dataclasses.replace(s, reward={"task": s.reward, "effort": -jnp.sum(action**2)})

    env = TwoRewards(max_steps=4)
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0), value_keys=("task", "effort"))
    rows = []
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m))
    assert all(np.isfinite(r["loss/total"]) for r in rows)
    out = net(net.initialize_state(2), jnp.zeros((2, 3)))
    assert set(out.output.value_estimates) == {"task", "effort"}


def test_nan_observation_raises():
    class NaNObs(Target):
        def step(self, state, action):
            s = super().step(state, action)
            return dataclasses.replace(s, obs=s.obs.at[0].set(jnp.nan))

    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=8, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    with pytest.raises(NonFiniteError, match="observations at iteration 1"):
        train_ppo(NaNObs(), net, config)


def test_env_with_wrong_reward_shape_is_named_before_training():
    from nnx_ppo.testing import EnvCheckError

    class VectorReward(Target):
        def step(self, state, action):
            s = super().step(state, action)
            return dataclasses.replace(s, reward=jnp.stack([s.reward, s.reward]))

    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=8, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    with pytest.raises(EnvCheckError, match="reward"):
        train_ppo(VectorReward(), net, config)


def test_env_without_truncated_flag_is_named():
    from nnx_ppo.testing import EnvCheckError

    class NoTruncated(Target):
        def reset(self, key):
            s = super().reset(key)
            return dataclasses.replace(s, info={"steps": s.info["steps"]})

    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=8, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    with pytest.raises(EnvCheckError, match="truncated"):
        train_ppo(NoTruncated(), net, config)


def test_failed_training_leaves_a_usable_network():
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    # (test_log_fn_gets_flat_metrics's training program: compiled once for both)
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    seen = []

    def log_fn(metrics, step):
        seen.append(step)
        if len(seen) == 2:
            raise RuntimeError("logger failed")

    with pytest.raises(RuntimeError, match="logger failed"):
        train_ppo(Target(), net, config, log_fn=log_fn)
    out = net(net.initialize_state(2), jnp.zeros((2, 3)))  # arrays not donated away
    assert np.all(np.isfinite(np.asarray(out.output.value_estimates)))


def test_new_training_state_leaves_the_network_alone_and_marks_fresh_carries():
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.networks import GaussianNoise, Sequential

    rngs = nnx.Rngs(0)
    net = Sequential([GaussianNoise(0.1, rngs), make_mlp_actor_critic(3, 2, (8,), (8,), rngs)])
    as_numpy = lambda x: np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
    before = jax.tree.map(as_numpy, nnx.state(net, nnx.RngState))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=16, n_minibatches=2))
    state = new_training_state(Target(), net, config)
    after = jax.tree.map(as_numpy, nnx.state(net, nnx.RngState))
    jax.tree.map(np.testing.assert_array_equal, before, after)
    assert bool(jnp.all(state.rollout.fresh))


def test_time_limit_desynchronized_only_at_the_start():
    from nnx_ppo.algorithms.ppo import new_training_state
    from nnx_ppo.envs import ConstantReward, TimeLimit

    env = TimeLimit(ConstantReward(), 50, random_initial_steps=True)
    net = make_mlp_actor_critic(2, 2, (8,), (8,), nnx.Rngs(0), discrete=True)
    config = TrainConfig(ppo=PPOConfig(n_envs=16, rollout_length=4, total_steps=64, n_minibatches=2))
    steps = np.asarray(new_training_state(env, net, config).rollout.env_state.info["steps"])
    assert len(np.unique(steps)) > 5


def test_evaluate_respects_the_mode_it_is_asked_for():
    from nnx_ppo.algorithms.evaluation import evaluate

    env = Target(max_steps=5, p_end=0.0)
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    net.eval()
    deterministic = [evaluate(env, net, n_envs=8, max_episode_length=5, seed=s)["eval/episode_return"] for s in (0, 0)]
    stochastic = evaluate(env, net, n_envs=8, max_episode_length=5, seed=0, deterministic=False)
    assert deterministic[0] == deterministic[1]
    assert stochastic["eval/episode_return"] != deterministic[0]
    assert net.layers[-1].action.layers[-1].deterministic  # still in eval mode


def test_recomputed_advantages_equal_the_rollouts_before_the_first_update():
    """With recompute_advantages the minibatch GAE uses the replayed values;
    before any update those equal the rollout's (an LSTM, resets and
    truncations inside the rollout), so loss and gradient are the same."""
    from nnx_ppo.algorithms.functional import NetworkFn
    from nnx_ppo.algorithms.ppo import Minibatch, collect_rollout, new_training_state, ppo_loss, trajectory_gae
    from nnx_ppo.networks.factories import make_recurrent_actor_critic

    env = Target(max_steps=5, p_end=0.2)
    net = make_recurrent_actor_critic(3, 2, nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,))
    ppo = PPOConfig(n_envs=4, rollout_length=12, n_minibatches=1)
    state = new_training_state(env, net, TrainConfig(ppo=ppo))
    view = NetworkFn.of(net, deterministic=False).with_state(params=state.params, rest=state.rest)
    # Compiled, as training runs them (op by op they take about twice as long).
    rollout = jax.jit(collect_rollout, static_argnums=(0, 4, 5))(
        env, view, state.rollout, jax.random.key(1), ppo.rollout_length, True)
    traj, last_values, view = rollout.trajectory, rollout.last_values, rollout.network
    assert float(traj.truncated.sum()) > 0 and float(traj.terminated.sum()) > 0
    advantages, returns = trajectory_gae(traj, traj.values, last_values, ppo)
    batch = Minibatch(trajectory=traj, advantages=advantages, returns=returns, last_values=last_values[None])
    grad_fn = jax.jit(jax.value_and_grad(ppo_loss, has_aux=True), static_argnums=3)
    (fixed, _), g_fixed = grad_fn(state.params, view, batch, ppo)
    again = dataclasses.replace(ppo, recompute_advantages=True)
    (recomputed, _), g_recomputed = grad_fn(state.params, view, batch, again)
    np.testing.assert_allclose(recomputed, fixed, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_recomputed), jax.tree.leaves(g_fixed)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _discrete_target_config(**ppo) -> TrainConfig:
    """60 iterations of 32 envs x 10 steps on the 10-step discrete Target, one evaluation at the end."""
    return TrainConfig(
        ppo=PPOConfig(n_envs=32, rollout_length=10, total_steps=32 * 10 * 60, learning_rate=3e-3,
                      n_minibatches=4, **ppo),
        eval=EvalConfig(every_steps=10**9, n_envs=64, max_episode_length=10),
        iterations_per_call=20,
    )


@pytest.mark.parametrize("recompute", [False, True])
def test_learns_discrete_target_either_way(recompute):
    env = Target(obs_size=3, discrete=True, max_steps=10, p_end=0.0)
    net = make_mlp_actor_critic(3, 3, (32,), (32,), nnx.Rngs(1), discrete=True, normalize_obs=False)
    config = _discrete_target_config(recompute_advantages=recompute)
    result = train_ppo(env, net, config)
    final = result.eval_history[-1][1]["eval/episode_return"]
    assert final >= 9.0, final  # 10 is optimal, 3.3 is chance


@pytest.mark.parametrize("spec, kind", [("gymnax:Pendulum-v1", "mlp"), ("cue_memory", "lstm")])
def test_training_compiles_its_program_once(spec, kind, monkeypatch):
    """The state the compiled iteration returns has the same signature as
    the one it was given (no weak types left), so later calls reuse the
    compiled program instead of compiling it again."""
    from nnx_ppo.algorithms import trainer as trainer_module
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    compiled = []
    original = trainer_module.compile_iterations

    def recording(*args, **kwargs):
        compiled.append(original(*args, **kwargs))
        return compiled[-1]

    monkeypatch.setattr(trainer_module, "compile_iterations", recording)
    env = make(spec)
    net = make_actor_critic_for_env(env, kind, nnx.Rngs(0), **(
        {"hidden_size": 8, "encoder_sizes": (8,)} if kind == "lstm" else {}))
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=4, n_minibatches=2, total_steps=8 * 4 * 3),
                         eval=EvalConfig(enabled=False))
    train_ppo(env, net, config)
    assert len(compiled) == 1 and compiled[0]._cache_size() == 1


def test_normalized_rewards_learn_and_keep_logged_returns_in_env_units():
    """Rewards scaled 100x: with ``normalize_rewards`` the policy still learns
    the target and the logged returns stay in the env's units."""
    from nnx_ppo.envs.wrappers import RewardScale

    env = RewardScale(Target(obs_size=3, discrete=True, max_steps=10, p_end=0.0), 100.0)
    net = make_mlp_actor_critic(3, 3, (32,), (32,), nnx.Rngs(1), discrete=True, normalize_obs=False)
    config = _discrete_target_config(normalize_rewards=True)
    rows = []
    result = train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m))
    final = result.eval_history[-1][1]["eval/episode_return"]
    assert final >= 900.0, final  # 1000 is optimal, 333 is chance
    train_rows = [r for r in rows if "train/return_std" in r]
    assert train_rows[-1]["train/episode_return"] > 500.0
    assert 10.0 < train_rows[-1]["train/return_std"] < 1000.0
    assert result.state.return_stats.count > 32 * 10 * 59


def test_nan_leaves_the_network_with_its_last_finite_parameters():
    """Rewards turn NaN in iteration 2: the error says so, and the network
    holds the parameters after iteration 1 (equal to a 1-iteration run)."""

    env = NaNAfter(max_steps=50, p_end=0.0)
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=40, n_minibatches=2),
                         eval=EvalConfig(enabled=False))
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    with pytest.raises(NonFiniteError, match="last finite parameters .* iteration 1 "):
        train_ppo(env, net, config)
    reference = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    train_ppo(env, reference, dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, total_steps=8)))
    for a, b in zip(jax.tree.leaves(nnx.state(net, nnx.Param)), jax.tree.leaves(nnx.state(reference, nnx.Param))):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_carry_that_changes_is_named_before_compiling(bad):
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput

    class Drifting(StatefulModule):
        def initialize_state(self, batch_size):
            return {"h": jnp.zeros((batch_size, 4), jnp.float32)}

        def __call__(self, state, x, rollout_extras=None):
            h = state["h"]
            h = jnp.concatenate([h, h[:, :1]], axis=1) if bad == "shape" else h.astype(jnp.int32)
            return StatefulModuleOutput(next_state={"h": h}, output=x)

    net = Sequential(Drifting(), make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=8, n_minibatches=2))
    expected = r"\(4, 5\) float32" if bad == "shape" else r"\(4, 4\) int32"
    with pytest.raises(ValueError, match=r"carry leaf \[0\]\['h'\] is \(4, 4\) float32 .* but " + expected):
        train_ppo(Target(), net, config)


def test_target_kl_stops_the_updates_early():
    """target_kl: a huge limit changes nothing (bit for bit: with XLA's
    fusion emitters, in a process of its own); a tiny one keeps only the first
    update of every iteration (its KL is 0, measured before it)."""
    if old_emitters():
        run_with_fusion_emitters(__file__, "test_target_kl_stops_the_updates_early")
        return
    env = Target()
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2, n_epochs=3),
                         eval=EvalConfig(enabled=False))
    runs = {}
    for target_kl in (None, 1e9, 1e-8):
        rows = []
        net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
        ppo = dataclasses.replace(config.ppo, target_kl=target_kl)
        train_ppo(env, net, dataclasses.replace(config, ppo=ppo), log_fn=lambda m, s, rows=rows: rows.append(m))
        runs[target_kl] = (jax.tree.leaves(nnx.state(net, nnx.Param)), rows)
    for a, b in zip(runs[None][0], runs[1e9][0]):
        np.testing.assert_array_equal(a, b)
    assert [r["optimizer/updates_skipped"] for r in runs[1e9][1]] == [0.0, 0.0]
    assert [r["optimizer/updates_skipped"] for r in runs[1e-8][1]] == pytest.approx([5 / 6, 5 / 6])
    initial = jax.tree.leaves(nnx.state(make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)), nnx.Param))
    assert any(not np.array_equal(a, b) for a, b in zip(runs[1e-8][0], initial))
    with pytest.raises(ValueError, match="target_kl must be positive"):
        PPOConfig(target_kl=0.0)
