"""Where one PPO iteration's time goes, by part, from a device trace of steady iterations.

Usage: python bench/profile_iteration.py [--decoder mlp|lstm] [--n-envs 1024] [--rollout 20]
                                         [--skip 2] [--iterations 3] [--out DIR] [--keep-trace]
                                         [--set FIELD=VALUE ...]
       python bench/profile_iteration.py analyze TRACE.xplane.pb[.gz] HLO.txt[.gz] [ITERATIONS]
       python bench/profile_iteration.py ops PROFILE.json HLO.txt[.gz] PART [TOP]

Trains the intention network at the rodent users' size on the stand-in env
(exactly ``bench_intention.py``'s work, through ``train_ppo``), lets
``--skip`` iterations pass (the first compiles), then records
``--iterations`` iterations with ``jax.profiler``. Every operation the
device ran is attributed to the part of the iteration it belongs to by the
name scope in its HLO metadata (``nnx_ppo/algorithms``: ``rollout/policy``,
``rollout/env_step``, ``rollout/truncation_bootstrap``, ``rollout/env_reset``,
``rollout/last_values``, ``advantages``, ``update/minibatch_gather``,
``update/loss`` forward and backward (``transpose(...)`` in the name),
``update/optimizer``, ``statistics``), read from the optimized HLO that XLA
dumps (``--xla_dump_to``). FLOPs and bytes of each operation come from the
trace's own statistics where the device reports them, else FLOPs from the
HLO's dot and convolution shapes (multiply-adds counted as 2).

Prints one JSON line: per part the device milliseconds per iteration, the
share of the iteration, GFLOP and GB per iteration and the rates they give;
the device's busy time against the wall time per iteration (the rest is
host work and launch gaps between the compiled calls); the heaviest
operations. ``--out`` also keeps the per-operation table (JSON) and the HLO
text it names (gzipped, about 0.5 MB: each operation's shapes), and with
``--keep-trace`` the raw ``.xplane.pb``. ``ops`` reads such a table and its
HLO again and lists one part's time by kind of operation and the shape it
produces (``ops profile_lstm_1024.json hlo_lstm_1024.txt.gz update/other``).
"""

from __future__ import annotations

import os
import sys
import tempfile

# Run as a script, XLA dumps the optimized training program (read by dumped_hlo) and, on a CPU, traces each
# operation; set before JAX is imported. Imported (bench_rodent.py uses the analysis), nothing is set.
_DUMP = tempfile.mkdtemp(prefix="nnx_ppo_hlo_") if __name__ == "__main__" else None
if _DUMP is not None:
    os.environ["XLA_FLAGS"] = " ".join([
        os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={_DUMP}", "--xla_dump_hlo_as_text",
        "--xla_dump_hlo_module_re=.*jit_run.*", "--xla_cpu_enable_xprof_traceme=true"]).strip()

import argparse  # noqa: E402
import collections  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PARTS = (  # (part, name-scope pattern), most specific first; an op matches the first pattern in its op_name
    ("rollout/policy", "rollout/policy"),
    ("rollout/env_step", "rollout/env_step"),
    ("rollout/truncation_bootstrap", "rollout/truncation_bootstrap"),
    ("rollout/env_reset", "rollout/env_reset"),
    ("rollout/last_values", "rollout/last_values"),
    ("rollout/other", "rollout"),
    ("advantages", "advantages"),
    ("update/minibatch_gather", "update/minibatch_gather"),
    ("update/loss_backward", "update/loss/transpose"),
    ("update/loss_forward", "update/loss"),
    ("update/optimizer", "update/optimizer"),
    ("update/other", "update"),
    ("statistics", "statistics"),
)
_CONTAINERS = ("while", "conditional", "call")  # ops that contain others: their time is their children's


OTHER = "other (metrics, health, loop)"


def part_of(op_name: str, parts=PARTS) -> str:
    """The part (of ``parts``, ``(name, scope pattern)`` pairs) an operation
    with HLO ``op_name`` metadata belongs to: its path keeps only the scope
    names the patterns use (JAX puts ``while/body``, ``closed_call`` and
    transforms between them), with ``transpose`` where the backward pass
    starts."""
    scopes = {name for _, pattern in parts for name in pattern.split("/")} - {"transpose"}
    kept = []
    for component in op_name.split("/"):
        if "transpose(" in component and "transpose" not in kept:
            kept.append("transpose")
        name = component.replace("transpose(", "").replace("jvp(", "").replace(")", "")
        if name in scopes:
            kept.append(name)
    path = "/".join(kept)
    for part, pattern in parts:
        if path == pattern or path.startswith(pattern + "/"):
            return part
    return OTHER


