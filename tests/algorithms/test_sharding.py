"""Sharding the env axis over devices: 4 forced CPU devices in a subprocess."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import dataclasses, json, os, sys, tempfile
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    import numpy as np
    from flax import nnx
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.ppo import train_ppo
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
        "replay_4": max(r["replay/max_abs_log_ratio"] for r in rows4),
        "resume_4_to_1": max_diff(one.state.params, resumed_on_one.state.params),
        "resumed_run_iterations": resumed_on_one.total_iterations,
    }))
''')


@pytest.fixture(scope="module")
def measured():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
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
