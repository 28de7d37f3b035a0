"""A population: many (config, seed) members in one program, each equal to its own run."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from nnx_ppo.algorithms._hyperparameters import PER_MEMBER, PopulationConfigError
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import population_members, train_population
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale
from nnx_ppo.networks.factories import make_actor_critic_for_env

ENV = make("cue_memory", n_cues=2, delay=3)
BASE = TrainConfig(
    ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 4, learning_rate_decay=True,
                  value_clip_range=0.2, target_kl=0.05),
    eval=EvalConfig(every_steps=8 * 6 * 2, n_envs=8, max_episode_length=5),
    iterations_per_call=2,
)
# Every field that may differ per member differs from BASE.
OTHER = dataclasses.replace(BASE, ppo=dataclasses.replace(
    BASE.ppo, learning_rate=1e-3, clip_range=0.1, discounting_factor=0.9, gae_lambda=0.8, critic_loss_weight=1.0,
    regularization_weight=2.0, reward_scale=0.5, gradient_clipping=1.0, value_clip_range=0.5, target_kl=0.1))


def make_network(rngs):
    return make_actor_critic_for_env(ENV, "lstm", rngs, hidden_size=8, encoder_sizes=(8,))


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_other_covers_every_per_member_field():
    differing = {f.name for f in dataclasses.fields(PPOConfig)
                 if getattr(BASE.ppo, f.name) != getattr(OTHER.ppo, f.name)}
    assert differing == set(PER_MEMBER)


def test_each_member_matches_its_own_run():
    """Member 1 (OTHER, seed 5) of a 2 configs x 1 seed population against
    its own train_ppo run: parameters, evaluations, loss."""
    logged = []
    results = train_population(ENV, make_network, [BASE, OTHER], [5],
                               log_fn=lambda m, steps, member: logged.append(member))
    assert set(logged) == {0, 1}
    assert [(m.config_index, m.seed) for m in population_members([BASE, OTHER], [3, 5])] == [
        (0, 3), (0, 5), (1, 3), (1, 5)]
    solo = train_ppo(ENV, make_network(nnx.Rngs(5)), dataclasses.replace(OTHER, seed=5))
    member = results[1]
    assert _max_difference(member.state.params, solo.state.params) < 1e-5
    assert [s for s, _ in member.eval_history] == [s for s, _ in solo.eval_history]
    for (_, a), (_, b) in zip(member.eval_history, solo.eval_history):
        assert a["eval/episode_return"] == pytest.approx(b["eval/episode_return"], abs=1e-4)
    assert member.metrics["loss/total"] == pytest.approx(solo.metrics["loss/total"], rel=1e-3, abs=1e-5)
    # the two configs really train differently from the same seed
    assert _max_difference(results[0].state.params, results[1].state.params) > 1e-3


def test_configs_that_change_the_program_are_refused_by_name():
    wider = dataclasses.replace(BASE, ppo=dataclasses.replace(BASE.ppo, n_envs=16, rollout_length=8))
    with pytest.raises(PopulationConfigError, match=r"ppo\.n_envs, ppo\.rollout_length") as err:
        train_population(ENV, make_network, [BASE, wider], [0])
    assert "ppo.learning_rate" in str(err.value)  # says what may differ
    unclipped = dataclasses.replace(BASE, ppo=dataclasses.replace(BASE.ppo, value_clip_range=None))
    with pytest.raises(PopulationConfigError, match=r"ppo\.value_clip_range"):
        population_members([BASE, unclipped], [0])
    flags = dataclasses.replace(BASE, ppo=dataclasses.replace(BASE.ppo, normalize_advantages=False),
                                eval=dataclasses.replace(BASE.eval, n_envs=4))
    with pytest.raises(PopulationConfigError, match=r"ppo\.normalize_advantages, eval\.n_envs"):
        population_members([BASE, flags], [0])
    with pytest.raises(ValueError, match="seeds must be distinct"):
        population_members([BASE], [1, 1])


def test_reward_scale_and_regularization_weight_are_what_they_scale():
    """PPOConfig.reward_scale 0.5 with regularization_weight 2 and a sampler
    entropy weight 0.25 trains exactly as rewards scaled by the env
    (RewardScale) with weight 1 and entropy weight 0.5 (only the logged
    returns differ: ours stay in the env's units)."""
    def run(env, ppo, entropy_weight):
        network = make_actor_critic_for_env(ENV, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,),
                                            entropy_weight=entropy_weight)
        return train_ppo(env, network, dataclasses.replace(BASE, ppo=ppo, eval=EvalConfig(enabled=False)))

    ours = run(ENV, dataclasses.replace(BASE.ppo, reward_scale=0.5, regularization_weight=2.0), 0.25)
    theirs = run(RewardScale(ENV, 0.5), BASE.ppo, 0.5)
    assert _max_difference(ours.state.params, theirs.state.params) < 1e-6
    assert ours.metrics["train/reward_mean"] == pytest.approx(2 * theirs.metrics["train/reward_mean"])


