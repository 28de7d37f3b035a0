"""Where a script's compile time goes: the host's share of a ``jax.profiler`` trace, by event.

Usage: python bench/compile_profile.py [--top 30] [--out FILE.json] -- SCRIPT.py [SCRIPT ARGS...]

Runs ``SCRIPT.py`` (as ``python SCRIPT.py ARGS`` would, in this process)
inside ``jax.profiler.trace`` and sums the host's events by name: JAX's
Python (tracing, lowering: ``$file.py:line function`` events), and XLA's
compiler, whose passes and phases are events of their own (on a CPU
``CpuCompiler::RunBackend``, ``FusionCompiler::Compile``, ...; on a TPU the
TPU compiler's). Each event's *self* time is its duration less that of the
events nested in it on the same thread, so the heaviest ones say what the
host spends its time on. The self times of all threads add up to
``host_busy_s``, above the wall time where threads run at once (XLA
compiles on a pool of threads; an event that waits for one, such as
``backend_compile_and_load``, counts its wait as its own). Device events
are left out.

Meant for a short run whose time is mostly its compile (e.g.
``bench_intention.py --iterations 2 --skip 1 --no-check``), and for two
such runs side by side: this project's and the original nnx-ppo's
(``peers/original_intention.py``, which needs only JAX of this script).
Prints one JSON line: the wall seconds, ``host_busy_s``, and the ``--top``
events by self time (milliseconds, count, inclusive milliseconds).
"""

import argparse
import collections
import glob
import json
import os
import runpy
import sys
import tempfile
import time


def self_times(trace_file: str) -> tuple[dict, dict, dict]:
    """``(self ms, count, inclusive ms)`` by event name over the host planes of ``trace_file`` (an ``.xplane.pb``)."""
    from jax.profiler import ProfileData

    own, count, inclusive = collections.Counter(), collections.Counter(), collections.Counter()
    for plane in ProfileData.from_file(trace_file).planes:
        if not plane.name.startswith("/host"):
            continue
        for line in plane.lines:
            open_events = []  # [end ns, name, duration ns, ns of the events nested in it], outermost first
            for event in sorted(line.events, key=lambda e: (e.start_ns, -e.duration_ns)):
                while open_events and open_events[-1][0] <= event.start_ns:
                    _close(open_events.pop(), own)
                if open_events:
                    open_events[-1][3] += event.duration_ns
                open_events.append([event.start_ns + event.duration_ns, event.name, event.duration_ns, 0])
                count[event.name] += 1
                inclusive[event.name] += event.duration_ns / 1e6
            while open_events:
                _close(open_events.pop(), own)
    return own, count, inclusive


def _close(event: list, own: collections.Counter) -> None:
    """Add a finished event's self time (its duration less its nested events') to ``own``."""
    _, name, duration, nested = event
    own[name] += max(duration - nested, 0) / 1e6


def split_command(argv: list[str], doc: str) -> tuple[list[str], str, list[str]]:
    """``OPTIONS -- SCRIPT.py ARGS`` as ``(OPTIONS, SCRIPT.py, ARGS)``; without
    ``--``, exit with the usage (``doc``'s second paragraph)."""
    if "--" not in argv:
        sys.exit(doc.split("\n\n")[1])
    split = argv.index("--")
    return argv[:split], argv[split + 1], argv[split + 2:]


def run_script(script: str, script_args: list[str]) -> None:
    """Run ``script`` as ``python script script_args`` would, in this
    process (its folder first on ``sys.path``); its exit with status 0 ends
    only the script."""
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise


def main(argv=None) -> None:
    own, script, script_args = split_command(sys.argv[1:] if argv is None else argv, __doc__)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", default=None, help="also write the JSON line to this file")
    args = parser.parse_args(own)

    import jax

    trace_dir = tempfile.mkdtemp(prefix="compile_profile_")
    started = time.perf_counter()
    with jax.profiler.trace(trace_dir):
        run_script(script, script_args)
    wall = time.perf_counter() - started
    trace_file = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[-1]
    own, count, inclusive = self_times(trace_file)
    package = sys.modules.get("nnx_ppo")  # which nnx_ppo ran: this project's or the original (its own PYTHONPATH)
    row = {"script": " ".join([script, *script_args]),
           "nnx_ppo": None if package is None else {"version": getattr(package, "__version__", None),
                                                    "path": os.path.dirname(getattr(package, "__file__", "") or "")},
           "wall_s": round(wall, 1),
           "host_busy_s": round(sum(own.values()) / 1e3, 1),
           "events": [{"name": name, "self_ms": round(ms, 1), "count": count[name],
                       "inclusive_ms": round(inclusive[name], 1)} for name, ms in own.most_common(args.top)]}
    line = json.dumps(row)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