_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([a-z][\w\-]*)\((.*)$")
_SHAPE = re.compile(r"^\(?(bf16|f16|f32|f64|s32|u32|s8|u8|pred|s64|u64|token)\[([\d,]*)\]")
_ARRAY = re.compile(r"\b(bf16|f16|f32|f64|s32|u32|s16|u16|s8|u8|pred|s64|u64)\[([\d,]*)\]")
_ITEMSIZE = {"bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
             "s8": 1, "u8": 1, "pred": 1}
_NO_TRAFFIC = ("while", "conditional", "call", "tuple", "get-tuple-element", "bitcast", "parameter", "constant",
               "after-all", "partition-id", "replica-id")


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _product_flops(opcode: str, line: str, out: list[int], operands: list[str], shapes: dict) -> float:
    """FLOPs of a dot or a convolution (multiply-adds as 2), from its shapes."""
    if opcode == "dot":
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
        lhs = shapes.get(operands[0]) if operands else None
        if lhs is None or contracting is None:
            return 0.0
        return 2.0 * math.prod(out) * math.prod(lhs[d] for d in _dims(contracting.group(1)))
    labels = re.search(r"dim_labels=\w+_(\w+)->", line)
    rhs = shapes.get(operands[1]) if len(operands) > 1 else None
    if labels is None or not rhs or "o" not in labels.group(1):
        return 0.0
    return 2.0 * math.prod(out) * math.prod(rhs) / max(rhs[labels.group(1).index("o")], 1)


def _array_bytes(type_text: str) -> list[int]:
    """Bytes of each array in an HLO type (a tuple has several)."""
    return [_ITEMSIZE[t] * math.prod(_dims(d)) for t, d in _ARRAY.findall(type_text)]


def _fused_traffic(body: list[tuple[str, str, list[str]]], sizes: dict[str, list[int]]) -> float:
    """Bytes a fused computation reads and writes (``body``: its instructions
    as ``(name, opcode, operands..., )``): a parameter read only through
    dynamic slices counts the slices, one updated in place (operand 0 of a
    dynamic-update-slice) nothing; an output made by a dynamic-update-slice
    counts its update, any other output its size."""
    by_name = {name: (op, operands) for name, op, operands in body}
    uses: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for name, _, operands in body:
        for i, operand in enumerate(operands):
            uses[operand].append((name, i))
    total = 0.0
    for name, opcode, _ in body:
        if opcode != "parameter":
            continue
        read = 0.0
        for user, index in uses[name]:
            user_opcode = by_name[user][0]
            if user_opcode == "dynamic-slice" and index == 0:
                read += sum(sizes.get(user, [0]))
            elif user_opcode == "dynamic-update-slice" and index == 0:
                pass
            else:
                read = float(sum(sizes.get(name, [0])))
                break
        total += read
    root_name, root_opcode, root_operands = body[-1]
    for out in (root_operands if root_opcode == "tuple" else [root_name]):
        opcode, operands = by_name.get(out, ("", []))
        total += sum(sizes.get(operands[1], [0])) if opcode == "dynamic-update-slice" else sum(sizes.get(out, [0]))
    return total


def _traffic(opcode: str, out: list[int], operands: list[int], line: str) -> float:
    """Bytes a (non-fused) operation reads and writes, from its shapes. Async
    copies (``-start``/``-done``: prefetches between memories, overlapping
    other work) and the chip's bitcasting custom calls count nothing."""
    if (opcode in _NO_TRAFFIC or opcode.endswith("-done") or opcode.endswith("-start")
            or (opcode == "custom-call" and "Bitcast" in line)):
        return 0.0
    if opcode == "dynamic-slice":
        return 2.0 * sum(out)
    if opcode == "dynamic-update-slice":
        return 2.0 * (operands[1] if len(operands) > 1 else 0)
    return float(sum(out) + sum(operands))


def read_hlo(text: str) -> tuple[dict[str, str], dict[str, float], dict[str, float]]:
    """``({instruction: op_name}, {instruction: FLOPs}, {instruction: bytes})``
    of an optimized HLO module's text; a fusion's FLOPs are those of the dots
    and convolutions it calls, its bytes what it reads and writes in memory
    (:func:`_fused_traffic`; other operations :func:`_traffic`)."""
    op_names: dict[str, str] = {}
    flops: dict[str, float] = {}
    traffic: dict[str, float] = {}
    sizes: dict[str, list[int]] = {}
    bodies: dict[str, list] = collections.defaultdict(list)
    computation_flops: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, str] = {}
    shapes: dict[str, list[int]] = {}
    computation = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if head and line.rstrip().endswith("{"):
            computation = head.group(1)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        s = _SHAPE.match(shape)
        shapes[name] = _dims(s.group(2)) if s else []
        sizes[name] = _array_bytes(shape)
        operand_names = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
        if computation:
            bodies[computation].append((name, opcode, operand_names))
        traffic[name] = _traffic(opcode, sizes[name], [sum(sizes.get(o, [0])) for o in operand_names], line)
        meta = re.search(r'op_name="([^"]*)"', line)
        if meta:
            op_names[name] = meta.group(1)
        called = re.search(r"calls=%([\w.\-]+)", line)
        if called:
            calls[name] = called.group(1)
        if opcode in ("dot", "convolution") and s:
            f = _product_flops(opcode, line, _dims(s.group(2)), operand_names, shapes)
            flops[name] = f
            if computation:
                computation_flops[computation] += f
    for name, called in calls.items():
        flops[name] = flops.get(name, 0.0) + computation_flops.get(called, 0.0)
        if "fusion" in name and bodies.get(called):
            traffic[name] = _fused_traffic(bodies[called], sizes)
    return op_names, flops, traffic


