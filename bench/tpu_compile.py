"""Compile one jitted function of a script for a TPU v5e, with or without the chip, and say where the compile goes.

Usage: python bench/tpu_compile.py [--profile] [--hlo FILE] [--trace FILE] [--top 15] TARGET -- SCRIPT.py [ARGS...]

Runs ``SCRIPT.py ARGS`` (as ``python SCRIPT.py ARGS`` would, in this
process) until it first calls a function jitted by ``jax.jit`` whose
Python name is ``TARGET`` (``run``: this library's training program,
``compile_iterations``'s; ``ppo_step``: the original nnx-ppo's). That call
is not run: the function is lowered for its arguments' shapes and compiled
for one TPU v5e chip, and the process prints one JSON line and exits.

On a machine with a TPU the chip's own device is the target. Without one,
libtpu compiles for the topology ``v5e:1x1`` (``jax.experimental.topologies``),
on this machine's CPU: the same compiler as on the chip when libtpu is the
chip machine's version (0.0.42.1 with JAX 0.10.2), so the optimized HLO,
the kernels and the memory plan are the chip's, but the compile takes longer
on fewer cores (its kernels are emitted on one thread per core). On a
2-core machine one kernel's emission now and then stalls for 50-110 s (a
different kernel each time; not under ``taskset -c 0``, not on the chip,
whose slowest kernel took 11 s), so compare totals over repeated runs and
read ``--profile``'s kernel list for outliers. Install
it beside this checkout's venv, without touching the venv::

    python -m pip install --no-deps --target /tmp/libtpu-site libtpu==0.0.42.1
    PYTHONPATH=/tmp/libtpu-site python bench/tpu_compile.py run -- bench/bench_intention.py \\
        --lstm-decoder --n-envs 1024 --iterations 2 --no-check --replay-unroll 20

(``--replay-unroll``: on a CPU host the library would pick the CPU's
default, 1.) ``TPU_ACCELERATOR_TYPE`` and ``TPU_WORKER_HOSTNAMES`` are set
for libtpu when absent. ``LIBTPU_INIT_ARGS`` applies as on the chip.

The line holds the lowering and compile seconds, the optimized program's
size (lines of HLO text, before and after optimization) and its temporary
memory. ``--profile`` compiles inside ``jax.profiler.trace`` and adds the
compiler's phases as its events name them (``phases``: seconds; the HLO
passes and the main fusion pass run on one thread, the kernels are then
emitted on many, the code generator runs on one) and the kernels that took
longest to emit (``kernels``: name, seconds, the fusion's output shape).
``--hlo`` writes the optimized HLO, ``--trace`` keeps the trace
(``.xplane.pb``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

from compile_profile import run_script, self_times, split_command

PHASES = ("XLA::TPU run hlo passes", "XLA::TPU main fusion pass", "XLA::TPU memory space and buffer assignment",
          "XLA::TPU lowering and optimization", "XLA::TPU code generator")
"""The compiler's phases, in order, as its trace events name them."""
EMITTING = "XLA::TPU emitting for "


def tpu_sharding():
    """A sharding on one TPU v5e: this machine's chip, or the ``v5e:1x1`` topology's device."""
    import jax
    from jax.sharding import SingleDeviceSharding

    if jax.default_backend() == "tpu":
        return SingleDeviceSharding(jax.devices()[0])
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(topology_name="v5e:1x1", platform="tpu",
                                            chips_per_host_bounds=(1, 1, 1), num_slices=1)
    return SingleDeviceSharding(topology.devices[0])


def function_name(fun) -> str:
    """The Python name of a jitted callable (looked for through flax's and functools' wrappers)."""
    seen = set()
    while fun is not None and id(fun) not in seen:
        seen.add(id(fun))
        if isinstance(getattr(fun, "__name__", None), str):
            return fun.__name__
        fun = next((getattr(fun, a) for a in ("f", "fun", "__wrapped__") if hasattr(fun, a)), None)
    return ""


