"""Sharding over devices: 4 forced CPU devices in a subprocess, for one
seed (by env) and for a seed batch (by env and by seed)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import dataclasses, json, os, sys, tempfile
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import jax
    import numpy as np
    from flax import nnx
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import train_ppo
    from nnx_ppo.algorithms.population import train_seeds
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env

    env = make("cue_memory", n_cues=2, delay=3)
    ppo = PPOConfig(n_envs=16, rollout_length=8, n_minibatches=2, total_steps=16 * 8 * 4, shuffle_blocks=4)
    base = TrainConfig(ppo=ppo, eval=EvalConfig(every_steps=16 * 8 * 2, n_envs=8, max_episode_length=5),
                       checkpoint_every_steps=16 * 8 * 2)

    def run(n_devices, total_iterations=4, **kwargs):
        net = make_actor_critic_for_env(env, "lstm", nnx.Rngs(0), hidden_size=8, encoder_sizes=(8,))
        config = dataclasses.replace(base, n_devices=n_devices,
                                     ppo=dataclasses.replace(ppo, total_steps=16 * 8 * total_iterations))
        rows = []
        result = train_ppo(env, net, config, log_fn=lambda m, s: rows.append(m), **kwargs)
        return result, [r for r in rows if "loss/total" in r]

    def max_diff(a, b):
        return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    def run_seeds(n_devices, shard_seeds, seed_batching="vmap", **kwargs):
        make_net = lambda rngs: make_actor_critic_for_env(env, "mlp", rngs, actor_hidden_sizes=(8,),
                                                          critic_hidden_sizes=(8,))
        config = dataclasses.replace(base, n_devices=n_devices, shard_seeds=shard_seeds, seed_batching=seed_batching)
        return train_seeds(env, make_net, config, [0, 1, 2, 3], **kwargs)

    def seed_devices(results):  # the devices holding the seeds' parameters
        return len({d for r in results for d in jax.tree.leaves(r.state.params)[0].devices()})

    def seeds_diff(a, b):
        return max(max_diff(x.state.params, y.state.params) for x, y in zip(a, b))

    def seeds_eval_diff(a, b):
        return max(abs(x.eval_history[-1][1]["eval/episode_return"] - y.eval_history[-1][1]["eval/episode_return"])
                   for x, y in zip(a, b))

    try:  # 3 seeds do not split over 4 devices: refused before anything is built
        def never_built(rngs):
            raise AssertionError("a network was built before the seeds were checked")
        train_seeds(env, never_built, dataclasses.replace(base, n_devices=4, shard_seeds=True), [0, 1, 2])
        uneven_seeds_error = ""
    except ValueError as err:
        uneven_seeds_error = str(err)

    tmp_seeds = tempfile.mkdtemp()
    seeds_one = run_seeds(1, False, checkpoint_dir=tmp_seeds)      # 4 seeds, 1 device, checkpoints at 2 and 4
    seeds_by_env = run_seeds(4, False)                               # every seed's 16 envs over 4 devices
    seeds_by_seed = run_seeds(4, True, resume_from=tmp_seeds + "/step_000000000256")  # one seed per device,
                                                                                    # resumed from 1 device
    map_by_seed = run_seeds(4, True, "map")   # each device runs its one seed (shard_map of lax.map)
    map_by_env = run_seeds(4, False, "map")   # the seeds in turn, each seed's envs over 4 devices
    tmp = tempfile.mkdtemp()
    one, rows1 = run(1)
    four, rows4 = run(4, checkpoint_dir=tmp)                       # checkpoints at 2 and 4 iterations, 4 devices
    resumed_on_one, _ = run(1, resume_from=tmp + "/step_000000000256")  # ... the first resumed on 1 device
    print(json.dumps({
        "devices": len(jax.devices()),
        "sharded": len(four.state.rollout.episode_return.sharding.device_set),
        "params_1_vs_4": max_diff(one.state.params, four.state.params),
        "loss_1_vs_4": max(abs(a["loss/total"] - b["loss/total"]) for a, b in zip(rows1, rows4)),
        "eval_1_vs_4": abs(one.eval_history[-1][1]["eval/episode_return"]
                           - four.eval_history[-1][1]["eval/episode_return"]),
        "replay_4": max(r["replay/max_error"] for r in rows4),
        "resume_4_to_1": max_diff(one.state.params, resumed_on_one.state.params),
        "resumed_run_iterations": resumed_on_one.total_iterations,
        "seeds_by_env_sharded": len(seeds_by_env[0].state.rollout.episode_return.sharding.device_set),
        "seeds_by_seed_devices": seed_devices(seeds_by_seed),
        "seeds_params_by_env": seeds_diff(seeds_one, seeds_by_env),
        "seeds_params_by_seed": seeds_diff(seeds_one, seeds_by_seed),
        "seeds_eval_by_env": seeds_eval_diff(seeds_one, seeds_by_env),
        "seeds_eval_by_seed": seeds_eval_diff(seeds_one, seeds_by_seed),
        "map_by_seed_devices": seed_devices(map_by_seed),
        "map_params_by_seed": seeds_diff(seeds_one, map_by_seed),
        "map_params_by_env": seeds_diff(seeds_one, map_by_env),
        "map_eval_by_seed": seeds_eval_diff(seeds_one, map_by_seed),
        "map_eval_by_env": seeds_eval_diff(seeds_one, map_by_env),
        "seeds_by_seed_iterations": seeds_by_seed[0].total_iterations,
        "uneven_seeds_error": uneven_seeds_error,
        "seeds_differ": max_diff(seeds_one[0].state.params, seeds_one[1].state.params),
    }))
''')


@pytest.fixture(scope="module")
def measured():
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]  # the script sets it
    env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_four_devices_match_one(measured):
    """Same config (4 shuffle blocks) on 1 and on 4 devices: the same
    training within float rounding, and the env axis really is split."""
    assert measured["devices"] == 4 and measured["sharded"] == 4
    assert measured["params_1_vs_4"] < 1e-4, measured
    assert measured["loss_1_vs_4"] < 1e-4, measured
    assert measured["eval_1_vs_4"] < 1e-3, measured


def test_replay_guarantee_holds_sharded(measured):
    assert measured["replay_4"] <= 1e-5, measured


def test_checkpoint_saved_on_four_devices_resumes_on_one(measured):
    assert measured["resumed_run_iterations"] == 4
    assert measured["resume_4_to_1"] < 1e-4, measured


def test_seed_batch_sharded_by_env_or_by_seed_matches_one_device(measured):
    """train_seeds on 4 devices, every seed's envs split (default) or the 4
    seeds split (shard_seeds, resumed halfway from a checkpoint saved on one
    device): each seed trains as on one device."""
    assert measured["seeds_by_env_sharded"] == 4, measured
    assert measured["seeds_by_seed_devices"] == 4, measured  # each seed's parameters on its own device
    for key in ("seeds_params_by_env", "seeds_params_by_seed"):
        assert measured[key] < 1e-4, measured
    for key in ("seeds_eval_by_env", "seeds_eval_by_seed"):
        assert measured[key] < 1e-3, measured
    assert measured["seeds_differ"] > 1e-3, measured
    assert measured["seeds_by_seed_iterations"] == 4, measured
    assert "number of seeds (3) must be divisible by the number of devices (4)" in measured["uneven_seeds_error"]


def test_seeds_in_turn_on_four_devices_match_one_device(measured):
    """seed_batching="map" on 4 devices (seeds split: each device runs its
    own; or every seed's envs split): each seed trains as vmapped on one."""
    assert measured["map_by_seed_devices"] == 4, measured
    for key in ("map_params_by_seed", "map_params_by_env"):
        assert measured[key] < 1e-4, measured
    for key in ("map_eval_by_seed", "map_eval_by_env"):
        assert measured[key] < 1e-3, measured


AHEAD = textwrap.dedent('''
    import dataclasses, json, os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    from flax import nnx
    from nnx_ppo.algorithms import trainer
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.population import train_seeds
    from nnx_ppo.envs import make
    from nnx_ppo.networks.factories import make_actor_critic_for_env
    from tests.algorithms.test_driver import counting_evaluations

    calls = []
    trainer.evaluation_hook = counting_evaluations(trainer.evaluation_hook, calls)
    trainer.compiles_beside_training = lambda: True  # as on an accelerator
    env = make("cue_memory", n_cues=2, delay=3)
    config = TrainConfig(ppo=PPOConfig(n_envs=16, rollout_length=8, n_minibatches=2, total_steps=16 * 8 * 2),
                         eval=EvalConfig(every_steps=16 * 8, n_envs=8, max_episode_length=5), n_devices=4)
    make_net = lambda rngs: make_actor_critic_for_env(env, "mlp", rngs, actor_hidden_sizes=(8,),
                                                      critic_hidden_sizes=(8,))
    out = {}
    trainer.train_ppo(env, make_net(nnx.Rngs(0)), config)
    out["by_env"], calls[:] = list(calls), []
    train_seeds(env, make_net, dataclasses.replace(config, shard_seeds=True), [0, 1, 2, 3])
    out["by_seed"] = list(calls)
    print(json.dumps(out))
''')


def test_the_first_evaluation_finds_its_program_compiled_on_four_devices():
    """As on an accelerator (the evaluation's program compiled beside the
    training program's): on 4 devices, split by env and a seed batch split by
    seed, no evaluation compiles anything."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    proc = subprocess.run([sys.executable, "-c", AHEAD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "XLA_FLAGS": " ".join(flags)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c for _, c in calls["by_env"]] == [[], []] and [c for _, c in calls["by_seed"]] == [[], []], calls
