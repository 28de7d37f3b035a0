"""One run of Brax PPO (0.14.2) on a gymnax learning_curves.py task (MLP only).

Runs in the peers' venv (../shared/peers/setup.sh); prints one JSON line with
the evaluations as [env_steps, return, wall seconds since the start].
Usage: python brax_run.py TASK_JSON SEED
"""
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2].parent / "shared" / "peers"))

import brax_compat  # noqa: E402,F401  (jax.device_put_replicated, which brax calls)
import jax.numpy as jnp  # noqa: E402
from brax.envs.base import Env, State  # noqa: E402
from brax.training.agents.ppo import networks as ppo_networks  # noqa: E402
from brax.training.agents.ppo import train as ppo_train  # noqa: E402
from gymnax_env import GymnaxEnv  # noqa: E402
from gymnax_env import State as GymnaxState  # noqa: E402

task, seed = json.loads(sys.argv[1]), int(sys.argv[2])
if task["arch"] != "mlp" or not task["env"].startswith("gymnax:"):
    raise SystemExit("brax_run.py: only gymnax tasks with the MLP")
name = task["env"].split(":", 1)[1]
inner = GymnaxEnv(name, action_scale=2.0 if name.startswith("Pendulum") else 1.0)


class Gymnax(Env):
    """The gymnax env as a Brax env (Brax adds its own episode wrapper)."""

    def reset(self, rng):
        s = inner.reset(rng)
        return State(pipeline_state=s.env_state, obs=s.obs, reward=jnp.zeros(()), done=jnp.zeros(()),
                     metrics={}, info={"key": s.info["key"]})

    def step(self, state, action):
        s = GymnaxState(obs=state.obs, reward=state.reward, done=state.done, metrics={},
                        info={"key": state.info["key"], "truncated": jnp.zeros(())}, env_state=state.pipeline_state)
        n = inner.step(s, action)
        return state.replace(pipeline_state=n.env_state, obs=n.obs, reward=n.reward, done=n.done,
                             info={**state.info, "key": n.info["key"]})

    @property
    def observation_size(self):
        return inner.observation_size

    @property
    def action_size(self):
        return inner.action_size

    @property
    def backend(self):
        return "gymnax"


evals = []
t0 = time.perf_counter()


def progress(step, metrics):
    if "eval/episode_reward" in metrics:
        evals.append([int(step), float(metrics["eval/episode_reward"]), time.perf_counter() - t0])


ppo_train.train(
    environment=Gymnax(), num_timesteps=task["total"], episode_length=task["eval_len"], num_envs=task["n_envs"],
    unroll_length=task["rollout"], batch_size=task["n_envs"] // 4, num_minibatches=4, num_updates_per_batch=4,
    learning_rate=3e-4, entropy_cost=1e-2, discounting=0.99, gae_lambda=0.95, normalize_observations=True,
    reward_scaling=task["reward_scale"], num_evals=task["total"] // task["eval_every"] + 1,
    num_eval_envs=task["eval_envs"], seed=seed,
    network_factory=functools.partial(ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=(64, 64),
                                      value_hidden_layer_sizes=(64, 64)),
    progress_fn=progress)
print(json.dumps({"evals": evals, "wall_s": time.perf_counter() - t0}))