def device_events(trace_file: str, module_prefix: str = "jit_run") -> tuple[list[tuple], list[float]]:
    """``([(op, start_ns, duration_ns)], [program durations])`` of the device's
    operations (the device plane's ``XLA Ops`` line; on a CPU, XLA's thunk
    executor events) and of the training program's executions."""
    from jax.profiler import ProfileData

    ops, modules = [], []
    for plane in ProfileData.from_file(trace_file).planes:
        device = plane.name.startswith("/device:")
        for line in plane.lines:
            for event in line.events:
                if device and line.name == "XLA Modules" and event.name.startswith(module_prefix):
                    modules.append(event.duration_ns)
                elif device and line.name == "XLA Ops":
                    ops.append((event.name.split(" ")[0].lstrip("%"), event.start_ns, event.duration_ns))
                elif not device and plane.name == "/host:CPU":
                    stats = dict(event.stats)
                    if "hlo_op" in stats and stats.get("hlo_module", module_prefix).startswith(module_prefix):
                        ops.append((stats["hlo_op"], event.start_ns, event.duration_ns))
    return ops, modules


def breakdown(ops: list[tuple], op_names: dict[str, str], flops_of: dict[str, float], bytes_of: dict[str, float],
              iterations: int, parts_of=PARTS) -> dict:
    """Per part and per operation: self time (an operation's time less that
    of the operations nested in it: a loop's own time is its control flow
    and the gaps between its steps), GFLOP and count, per iteration. An
    operation without a scope of its own (a copy XLA added) takes that of the
    operation it runs inside."""
    parts: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    by_op: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    order = sorted(ops, key=lambda e: (e[1], -e[2]))
    stack: list[list] = []  # [end, part, index]
    self_ns = [float(d) for _, _, d in order]
    part_of_event = []
    for i, (name, start, duration) in enumerate(order):
        while stack and stack[-1][0] <= start:
            stack.pop()
        part = part_of(op_names[name], parts_of) if name in op_names else None
        if stack:
            self_ns[stack[-1][2]] -= duration
            if part is None or part == OTHER:
                part = stack[-1][1] if stack[-1][1] != OTHER or part is None else part
        part = part or OTHER
        part_of_event.append(part)
        stack.append([start + duration, part, i])
    for (name, _, _), part, ns in zip(order, part_of_event, self_ns):
        for table, key in ((parts, part), (by_op, name)):
            table[key]["ms"] += ns / 1e6 / iterations
            table[key]["gflop"] += flops_of.get(name, 0.0) / 1e9 / iterations
            table[key]["gb"] += bytes_of.get(name, 0.0) / 1e9 / iterations
            table[key]["count"] += 1.0 / iterations
        by_op[name]["part"] = part
    return {"parts": parts, "by_op": by_op}


