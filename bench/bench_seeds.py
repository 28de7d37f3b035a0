"""Many seeds in one program against the same seeds one after another.

Usage: python bench/bench_seeds.py ARCH [N_SEEDS] [ITERATIONS] [SEED_BATCHING] [shard]

The peers' Pendulum work (gymnax Pendulum-v1, ARCH "mlp" or "lstm" as in
bench_ppo.py, 256 envs x 32 steps, 4 epochs x 4 minibatches, no evaluation).
Runs ``N_SEEDS`` seeds (default 8) one after another with ``train_ppo``, then
all together with ``train_seeds``, ``ITERATIONS`` iterations each (default 12,
4 per compiled call), and prints one JSON line: steady-state total env-steps/s
of both (median over the calls after the first, so compilation is excluded),
their ratio, and the wall seconds of each way, compilation included.
SEED_BATCHING is ``TrainConfig.seed_batching`` ("vmap", the default, or
"map"); ``shard`` sets ``shard_seeds=True`` for the seed batch, over every
local device (force CPU devices with
XLA_FLAGS=--xla_force_host_platform_device_count=D). The seeds one after
another always run on one device, and so does the batch without ``shard``.
"""

import dataclasses
import json
import sys
import time

import jax
import numpy as np
from bench_ppo import build_network
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import train_seeds
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale

ENV = "gymnax:Pendulum-v1"


def main(argv):
    arch = argv[0] if argv else "mlp"
    n_seeds = int(argv[1]) if len(argv) > 1 else 8
    iterations = int(argv[2]) if len(argv) > 2 else 12
    seed_batching = argv[3] if len(argv) > 3 else "vmap"
    shard = len(argv) > 4 and argv[4] == "shard"
    env = make(ENV)
    train_env = RewardScale(env, 0.1)
    per_call = 4
    config = TrainConfig(ppo=PPOConfig(n_envs=256, rollout_length=32, total_steps=256 * 32 * iterations),
                         eval=EvalConfig(enabled=False), iterations_per_call=per_call, n_devices=1)
    make_network = lambda rngs: build_network(ENV, arch, env, rngs)
    seeds = list(range(n_seeds))

    rates, t0 = [], time.perf_counter()
    for seed in seeds:
        rows = []
        train_ppo(train_env, make_network(nnx.Rngs(seed)), dataclasses.replace(config, seed=seed),
                  log_fn=lambda m, s, rows=rows: rows.append(m["time/steps_per_second"]))
        rates.append(np.median(rows[per_call:]))  # calls after the compiling one
    one_by_one_wall = time.perf_counter() - t0
    one_by_one = float(np.median(rates))  # seeds run one at a time: total rate = one seed's rate

    rows, t0 = [], time.perf_counter()
    batch_config = dataclasses.replace(config, seed_batching=seed_batching, shard_seeds=shard,
                                       n_devices=None if shard else 1)
    train_seeds(train_env, make_network, batch_config, seeds,
                log_fn=lambda m, s, seed: rows.append(m["time/steps_per_second"]) if seed == seeds[0] else None)
    batched_wall = time.perf_counter() - t0
    batched = float(np.median(rows[per_call:])) * n_seeds
    print(json.dumps({"arch": arch, "seeds": n_seeds, "iterations": iterations, "seed_batching": seed_batching,
                      "devices": len(jax.local_devices()) if shard else 1,
                      "one_by_one_steps_per_s": round(one_by_one), "batched_steps_per_s": round(batched),
                      "ratio": round(batched / one_by_one, 2), "one_by_one_wall_s": round(one_by_one_wall, 1),
                      "batched_wall_s": round(batched_wall, 1)}))


if __name__ == "__main__":
    main(sys.argv[1:])
