"""The cost of the non-finite counts (``health/nonfinite_*``) in a PPO iteration.

Usage: python bench/nonfinite_cost.py [ENV] [ARCH] [N_ENVS] [ROLLOUT] [CALLS]

Compiles the same PPO iteration twice, with the counts and with them
replaced by a constant (the ``count_nonfinite`` of the rollout and of the
gradients), then calls the two programs in turn, ``CALLS`` times each
(paired and interleaved, so that other load on the machine falls on both
alike), and prints one JSON line: the median seconds per iteration of each
and the median of the per-pair ratios with a bootstrap 95% interval.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo._app.plot import bootstrap_interval
from nnx_ppo.algorithms import ppo
from nnx_ppo.algorithms.config import PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, donatable
from nnx_ppo.algorithms.trainer import PPO
from nnx_ppo.envs import make
from nnx_ppo.networks.factories import make_actor_critic_for_env


def main() -> None:
    args = sys.argv[1:]
    env_name = args[0] if args else "gymnax:Pendulum-v1"
    arch = args[1] if len(args) > 1 else "mlp"
    n_envs, rollout_length = (int(args[2]), int(args[3])) if len(args) > 3 else (256, 32)
    calls = int(args[4]) if len(args) > 4 else 20
    env = make(env_name)
    sizes = {"actor_hidden_sizes": (64, 64), "critic_hidden_sizes": (64, 64)} if arch == "mlp" else {"hidden_size": 64}
    net = make_actor_critic_for_env(env, arch, nnx.Rngs(0), **sizes)
    config = TrainConfig(ppo=PPOConfig(n_envs=n_envs, rollout_length=rollout_length, total_steps=10**9))
    graphdef = NetworkFn.of(net, deterministic=False).graphdef
    state = ppo.new_training_state(env, net, config)
    states = {"with": donatable(jax.tree.map(jnp.copy, state)), "without": donatable(jax.tree.map(jnp.copy, state))}
    fns = {}
    original = ppo.count_nonfinite
    for name in ("with", "without"):
        if name == "without":
            zero = lambda tree, where=None: jnp.zeros((), jnp.float32)  # noqa: E731
            ppo.count_nonfinite = zero
        fns[name] = ppo.compile_iterations(PPO.iteration(env, graphdef, config.ppo), 1)
        states[name], out = fns[name](states[name], 1)  # compiles (traced with or without the counts)
        jax.block_until_ready(states[name])
        ppo.count_nonfinite = original
    seconds = {"with": [], "without": []}
    for i in range(calls):
        for name in (("with", "without") if i % 2 == 0 else ("without", "with")):
            t0 = time.perf_counter()
            states[name], out = fns[name](states[name], 1)
            jax.block_until_ready(states[name])
            seconds[name].append(time.perf_counter() - t0)
    ratios = np.array(seconds["with"]) / np.array(seconds["without"])
    ci95 = bootstrap_interval(ratios, np.median)
    print(json.dumps({"env": env_name, "arch": arch, "n_envs": n_envs, "rollout": rollout_length, "calls": calls,
                      "with_s": float(np.median(seconds["with"])), "without_s": float(np.median(seconds["without"])),
                      "ratio_median": float(np.median(ratios)),
                      "ratio_ci95": list(ci95)}))


if __name__ == "__main__":
    main()
