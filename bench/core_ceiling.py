"""The most any layout of S seeds can gain on this CPU: one seed per core, in separate processes.

Usage: python bench/core_ceiling.py ARCH [ROUNDS] [CALLS] [N_ENVS]

Starts three worker processes, each holding ``seed_layouts.py``'s one-seed
program for ARCH ("mlp" or "lstm") compiled and warm: one free to use every
core, and one pinned to each of cores 0 and 1 (``taskset``). Each round
times CALLS calls of the free process alone, of the core-0 process alone,
and of both pinned processes at once, and prints the total env-steps/s of
each, how much faster the free seed is than the pinned one (what XLA gains
from the second core for one seed) and the ratio of the two pinned
processes to the free one; the last line gives the medians and ranges over
ROUNDS rounds. Two independent programs, one per core, with nothing shared
but the machine, are the ceiling of what running seeds side by side can
give over one seed that uses the cores as XLA sees fit (the one-by-one
reference of ``bench_seeds.py``); only doing less work per seed could pass
it. Linux only (``taskset``).
"""

import json
import os
import statistics
import subprocess
import sys
import time


def worker(arch: str, n_envs: int) -> None:
    """Compile the one-seed program, print ``ready STEPS`` (env steps per
    call), then for each line ``K`` on stdin run K calls and print the
    seconds they took."""
    import jax
    import numpy as np
    from seed_layouts import PER_CALL, build, steps_per_call

    fn, state, _ = build(arch, "single", 1, n_envs)
    n = np.int32(PER_CALL)
    state, _ = fn(state, n)
    jax.block_until_ready(state)
    print("ready", steps_per_call(n_envs), flush=True)
    for line in sys.stdin:
        start = time.perf_counter()
        for _ in range(int(line)):
            state, _ = fn(state, n)
        jax.block_until_ready(state)
        print(time.perf_counter() - start, flush=True)


def start(arch: str, n_envs: int, cpu: str | None) -> tuple[subprocess.Popen, int]:
    """A worker process (pinned to ``cpu`` if given) and its env steps per call."""
    pin = ["taskset", "-c", cpu] if cpu is not None else []
    cmd = pin + [sys.executable, os.path.abspath(__file__), "--worker", arch, str(n_envs)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    word, _, steps = proc.stdout.readline().partition(" ")
    if word != "ready":
        raise SystemExit(f"worker {' '.join(cmd)} did not start")
    return proc, int(steps)


def timed(procs: list[subprocess.Popen], calls: int) -> float:
    """Run ``calls`` calls in every process at once; the slowest one's seconds."""
    for proc in procs:
        proc.stdin.write(f"{calls}\n")
        proc.stdin.flush()
    return max(float(proc.stdout.readline()) for proc in procs)


def main(argv):
    arch = argv[0]
    rounds = int(argv[1]) if len(argv) > 1 else 8
    calls = int(argv[2]) if len(argv) > 2 else 8
    n_envs = int(argv[3]) if len(argv) > 3 else 256
    workers = [start(arch, n_envs, cpu) for cpu in (None, "0", "1")]
    free, *pinned = [proc for proc, _ in workers]
    steps = calls * workers[0][1]
    second_core, ceiling = [], []
    try:
        for r in range(rounds):
            free_rate = steps / timed([free], calls)
            core_rate = steps / timed(pinned[:1], calls)
            pair_rate = len(pinned) * steps / timed(pinned, calls)
            second_core.append(free_rate / core_rate)
            ceiling.append(pair_rate / free_rate)
            print(json.dumps({"round": r, "free_steps_per_s": round(free_rate),
                              "one_core_steps_per_s": round(core_rate),
                              "one_per_core_steps_per_s": round(pair_rate),
                              "free_vs_one_core": round(free_rate / core_rate, 2),
                              "one_per_core_vs_free": round(pair_rate / free_rate, 2)}), flush=True)
    finally:
        for proc in (free, *pinned):
            proc.stdin.close()
            proc.wait()
    summary = lambda xs: [round(statistics.median(xs), 2), round(min(xs), 2), round(max(xs), 2)]
    print(json.dumps({"arch": arch, "n_envs": n_envs, "rounds": rounds,
                      "free_vs_one_core [median, min, max]": summary(second_core),
                      "one_per_core_vs_free [median, min, max]": summary(ceiling)}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1:])