def summary(table: dict, modules: list[float], iterations: int, top: int) -> dict:
    """The JSON fields of the breakdown: parts by time, the device's busy time, the heaviest operations."""
    busy = sum(p["ms"] for p in table["parts"].values())
    parts = {}
    for part, p in sorted(table["parts"].items(), key=lambda kv: -kv[1]["ms"]):
        parts[part] = {"ms": round(p["ms"], 3), "share": round(p["ms"] / max(busy, 1e-9), 3),
                       "gflop": round(p["gflop"], 1), "tflops": round(p["gflop"] / max(p["ms"], 1e-9), 1),
                       "gb": round(p["gb"], 2), "gb_per_s": round(p["gb"] / max(p["ms"], 1e-9) * 1e3),
                       "ops": round(p["count"])}
    heaviest = sorted(table["by_op"].items(), key=lambda kv: -kv[1]["ms"])[:top]
    return {
        "module_ms_per_iteration": round(sum(modules) / 1e6 / iterations, 2) if modules else None,
        "device_busy_ms_per_iteration": round(busy, 2),
        "gflop_per_iteration": round(sum(p["gflop"] for p in table["parts"].values()), 1),
        "gb_per_iteration": round(sum(p["gb"] for p in table["parts"].values()), 2),
        "parts": parts,
        "top_ops": [{"op": name, "part": v["part"], "ms": round(v["ms"], 3), "gflop": round(v["gflop"], 2),
                     "gb": round(v["gb"], 3), "per_iteration": round(v["count"], 1)} for name, v in heaviest],
    }


def analyze(trace_file: str, hlo_text: str, iterations: int, top: int = 12, parts=PARTS,
            module_prefix: str = "jit_run") -> tuple[dict, dict]:
    """The summary fields and the per-operation table of a trace and its
    program's HLO (``parts``: how to name them; ``module_prefix``: the
    program's name in the trace)."""
    op_names, flops_of, bytes_of = read_hlo(hlo_text)
    ops, modules = device_events(trace_file, module_prefix)
    if modules:  # the trace may open inside an iteration already running (the driver dispatches ahead): count
        iterations = sum(modules) / max(modules)  # the traced share of program runs, not the calls made
    table = breakdown(ops, op_names, flops_of, bytes_of, iterations, parts)
    return summary(table, modules, iterations, top), table["by_op"]


def dumped_hlo(dump: str, name: str = "") -> str:
    """The text of the largest optimized module XLA dumped (whose file name holds ``name``)."""
    files = [f for f in glob.glob(os.path.join(dump, f"*{name}*after_optimizations*.txt")) if "buffer" not in f]
    return open(max(files, key=os.path.getsize)).read() if files else ""


def operation_kinds(by_op: dict, hlo: str, part: str) -> list[tuple[str, str, float, float]]:
    """``[(kind, shape, ms, count)]`` per iteration of ``part``'s operations in a
    per-operation table (``--out``'s ``profile_*.json``), the heaviest first: one
    kind is an HLO opcode or fusion name without its number (``copy-done``,
    ``fusion``), with the shape of what it produces, read from the ``hlo`` it was
    profiled with."""
    produced = {}
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m:
            shape = _SHAPE.match(m.group(2))
            produced[m.group(1)] = f"{shape.group(1)}[{shape.group(2)}]" if shape else m.group(2)[:40]
    kinds: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for name, op in by_op.items():
        if op["part"] == part:
            kind = kinds[(re.sub(r"\.\d+$", "", name), produced.get(name, "?"))]
            kind[0] += op["ms"]
            kind[1] += op["count"]
    return sorted(((k, shape, ms, n) for (k, shape), (ms, n) in kinds.items()), key=lambda row: -row[2])