def _fake_population(scores):
    """A stacked state of len(scores) members whose every field tells the members apart."""
    import jax.numpy as jnp

    from nnx_ppo.algorithms._hyperparameters import MemberState
    from nnx_ppo.algorithms.ppo import TrainingState

    n = len(scores)
    index = jnp.arange(n, dtype=jnp.float32)
    return TrainingState(
        params={"w": index[:, None] * jnp.ones((n, 3))}, rest={}, opt_state={"mu": index * 10},
        rollout={"carry": -index}, key=jax.random.split(jax.random.key(0), n),
        iteration=jnp.full((n,), 4, jnp.int32), return_stats={},
        member=MemberState(
            hyperparameters={"learning_rate": jnp.full((n,), 1e-3), "discounting_factor": jnp.full((n,), 0.99)},
            score=jnp.asarray(scores, jnp.float32), parent=jnp.arange(n, dtype=jnp.int32)))


def test_pbt_worst_members_take_over_the_best_and_perturb():
    import jax.numpy as jnp

    from nnx_ppo.algorithms.population import PBTConfig, population_step
    from nnx_ppo.algorithms.ppo import IterationOutput

    scores = [5.0, 1.0, 7.0, float("nan"), 3.0, 8.0, 2.0, 6.0]  # worst: 3 (no score yet), 1; best: 7, 5 ... 5 and 2
    state = _fake_population(scores)
    n = len(scores)
    output = IterationOutput(health=None, metrics={"train/episode_return": jnp.asarray(scores),
                                                   "train/completed_episodes": jnp.zeros((n,))})
    step = population_step(PBTConfig(every_iterations=2, seed=3), ("learning_rate", "discounting_factor"))
    new, out = jax.jit(step)(state, output)
    parent = np.asarray(new.member.parent)
    assert set(np.flatnonzero(parent != np.arange(n))) == {1, 3}  # the two worst (NaN counts as worst)
    for i in (1, 3):
        src = parent[i]
        assert src in (2, 5)  # the two best
        np.testing.assert_array_equal(new.params["w"][i], state.params["w"][src])
        assert new.opt_state["mu"][i] == state.opt_state["mu"][src] and new.rollout["carry"][i] == -src
        assert new.member.score[i] == scores[src]
        assert float(new.member.hyperparameters["learning_rate"][i]) in (pytest.approx(8e-4), pytest.approx(1.25e-3))
        assert float(1 - new.member.hyperparameters["discounting_factor"][i]) in (pytest.approx(0.008, rel=1e-4),
                                                                                pytest.approx(0.0125, rel=1e-4))
    keep = np.asarray([i for i in range(n) if i not in (1, 3)])
    np.testing.assert_array_equal(new.params["w"][keep], state.params["w"][keep])
    np.testing.assert_array_equal(jax.random.key_data(new.key), jax.random.key_data(state.key))  # own keys kept
    np.testing.assert_array_equal(out.metrics["population/parent"], parent)
    assert "hyperparameters/learning_rate" in out.metrics
    # not due (iteration 4 is not a multiple of 3): nothing but the scores changes
    quiet, _ = jax.jit(population_step(PBTConfig(every_iterations=3), ("learning_rate",)))(state, output)
    np.testing.assert_array_equal(quiet.member.parent, np.arange(n))


SHARDED = '''
import dataclasses, json, os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import jax, numpy as np
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import PBTConfig
from nnx_ppo.algorithms.population import train_population
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_actor_critic_for_env

env = make("cue_memory", n_cues=2, delay=3)
make_network = lambda rngs: make_actor_critic_for_env(env, "lstm", rngs, hidden_size=8, encoder_sizes=(8,))
runs = {}
for name, layout in (("one", dict(n_devices=1)), ("two", dict(n_devices=2, shard_seeds=True, seed_batching="map"))):
    base = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=6, n_minibatches=2, total_steps=8 * 6 * 8),
                       eval=EvalConfig(every_steps=8 * 6 * 4, n_envs=8, max_episode_length=5), iterations_per_call=2,
                       **layout)
    configs = [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, learning_rate=lr))
               for lr in (1e-4, 3e-4, 1e-3, 3e-3)]
    runs[name] = train_population(env, make_network, configs, [0], pbt=PBTConfig(every_iterations=2))
print(json.dumps({
    "devices": len(jax.devices()),
    "parents": {k: [int(r.state.member.parent) for r in v] for k, v in runs.items()},
    "rates": {k: [float(r.state.member.hyperparameters["learning_rate"]) for r in v] for k, v in runs.items()},
    "max_diff": max(float(np.max(np.abs(a - b))) for r1, r2 in zip(runs["one"], runs["two"])
                    for a, b in zip(jax.tree.leaves(r1.state.params), jax.tree.leaves(r2.state.params))),
}))
'''


@pytest.mark.slow  # about 45 s: a subprocess compiling both layouts
def test_pbt_population_sharded_by_member_matches_one_device():
    """Members split over 2 (forced CPU) devices, each running its own in
    turn, with PBT crossing devices: the same lineage, hyperparameters and
    parameters (to float rounding) as on one device."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2
    assert result["parents"]["one"] == result["parents"]["two"] != [0, 1, 2, 3]  # PBT acted, the same way
    assert result["rates"]["one"] == pytest.approx(result["rates"]["two"])
    assert result["max_diff"] < 1e-4
