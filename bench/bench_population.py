"""A population of 8 hyperparameter configs in one program against the same 8 runs one after another.

Usage: python bench/bench_population.py ARCH [ITERATIONS] [SEED_BATCHING]

The peers' Pendulum work of bench_seeds.py (gymnax Pendulum-v1, ARCH "mlp"
or "lstm", 256 envs x 32 steps, 4 epochs x 4 minibatches, no evaluation),
with 8 learning rates (1e-4 .. 3e-3, log-spaced), seed 0. Runs them one
after another with ``train_ppo``, then all together with
``train_population``, ``ITERATIONS`` iterations each (default 12, 4 per
compiled call), and prints one JSON line: the steady-state total
env-steps/s of both (median over the calls after the first), their ratio,
and the wall seconds of each way, compilation included. Compare with the
machine's ceiling for side-by-side work, ``core_ceiling.py ARCH``.
"""

import dataclasses
import json
import sys
import time

import numpy as np
from bench_ppo import build_network
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import train_population
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale

ENV = "gymnax:Pendulum-v1"
LEARNING_RATES = tuple(float(x) for x in np.geomspace(1e-4, 3e-3, 8))


def main(argv):
    arch = argv[0] if argv else "mlp"
    iterations = int(argv[1]) if len(argv) > 1 else 12
    seed_batching = argv[2] if len(argv) > 2 else "vmap"
    env = make(ENV)
    train_env = RewardScale(env, 0.1)
    per_call = 4
    base = TrainConfig(ppo=PPOConfig(n_envs=256, rollout_length=32, total_steps=256 * 32 * iterations),
                       eval=EvalConfig(enabled=False), iterations_per_call=per_call, n_devices=1,
                       seed_batching=seed_batching)
    configs = [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, learning_rate=lr))
               for lr in LEARNING_RATES]
    make_network = lambda rngs: build_network(ENV, arch, env, rngs)

    rates, t0 = [], time.perf_counter()
    for config in configs:
        rows = []
        train_ppo(train_env, make_network(nnx.Rngs(0)), config,
                  log_fn=lambda m, s, rows=rows: rows.append(m["time/steps_per_second"]))
        rates.append(np.median(rows[per_call:]))  # calls after the compiling one
    one_by_one_wall = time.perf_counter() - t0
    one_by_one = float(np.median(rates))

    rows, t0 = [], time.perf_counter()
    train_population(train_env, make_network, configs, [0],
                     log_fn=lambda m, s, k: rows.append(m["time/steps_per_second"]) if k == 0 else None)
    population_wall = time.perf_counter() - t0
    population = float(np.median(rows[per_call:])) * len(configs)
    print(json.dumps({"arch": arch, "members": len(configs), "iterations": iterations,
                      "seed_batching": seed_batching, "one_by_one_steps_per_s": round(one_by_one),
                      "population_steps_per_s": round(population), "ratio": round(population / one_by_one, 2),
                      "one_by_one_wall_s": round(one_by_one_wall, 1), "population_wall_s": round(population_wall, 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
