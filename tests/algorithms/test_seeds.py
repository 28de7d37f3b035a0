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


@pytest.mark.parametrize("kind,batchings", [("lstm", ("vmap", "map")),
                                            pytest.param("mlp", ("vmap",), marks=pytest.mark.slow)])
def test_each_seed_matches_its_own_run(kind, batchings):
    """Seed 5 of a seed batch, vmapped and (LSTM) run in turn, against its own run."""
    env = make("cue_memory", n_cues=2, delay=3)
    sizes = {"hidden_size": 8, "encoder_sizes": (8,)} if kind == "lstm" else {
        "actor_hidden_sizes": (8,), "critic_hidden_sizes": (8,)}
    make_network = lambda rngs: make_actor_critic_for_env(env, kind, rngs, **sizes)
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 4),
                         eval=EvalConfig(every_steps=8 * 6 * 2, n_envs=8, max_episode_length=5),
                         iterations_per_call=2)
    # The second seed of each batch against its own run (one is enough to show
    # that each slice of the batch is its seed's run; each run costs a compile).
    single = train_ppo(env, make_network(nnx.Rngs(5)), dataclasses.replace(config, seed=5))
    for seed_batching in batchings:
        logged = []
        results = train_seeds(env, make_network, dataclasses.replace(config, seed_batching=seed_batching), [3, 5],
                              log_fn=lambda m, s, seed: logged.append((seed, s, m)))
        assert {seed for seed, _, _ in logged} == {3, 5}
        batched = results[1]
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


def test_seed_batch_checkpoints_resume_exactly_and_load_per_seed(tmp_path):
    from nnx_ppo.algorithms import checkpointing

    env = make("cue_memory", n_cues=2, delay=3)
    make_network = lambda rngs: make_actor_critic_for_env(env, "lstm", rngs, hidden_size=8, encoder_sizes=(8,))
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 4),
                         eval=EvalConfig(enabled=False), checkpoint_every_steps=8 * 6 * 2)
    whole = train_seeds(env, make_network, config, [3, 5], checkpoint_dir=str(tmp_path))  # saved at 2 and 4
    halfway = str(tmp_path / "step_000000000096")
    with pytest.raises(ValueError, match="resume with its seeds"):
        train_seeds(env, make_network, config, [5, 3], resume_from=halfway)
    resumed = train_seeds(env, make_network, config, [3, 5], resume_from=halfway)
    for a, b in zip(whole, resumed):
        assert b.total_steps == 8 * 6 * 4
        jax.tree.map(np.testing.assert_array_equal, a.state.params, b.state.params)  # exact
    net = checkpointing.load_network(str(tmp_path), make_network(nnx.Rngs(0)), seed=5)  # the final one
    leaf = jax.tree.leaves(nnx.state(net, nnx.Param))[0]
    np.testing.assert_array_equal(leaf, jax.tree.leaves(resumed[1].state.params)[0])
    with pytest.raises(ValueError, match=r"holds the seeds \[3, 5\]"):
        checkpointing.load_network(str(tmp_path), make_network(nnx.Rngs(0)))
