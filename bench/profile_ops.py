"""Where one compiled call's time goes, by XLA operation (CPU).

Usage: python bench/profile_ops.py ARCH LAYOUT N_SEEDS [N_ENVS] [TOP]

Builds ``seed_layouts.py``'s program for ARCH/LAYOUT/N_SEEDS, runs it once to
compile, then traces one more call with the JAX profiler (XLA:CPU's
per-operation trace events switched on) and prints, for each kind of
operation (the HLO name without its number: ``dot``, ``ynn_fusion``,
``add_multiply_fusion``, ...), its time in milliseconds per seed and
iteration, largest first (TOP rows, default 15). Run it pinned to one core
(``taskset -c 0``) to compare the work of two layouts without the second
core's help, e.g. ``single`` against ``vmap 8``. Tracing costs time per operation, so the
sums exceed the untraced wall time (most for many short operations): compare
kinds of operations between layouts, and take rates from seed_layouts.py.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

import collections  # noqa: E402
import glob  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from profile_iteration import device_events  # noqa: E402
from seed_layouts import PER_CALL, build  # noqa: E402

CONTAINERS = ("ThunkExecutor", "while", "call", "conditional")


def op_times(trace_dir: str) -> collections.Counter:
    """Nanoseconds per operation kind, summed over XLA's worker threads
    (loops and the executor's own spans left out: they contain the rest);
    the trace read by ``profile_iteration.device_events``."""
    path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[-1]
    totals = collections.Counter()
    for name, _, duration in device_events(path, module_prefix="")[0]:
        if not name.startswith(CONTAINERS):
            totals[re.sub(r"\.\d+$", "", name)] += duration
    return totals


def main(argv):
    arch, layout, n_seeds = argv[0], argv[1], int(argv[2])
    n_envs = int(argv[3]) if len(argv) > 3 else 256
    top = int(argv[4]) if len(argv) > 4 else 15
    fn, state, seeds = build(arch, layout, n_seeds, n_envs)
    n = np.int32(PER_CALL)
    state, out = fn(state, n)
    jax.block_until_ready((state, out))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        state, out = fn(state, n)
        jax.block_until_ready((state, out))
        jax.profiler.stop_trace()
        totals = op_times(trace_dir)
    per = 1e6 * PER_CALL * seeds  # ns -> ms per seed and iteration
    print(f"{arch} {layout} x{seeds} seeds, {n_envs} envs: ms per seed and iteration")
    for name, ns in totals.most_common(top):
        print(f"  {name:36s} {ns / per:8.2f}")
    print(f"  {'all operations':36s} {sum(totals.values()) / per:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
