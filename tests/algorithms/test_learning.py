"""Quick learning checks on real envs (full-length versions: bench/learning.py)."""

from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale
from nnx_ppo.networks.factories import make_actor_critic_for_env


def _train_cue_memory(kind):
    env = make("cue_memory")
    sizes = {"hidden_size": 32, "encoder_sizes": (32,)} if kind != "mlp" else {
        "actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)}
    net = make_actor_critic_for_env(env, kind, nnx.Rngs(0), **sizes)
    config = TrainConfig(
        ppo=PPOConfig(n_envs=32, rollout_length=24, total_steps=32 * 24 * 30, learning_rate=3e-3),
        eval=EvalConfig(every_steps=10**9, n_envs=512, max_episode_length=10),
        iterations_per_call=10,
    )
    return train_ppo(env, net, config).eval_history[-1][1]["eval/episode_return"]


def test_memory_task_needs_memory():
    """Cue memory: the return is the success rate. An LSTM agent succeeds; a
    memoryless MLP cannot beat chance (0.5)."""
    lstm = _train_cue_memory("lstm")
    mlp = _train_cue_memory("mlp")
    assert lstm >= 0.9, lstm
    assert mlp <= 0.6, mlp


def test_cartpole_discrete_reaches_475():
    env = make("gymnax:CartPole-v1")
    net = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0))
    config = TrainConfig(
        ppo=PPOConfig(n_envs=64, rollout_length=32, total_steps=64 * 32 * 100, learning_rate=1e-3),
        eval=EvalConfig(every_steps=10**9, n_envs=16, max_episode_length=500),
        iterations_per_call=25,
    )
    result = train_ppo(env, net, config)
    assert result.eval_history[-1][1]["eval/episode_return"] >= 475


def test_pendulum_reaches_minus_250():
    env = make("gymnax:Pendulum-v1")
    net = make_actor_critic_for_env(env, "mlp", nnx.Rngs(0))
    config = TrainConfig(
        ppo=PPOConfig(n_envs=256, rollout_length=32, total_steps=256 * 32 * 100, learning_rate=1e-3,
                      discounting_factor=0.95),
        eval=EvalConfig(every_steps=10**9, n_envs=64, max_episode_length=200),
        iterations_per_call=25,
    )
    result = train_ppo(RewardScale(env, 0.1), net, config, eval_env=env)
    assert result.eval_history[-1][1]["eval/episode_return"] >= -250
