"""Many seeds in one program equal the seeds trained one by one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import train_seeds
from nnx_ppo.algorithms.ppo import NonFiniteError, new_training_state
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_actor_critic_for_env, make_mlp_actor_critic
from tests.algorithms.toy_envs import Target


@pytest.mark.parametrize("kind,batchings", [("lstm", ("vmap",)),
                                            pytest.param("mlp", ("vmap", "map"), marks=pytest.mark.slow)])
def test_each_seed_matches_its_own_run(kind, batchings):
    """Seed 5 of a seed batch, vmapped (and in the slow run, run in turn),
    against its own run. The seeds run in turn ("map") are compared with the
    vmapped batch on 1 and 4 devices in test_sharding.py, which runs by default."""
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
                              log_fn=lambda m, s, seed, logged=logged: logged.append((seed, s, m)))
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
    from nnx_ppo.network_spec import load_network

    env = make("cue_memory", n_cues=2, delay=3)
    make_network = lambda rngs: make_actor_critic_for_env(env, "lstm", rngs, hidden_size=8, encoder_sizes=(8,))
    # (the training program of test_each_seed_matches_its_own_run's seed batch: compiled once for both)
    config = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 4),
                         eval=EvalConfig(enabled=False), checkpoint_every_steps=8 * 6 * 2, iterations_per_call=2)
    whole = train_seeds(env, make_network, config, [3, 5], checkpoint_dir=str(tmp_path))  # saved at 2 and 4
    halfway = str(tmp_path / "step_000000000096")
    with pytest.raises(ValueError, match="resume with its seeds"):
        train_seeds(env, make_network, config, [5, 3], resume_from=halfway)
    resumed = train_seeds(env, make_network, config, [3, 5], resume_from=halfway)
    for a, b in zip(whole, resumed):
        assert b.total_steps == 8 * 6 * 4
        jax.tree.map(np.testing.assert_array_equal, a.state.params, b.state.params)  # exact
    net = load_network(str(tmp_path), make_network(nnx.Rngs(0)), seed=5)  # the final one
    leaf = jax.tree.leaves(nnx.state(net, nnx.Param))[0]
    np.testing.assert_array_equal(leaf, jax.tree.leaves(resumed[1].state.params)[0])
    with pytest.raises(ValueError, match=r"holds the seeds \[3, 5\]"):
        load_network(str(tmp_path), make_network(nnx.Rngs(0)))


class PoisonedTarget(Target):
    """``Target`` whose envs with a reset score below ``threshold`` emit NaN
    rewards from the 3rd step of their (50-step) episode on."""

    threshold = -1.0

    def reset(self, key):
        state = super().reset(key)
        return dataclasses.replace(state, info={**state.info, "score": jax.random.uniform(key)})

    def step(self, state, action):
        s = super().step(state, action)
        poisoned = (state.info["score"] < self.threshold) & (s.info["steps"] >= 3)
        return dataclasses.replace(s, reward=jnp.where(poisoned, jnp.nan, s.reward),
                                   info={**s.info, "score": state.info["score"]})


def test_a_seed_fails_alone():
    """4 seeds, NaN rewards in one seed's envs only: that seed stops at its
    last healthy parameters (finite, equal to its own run up to then), the
    other 3 train to the end and equal their own runs."""
    env = PoisonedTarget(max_steps=50, p_end=0.0)
    make_network = lambda rngs: make_mlp_actor_critic(3, 2, (8,), (8,), rngs)
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=2, total_steps=4 * 2 * 6, n_minibatches=2),
                         eval=EvalConfig(enabled=False), iterations_per_call=2)
    seeds = [0, 1, 2, 3]
    # Which envs a seed starts with is known before training: poison exactly one seed.
    lowest = {s: float(jnp.min(new_training_state(env, make_network(nnx.Rngs(s)), dataclasses.replace(
        config, seed=s)).rollout.env_state.info["score"])) for s in seeds}
    ranked = sorted(seeds, key=lowest.get)
    bad = ranked[0]
    env.threshold = (lowest[ranked[0]] + lowest[ranked[1]]) / 2

    logged = []
    results = train_seeds(env, make_network, config, seeds, log_fn=lambda m, steps, s: logged.append((s, steps)))
    for s, result in zip(seeds, results):
        solo_config = dataclasses.replace(config, seed=s)
        if s == bad:
            assert result.failure is not None and result.failure.iteration == 2, result.failure
            assert isinstance(result.failure.error, NonFiniteError) and "rewards" in str(result.failure.error)
            assert result.total_steps == 8 and result.total_iterations == 1
            assert max(steps for seed, steps in logged if seed == s) == 8  # not logged after its failure
            # its own run up to its last healthy iteration
            solo_config = dataclasses.replace(solo_config, ppo=dataclasses.replace(config.ppo, total_steps=8))
        else:
            assert result.failure is None and result.total_steps == 48
        solo = train_ppo(env, make_network(nnx.Rngs(s)), solo_config)
        for a, b in zip(jax.tree.leaves(result.state.params), jax.tree.leaves(solo.state.params)):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