def main(argv):
    if argv[:1] == ["ops"]:  # what a part's time is spent on, by operation kind and shape
        with open(argv[1]) as f:
            by_op = json.load(f)["by_op"]
        with (gzip.open if argv[2].endswith(".gz") else open)(argv[2], "rt") as f:
            hlo = f.read()
        for kind, shape, ms, count in operation_kinds(by_op, hlo, argv[3])[:int(argv[4]) if len(argv) > 4 else 20]:
            print(f"{ms:8.3f} ms  x{count:6.0f}  {kind}  {shape}")
        return
    if argv[:1] == ["analyze"]:  # a trace and HLO kept with --keep-trace, analyzed again (no device needed)
        trace, hlo_file, iterations = argv[1], argv[2], int(argv[3]) if len(argv) > 3 else 3
        opener = gzip.open if hlo_file.endswith(".gz") else open
        with opener(hlo_file, "rt") as f:
            hlo = f.read()
        if trace.endswith(".gz"):
            with gzip.open(trace, "rb") as src, tempfile.NamedTemporaryFile(suffix=".xplane.pb", delete=False) as dst:
                shutil.copyfileobj(src, dst)
            trace = dst.name
        print(json.dumps(analyze(trace, hlo, iterations)[0]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decoder", choices=("mlp", "lstm"), default="mlp")
    parser.add_argument("--n-envs", type=int, default=1024)
    parser.add_argument("--rollout", type=int, default=20)
    parser.add_argument("--skip", type=int, default=2, help="iterations before the trace (the first compiles)")
    parser.add_argument("--iterations", type=int, default=3, help="iterations traced")
    parser.add_argument("--out", default=None, help="folder for the per-operation table (and the raw trace)")
    parser.add_argument("--keep-trace", action="store_true", help="also copy the raw trace to --out")
    parser.add_argument("--top", type=int, default=12, help="heaviest operations listed")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a PPOConfig field for this run, e.g. --set precision=bfloat16")
    args = parser.parse_args(argv)

    from bench_intention import make_env
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.algorithms.trainer import train_ppo
    from nnx_ppo.networks.factories import INTENTION_USERS_SIZE, count_parameters, make_intention_network

    env = make_env()
    net = make_intention_network(env, nnx.Rngs(0), decoder=args.decoder, **INTENTION_USERS_SIZE)
    per_iteration = args.n_envs * args.rollout
    overrides = {}
    for item in args.set:
        field, value = item.split("=", 1)
        overrides[field] = json.loads(value) if value[:1] in "0123456789-[{tfn" else value
    total = args.skip + args.iterations
    config = TrainConfig(
        ppo=PPOConfig(n_envs=args.n_envs, rollout_length=args.rollout, total_steps=total * per_iteration,
                      n_epochs=4, n_minibatches=4, discounting_factor=0.97, learning_rate=1e-4, **overrides),
        eval=EvalConfig(enabled=False),
    )
    trace_dir = tempfile.mkdtemp(prefix="nnx_ppo_trace_")
    times: list[float] = []

    def log_fn(metrics, steps):
        jax.block_until_ready(0)
        times.append(time.perf_counter())
        done = steps // per_iteration
        if done == args.skip:
            jax.profiler.start_trace(trace_dir)
        elif done == total:
            jax.profiler.stop_trace()

    start = time.perf_counter()
    result = train_ppo(env, net, config, log_fn=log_fn)
    wall_per_iteration = (times[-1] - times[args.skip - 1]) / args.iterations
    trace = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[-1]
    hlo = dumped_hlo(_DUMP)
    fields, by_op = analyze(trace, hlo, args.iterations, args.top)
    row = {
        "device": jax.devices()[0].device_kind, "decoder": args.decoder, "n_envs": args.n_envs,
        "rollout": args.rollout, "parameters": count_parameters(net), "overrides": overrides,
        "compile_s": round(result.compile_seconds, 1), "total_s": round(time.perf_counter() - start, 1),
        "wall_ms_per_iteration": round(wall_per_iteration * 1e3, 2),
        "steady_sps": round(per_iteration / wall_per_iteration), **fields,
    }
    print(json.dumps(row), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = f"{args.decoder}_{args.n_envs}" + "".join(f"_{k}-{v}" for k, v in overrides.items())
        with open(os.path.join(args.out, f"profile_{tag}.json"), "w") as f:
            json.dump({**row, "by_op": by_op}, f)
        with gzip.open(os.path.join(args.out, f"hlo_{tag}.txt.gz"), "wt") as f:  # the table's operations, shaped
            f.write(hlo)
        if args.keep_trace:
            with open(trace, "rb") as src, gzip.open(os.path.join(args.out, f"trace_{tag}.xplane.pb.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)


if __name__ == "__main__":
    main(sys.argv[1:])
