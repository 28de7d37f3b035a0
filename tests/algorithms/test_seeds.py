"""Many seeds in one program equal the seeds trained one by one."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.ppo import train_ppo
from nnx_ppo.algorithms.seeds import train_seeds
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_actor_critic_for_env


@pytest.mark.parametrize("kind", ["lstm", pytest.param("mlp", marks=pytest.mark.slow)])
def test_each_seed_matches_its_own_run(kind):
    env = make("cue_memory", n_cues=2, delay=3)
    sizes = {"hidden_size": 8, "encoder_sizes": (8,)} if kind == "lstm" else {
        "actor_hidden_sizes": (8,), "critic_hidden_sizes": (8,)}
    make_network = lambda rngs: make_actor_critic_for_env(env, kind, rngs, **sizes)
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 4),
                         eval=EvalConfig(every_steps=8 * 6 * 2, n_envs=8, max_episode_length=5),
                         iterations_per_call=2)
    logged = []
    results = train_seeds(env, make_network, config, [3, 5], log_fn=lambda m, s, seed: logged.append((seed, s, m)))
    assert {seed for seed, _, _ in logged} == {3, 5}
    for seed, batched in zip([3, 5], results):
        single = train_ppo(env, make_network(nnx.Rngs(seed)), dataclasses.replace(config, seed=seed))
        for a, b in zip(jax.tree.leaves(batched.state.params), jax.tree.leaves(single.state.params)):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
        assert [s for s, _ in batched.eval_history] == [s for s, _ in single.eval_history]
        for (_, m1), (_, m2) in zip(batched.eval_history, single.eval_history):
            assert m1["eval/episode_return"] == pytest.approx(m2["eval/episode_return"], abs=1e-4)
        assert batched.metrics["loss/total"] == pytest.approx(single.metrics["loss/total"], rel=1e-3, abs=1e-4)
    # the two seeds really differ
    p3, p5 = (jax.tree.leaves(r.state.params)[0] for r in results)
    assert not np.allclose(p3, p5)


def test_seeds_must_build_one_architecture():
    env = make("cue_memory", n_cues=2, delay=3)
    make_network = lambda rngs: make_actor_critic_for_env(env, "mlp", rngs, actor_hidden_sizes=(8,),
                                                          critic_hidden_sizes=(8,))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, n_minibatches=1, total_steps=16))
    with pytest.raises(ValueError, match="seeds must be distinct"):
        train_seeds(env, make_network, config, [1, 1])
    sizes = iter([(8,), (16,)])
    with pytest.raises(ValueError, match="same architecture"):
        train_seeds(env, lambda rngs: make_actor_critic_for_env(env, "mlp", rngs, actor_hidden_sizes=next(sizes),
                                                                critic_hidden_sizes=(8,)), config, [1, 2])
