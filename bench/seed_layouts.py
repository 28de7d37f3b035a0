"""Steady-state throughput of S seeds of the Pendulum work laid out in one program.

Usage: python bench/seed_layouts.py ARCH LAYOUT N_SEEDS [N_ENVS] [CALLS]

LAYOUT is one of
  single   one seed alone (N_SEEDS ignored): the reference rate;
  vmap     the seeds stacked on a leading axis and the iteration vmapped (train_seeds);
  groupsG  G groups of N_SEEDS / G vmapped seeds side by side in one program;
  shard    vmapped, the seed axis sharded over every local device (run with
           XLA_FLAGS=--xla_force_host_platform_device_count=D for D CPU devices).
The work is bench_ppo.py's (gymnax Pendulum-v1, rewards x 0.1, ARCH "mlp" or
"lstm", N_ENVS envs x 32 steps, 4 epochs x 4 minibatches, no evaluation), two
iterations per compiled call. Prints one JSON line: compile seconds, total
env-steps/s (median over CALLS calls after the compiling one) and the call times.
"""

import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench_ppo import build_network
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import NetworkFn, donatable
from nnx_ppo.algorithms.ppo import compile_iterations, make_optimizer, new_training_state, train_iteration
from nnx_ppo.algorithms.seeds import stack_trees
from nnx_ppo.algorithms.sharding import seed_mesh, seed_shardings
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale

ENV = "gymnax:Pendulum-v1"
PER_CALL = 2


def build(arch: str, layout: str, n_seeds: int, n_envs: int):
    """The compiled ``fn(state, n)`` and its initial state for ``layout``."""
    raw = make(ENV)
    env = RewardScale(raw, 0.1)
    config = TrainConfig(ppo=PPOConfig(n_envs=n_envs, rollout_length=32, total_steps=n_envs * 32 * 100),
                         eval=EvalConfig(enabled=False))
    n_seeds = 1 if layout == "single" else n_seeds
    nets = [build_network(ENV, arch, raw, nnx.Rngs(s)) for s in range(n_seeds)]
    graphdef = NetworkFn.of(nets[0], deterministic=False).graphdef
    states = [new_training_state(env, net, dataclasses.replace(config, seed=s)) for s, net in enumerate(nets)]
    optimizer = make_optimizer(config.ppo)
    iteration = lambda s: train_iteration(env, graphdef, optimizer, config.ppo, s)
    if layout == "single":
        return compile_iterations(iteration, PER_CALL), donatable(states[0]), 1
    if layout == "vmap":
        return compile_iterations(iteration, PER_CALL, batched_seeds=True), donatable(stack_trees(states)), n_seeds
    if layout == "shard":
        state = donatable(stack_trees(states))
        shardings = seed_shardings(state, seed_mesh(jax.local_devices()))
        fn = compile_iterations(iteration, PER_CALL, batched_seeds=True, shardings=shardings)
        return fn, jax.device_put(state, shardings), n_seeds
    if layout.startswith("groups"):
        groups = int(layout[len("groups"):])
        size = n_seeds // groups
        state = tuple(donatable(stack_trees(states[g * size:(g + 1) * size])) for g in range(groups))
        batched = jax.vmap(iteration)
        return compile_iterations(lambda st: tuple(zip(*[batched(s) for s in st])), PER_CALL), state, n_seeds
    raise SystemExit(f"unknown LAYOUT {layout!r}: single, vmap, groupsG or shard")


def main(argv):
    arch, layout, n_seeds = argv[0], argv[1], int(argv[2])
    n_envs = int(argv[3]) if len(argv) > 3 else 256
    calls = int(argv[4]) if len(argv) > 4 else 5
    fn, state, seeds = build(arch, layout, n_seeds, n_envs)
    n = jnp.asarray(PER_CALL, jnp.int32)
    t0 = time.perf_counter()
    state, out = fn(state, n)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        state, out = fn(state, n)
        jax.block_until_ready((state, out))
        times.append(time.perf_counter() - t0)
    steps = PER_CALL * n_envs * 32 * seeds
    print(json.dumps({"arch": arch, "layout": layout, "seeds": seeds, "n_envs": n_envs, "devices": jax.device_count(),
                      "compile_s": round(compile_s, 1), "steps_per_s": round(steps / float(np.median(times))),
                      "call_s": [round(t, 3) for t in times]}))


if __name__ == "__main__":
    main(sys.argv[1:])