def trace_summary(trace_file: str, hlo: str, top: int) -> dict:
    """``phases`` (seconds of each of :data:`PHASES`) and the ``top`` slowest ``kernels`` to emit, from a trace
    (each event's duration summed over the host's threads: ``compile_profile.self_times``'s inclusive times)."""
    _, _, inclusive = self_times(trace_file)
    phases = {name: inclusive[name] / 1e3 for name in PHASES}
    kernels = collections.Counter({name[len(EMITTING):]: ms / 1e3 for name, ms in inclusive.items()
                                   if name.startswith(EMITTING)})

    def shape(name: str) -> str:
        found = re.search(r"\n  %" + re.escape(name) + r" = (\S+)", hlo)
        return found.group(1).split("{")[0] if found else "?"

    return {"phases": {name.replace("XLA::TPU ", ""): round(phases[name], 2) for name in PHASES},
            "emitting_s": round(sum(kernels.values()), 1), "kernels_emitted": len(kernels),
            "kernels": [[name, round(s, 2), shape(name)] for name, s in kernels.most_common(top)]}


def compile_for_tpu(jitted, name: str, args: tuple, kwargs: dict, options) -> None:
    """Lower and compile ``jitted`` for the arguments' shapes on a TPU v5e; print the JSON line and exit."""
    import jax

    sharding = tpu_sharding()
    on_tpu = lambda x: (jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
                        if isinstance(x, jax.Array) else x)
    args, kwargs = jax.tree.map(on_tpu, (args, kwargs))
    start = time.perf_counter()
    lowered = jitted.lower(*args, **kwargs)
    lower_s = time.perf_counter() - start
    trace_dir = tempfile.mkdtemp(prefix="tpu_compile_") if options.profile else None
    if options.profile:
        jax.profiler.start_trace(trace_dir)
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    hlo = compiled.as_text()
    row = {"target": name, "script": options.script, "args": options.script_args,
           "chip": jax.default_backend() == "tpu", "lower_s": round(lower_s, 1), "compile_s": round(compile_s, 1),
           "hlo_lines_before": lowered.as_text("hlo").count("\n"), "hlo_lines": hlo.count("\n"),
           "temp_mib": round(compiled.memory_analysis().temp_size_in_bytes / 2**20),
           "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS")}
    if options.profile:
        jax.profiler.stop_trace()
        [trace] = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
        row.update(trace_summary(trace, hlo, options.top))
        if options.trace:
            shutil.copy(trace, options.trace)
    if options.hlo:
        with open(options.hlo, "w") as f:
            f.write(hlo)
    print(json.dumps(row), flush=True)
    os._exit(0)  # the script is not run further


def main(argv=None) -> None:
    own, script, script_args = split_command(sys.argv[1:] if argv is None else argv, __doc__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="the Python name of the jitted function to compile")
    parser.add_argument("--profile", action="store_true", help="also the compiler's phases and slowest kernels")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--hlo", default=None, help="write the optimized HLO here")
    parser.add_argument("--trace", default=None, help="keep the profiler's trace here")
    options = parser.parse_args(own)
    options.script, options.script_args = script, script_args
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    import jax

    plain_jit = jax.jit

    class Intercepted:
        """The jitted ``TARGET``: its first call compiles for the TPU instead of running."""

        def __init__(self, jitted, name):
            self.jitted, self.name = jitted, name

        def __getattr__(self, attr):
            return getattr(self.jitted, attr)

        def __call__(self, *args, **kwargs):
            compile_for_tpu(self.jitted, self.name, args, kwargs, options)

    def jit(fun=None, *args, **kwargs):
        if fun is None:  # used as @jax.jit(...)
            return lambda f: jit(f, *args, **kwargs)
        jitted = plain_jit(fun, *args, **kwargs)
        return Intercepted(jitted, options.target) if function_name(fun) == options.target else jitted

    jax.jit = jit
    run_script(script, script_args)
    sys.exit(f"tpu_compile.py: {options.script} never called a jitted function named {options.target!r}")


if __name__ == "__main__":
    main()
