"""One run of Brax PPO (0.14.2) on a Playground learning_curves.py task, the same work as ours.

Runs in the peers' venv (../shared/peers/setup.sh); prints one JSON line with
the evaluations as [env_steps, return, wall seconds since the start].
The work: the task's envs x rollout per training step (one unroll each), 4
minibatches x 4 passes, Adam 3e-4, entropy cost 1e-2, the task's discount
(default 0.99), GAE lambda 0.95, observations normalized; the benchmark MLP
(4x64 policy, 2x256 value). Usage: python brax_playground_run.py TASK_JSON SEED
"""
import functools
import json
import sys
import time

import brax_compat  # noqa: F401  (jax.device_put_replicated, which brax calls)
from brax.training.agents.ppo import networks as ppo_networks
from brax.training.agents.ppo import train as ppo_train
from mujoco_playground import registry, wrapper

task, seed = json.loads(sys.argv[1]), int(sys.argv[2])
if task["arch"] != "mlp" or not task["env"].startswith("playground:"):
    raise SystemExit("brax_playground_run.py: only Playground tasks with the MLP (Brax PPO has no recurrent policy)")
name = task["env"].split(":", 1)[1]
evals = []
t0 = time.perf_counter()


def progress(step, metrics):
    if "eval/episode_reward" in metrics:
        evals.append([int(step), float(metrics["eval/episode_reward"]), time.perf_counter() - t0])


ppo_train.train(
    environment=registry.load(name, config_overrides={"impl": "jax"}),
    eval_env=registry.load(name, config_overrides={"impl": "jax"}), wrap_env_fn=wrapper.wrap_for_brax_training,
    num_timesteps=task["total"], episode_length=task["eval_len"], num_envs=task["n_envs"],
    unroll_length=task["rollout"], batch_size=task["n_envs"] // 4, num_minibatches=4, num_updates_per_batch=4,
    learning_rate=3e-4, entropy_cost=1e-2, discounting=task.get("discount", 0.99), gae_lambda=0.95,
    normalize_observations=True, reward_scaling=task["reward_scale"],
    num_evals=task["total"] // task["eval_every"] + 1, num_eval_envs=task["eval_envs"], seed=seed,
    network_factory=functools.partial(ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=(64,) * 4,
                                      value_hidden_layer_sizes=(256,) * 2),
    progress_fn=progress)
print(json.dumps({"evals": evals, "wall_s": time.perf_counter() - t0}))
