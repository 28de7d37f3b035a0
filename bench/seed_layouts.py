"""Steady-state throughput of S seeds of the Pendulum work laid out in one program.

Usage: python bench/seed_layouts.py ARCH LAYOUT N_SEEDS [N_ENVS] [CALLS]
       python bench/seed_layouts.py ARCH compare LAYOUT,LAYOUT,... N_SEEDS [N_ENVS] [ROUNDS]

LAYOUT is one of
  single    one seed alone (N_SEEDS ignored): the reference rate;
  vmap      the seeds stacked on a leading axis and the iteration vmapped
            (train_seeds' default, TrainConfig.seed_batching="vmap");
  map       the seeds stacked, run one after another inside the program
            (jax.lax.map; seed_batching="map"): each seed's operations at
            their own size;
  groupsG   G groups of N_SEEDS / G vmapped seeds side by side in one program;
  shard     vmapped, the seed axis sharded over every local device
            (shard_seeds=True; run with XLA_FLAGS=--xla_force_host_platform_device_count=D
            for D CPU devices);
  shardmap  the seed axis sharded, each device running its own seeds in turn
            (shard_seeds=True, seed_batching="map");
  devices   not one program: the seeds split over the local devices, each
            device's share lax.map-ed in its own program, all dispatched at once
            (what one process gets from its devices side by side).
The work is bench_ppo.py's (gymnax Pendulum-v1, rewards x 0.1, ARCH "mlp" or
"lstm", N_ENVS envs x 32 steps, 4 epochs x 4 minibatches, no evaluation), two
iterations per compiled call. One LAYOUT prints one JSON line: compile
seconds, total env-steps/s (median over CALLS calls after the compiling one),
the CPU cores busy (busy-waiting threads count too) and the call times.
``compare`` builds every LAYOUT in one process and times them in turn, one
call each (eight for ``single``) per round, so that the machine's drifts in
speed hit all alike; it prints each layout's median rate and its ratio to
the first layout's, round by round (median and range).
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
from nnx_ppo.algorithms.distributed import seed_mesh, seed_shardings
from nnx_ppo.algorithms.functional import NetworkFn, donatable
from nnx_ppo.algorithms.ppo import compile_iterations, make_optimizer, new_training_state, stack_trees, train_iteration
from nnx_ppo.envs import make
from nnx_ppo.envs.wrappers import RewardScale

ENV = "gymnax:Pendulum-v1"
PER_CALL = 2
ROLLOUT_LENGTH = 32


def steps_per_call(n_envs: int, seeds: int = 1) -> int:
    """Env steps of one compiled call: PER_CALL iterations of every seed's envs."""
    return PER_CALL * n_envs * ROLLOUT_LENGTH * seeds


def build(arch: str, layout: str, n_seeds: int, n_envs: int):
    """The compiled ``fn(state, n)`` and its initial state for ``layout``."""
    raw = make(ENV)
    env = RewardScale(raw, 0.1)
    config = TrainConfig(ppo=PPOConfig(n_envs=n_envs, rollout_length=ROLLOUT_LENGTH,
                                       total_steps=n_envs * ROLLOUT_LENGTH * 100),
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
    if layout == "map":
        fn = compile_iterations(iteration, PER_CALL, batched_seeds=True, seed_batching="map")
        return fn, donatable(stack_trees(states)), n_seeds
    if layout == "devices":
        devices = jax.local_devices()
        size = n_seeds // len(devices)
        fn = compile_iterations(lambda st: jax.lax.map(iteration, st), PER_CALL)
        shares = [jax.device_put(donatable(stack_trees(states[d * size:(d + 1) * size])), device)
                  for d, device in enumerate(devices)]

        def side_by_side(shares, n):
            outs = [fn(share, n) for share in shares]  # asynchronous dispatch: all run at once
            return [o[0] for o in outs], [o[1] for o in outs]

        return side_by_side, shares, n_seeds
    if layout in ("shard", "shardmap"):
        state = donatable(stack_trees(states))
        shardings = seed_shardings(state, seed_mesh(jax.local_devices()))
        fn = compile_iterations(iteration, PER_CALL, batched_seeds=True, shardings=shardings,
                                seed_batching="map" if layout == "shardmap" else "vmap")
        return fn, jax.device_put(state, shardings), n_seeds
    if layout.startswith("groups"):
        groups = int(layout[len("groups"):])
        size = n_seeds // groups
        state = tuple(donatable(stack_trees(states[g * size:(g + 1) * size])) for g in range(groups))
        batched = jax.vmap(iteration)
        return compile_iterations(lambda st: tuple(zip(*[batched(s) for s in st])), PER_CALL), state, n_seeds
    raise SystemExit(f"unknown LAYOUT {layout!r}: single, vmap, map, groupsG, shard, shardmap or devices")


def compare(arch: str, layouts: list[str], n_seeds: int, n_envs: int, rounds: int) -> None:
    """Every layout in one process, timed in turn (see the module's docstring)."""
    n = np.int32(PER_CALL)  # a host value: every layout's program takes it, whatever its devices
    built = {}
    for layout in layouts:
        fn, state, seeds = build(arch, layout, n_seeds, n_envs)
        state, out = fn(state, n)
        jax.block_until_ready((state, out))
        built[layout] = [fn, state, seeds]
    rates = {layout: [] for layout in layouts}
    for _ in range(rounds):
        for layout, entry in built.items():
            fn, state, seeds = entry
            calls = 8 if seeds == 1 else 1
            t0 = time.perf_counter()
            for _ in range(calls):
                state, out = fn(state, n)
            jax.block_until_ready((state, out))
            rates[layout].append(calls * steps_per_call(n_envs, seeds) / (time.perf_counter() - t0))
            entry[1] = state
    first = np.asarray(rates[layouts[0]])
    for layout, rate in rates.items():
        ratio = np.asarray(rate) / first
        print(json.dumps({"arch": arch, "layout": layout, "seeds": built[layout][2], "n_envs": n_envs,
                          "devices": jax.device_count(), "rounds": rounds, "steps_per_s": round(float(np.median(rate))),
                          f"vs_{layouts[0]}": round(float(np.median(ratio)), 2),
                          "range": [round(float(ratio.min()), 2), round(float(ratio.max()), 2)]}))


def main(argv):
    arch, layout = argv[0], argv[1]
    if layout == "compare":
        compare(arch, argv[2].split(","), int(argv[3]), int(argv[4]) if len(argv) > 4 else 256,
                int(argv[5]) if len(argv) > 5 else 8)
        return
    n_seeds = int(argv[2])
    n_envs = int(argv[3]) if len(argv) > 3 else 256
    calls = int(argv[4]) if len(argv) > 4 else 5
    fn, state, seeds = build(arch, layout, n_seeds, n_envs)
    n = np.int32(PER_CALL)  # a host value, so that each device's program takes it ("devices")
    t0 = time.perf_counter()
    state, out = fn(state, n)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - t0
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        state, out = fn(state, n)
        jax.block_until_ready((state, out))
        times.append(time.perf_counter() - t0)
    cores = (time.process_time() - cpu0) / (time.perf_counter() - wall0)  # busy-waiting threads count too
    steps = steps_per_call(n_envs, seeds)
    print(json.dumps({"arch": arch, "layout": layout, "seeds": seeds, "n_envs": n_envs, "devices": jax.device_count(),
                      "compile_s": round(compile_s, 1), "steps_per_s": round(steps / float(np.median(times))),
                      "cpu_cores": round(cores, 2), "call_s": [round(t, 3) for t in times]}))


if __name__ == "__main__":
    main(sys.argv[1:])
