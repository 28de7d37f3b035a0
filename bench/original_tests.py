"""The original nnx-ppo 0.3.0's own unit tests, run against this library.

    .venv/bin/python bench/original_tests.py [--sdist PATH] [--mode plain|deferred|both]
                                             [--jobs 2] [--timeout 900] [--only SUBSTR] [--keep DIR]
    .venv/bin/python bench/original_tests.py --reclassify bench/results/original_tests.jsonl

Gets the original's sdist (``pip download --no-deps --no-binary :all:
nnx-ppo==0.3.0``, or ``--sdist PATH``), unpacks it in a temporary directory
and copies there only its ``*_test.py`` files and its ``test_dummies``
helpers. A ``conftest.py`` written beside them registers ``test_dummies`` as
the module ``nnx_ppo.test_dummies``, so that ``import nnx_ppo`` is this
library (the one installed in the virtualenv) and only the helpers are the
original's. Nothing of the original is copied into this repository. The
original's own ``conftest.py`` (a jaxtyping/beartype import hook on
``nnx_ppo``) is not used: it would type-check this library's code against
this library's annotations, which is not what the tests test.

Each test file runs in its own pytest process (``-p no:cacheprovider``),
``--jobs`` at a time, with a per-file timeout; the conftest records every
test's outcome as it finishes, so a crash or timeout loses nothing already
run and marks the tests not run yet as failed (``when`` = ``timeout`` or
``crash``). A file that cannot be imported counts each test function in it
(found with ``ast``; a parameterized test counts once) as failed with that
import error.

Two modes (``--mode both``, the default, runs both in turn):

* ``plain``: the test files as they are. This is the measure.
* ``deferred``: a module-level import of a name this library replaced (a
  ``ReplacedImportError`` of ``nnx_ppo/_original_paths.py``) gives a
  placeholder that raises the same error when used, so the other tests of a
  file whose header imports, say, ``LoggingLevel`` still run. It shows what
  the plain mode's import failures hide.

Every failure is classified (``classify``): ``internal`` when the test's
source (its body, its class's ``setUp``, the helpers it calls) names one of
the original's internals (:data:`INTERNAL_NAMES`: its rollout functions,
``ppo_step``, ``gae``, ``compute_metrics``, the distillation step, ...);
else ``documented`` when an entry of :data:`TABLE` (node-id and/or error
pattern, each with its reason and its ``docs/migrating.md`` section)
matches; else ``break``: a difference nobody documented, a bug to fix.

Prints, per mode, one JSON line (totals per class, passes, the pass rate
among the tests that use only public API, i.e. total minus ``internal``,
and whether the bar of 0 breaks and >= 80% holds) and a table, and writes
one JSON line per test and mode to ``bench/results/original_tests.jsonl``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "original_tests.jsonl"
VERSION = "0.3.0"
MIG = "docs/migrating.md#"

# --------------------------------------------------------------------------
# Classification. Each entry: (node-id regex or None, error regex or None,
# class, reason). Both given regexes must match (re.search); the first
# matching entry wins. A failure no entry matches is a "break".
# Node ids look like "algorithms/ppo_test.py::PPOTest::test_name".
# --------------------------------------------------------------------------
DOC, INT = "documented", "internal"

# The original's internals: a failing test whose body (or its class's setUp,
# or a helper it calls) names one of these is class "internal". They are the
# original's rollout, loss, GAE, metrics and distillation-step machinery,
# which this library replaced by other internals (docs/migrating.md lists
# each under "The original's import paths").
INTERNAL_NAMES = {
    "ppo_step": "the original's one-iteration internal (here train_iteration on another state)",
    "gae": "the original's GAE function (here algorithms.ppo.compute_gae, other signature)",
    "ppo_loss": "the original's loss internal",
    "unroll_env": "the original's rollout internal (here collect_rollout)",
    "single_transition": "the original's rollout internal",
    "eval_rollout": "the original's evaluation rollout internal (here nnx_ppo.evaluate)",
    "record_activations_rollout": "the original's recording rollout internal",
    "eval_rollout_for_render_scan": "the original's render rollout internal",
    "unstack_trajectory": "the original's render internal",
    "compute_metrics": "the original's metrics internal over its Transition",
    "log_weight_stats": "the original's metrics internal",
    "distillation_step": "the original's distillation-iteration internal",
    "distillation_single_transition": "the original's distillation rollout internal",
    "distillation_unroll_env": "the original's distillation rollout internal",
    "new_distillation_state": "the original's distillation-state internal",
    "distillation_loss": "the original's distillation loss internal (here another signature)",
    "Transition": "the original's rollout record type (here Trajectory)",
    "DistillationTransition": "the original's distillation rollout record type",
}

# Documented differences, for failing tests that use no internal name.
# (node-id regex or None, error regex or None, reason); both given regexes
# must match (re.search) the node id "file::Class::test" and the error's
# first line; the first matching entry wins. No match: "break".
TABLE: list[tuple[str | None, str | None, str]] = [
    # the PopulationGraph carry, AR1's keyword-only smoothness_weight
    (r"graph_test\.py::.*test_reset_state_zeros_buffer", r"KeyError: 'populations'",
     "the graph carry is {'buffers', 'transforms'} here, not {'populations'}: " + MIG + "networks"),
    (None, r"missing \d+ required keyword-only argument: 'smoothness_weight'",
     "AR1VariationalBottleneck's smoothness_weight is keyword-only and required here: " + MIG + "networks"),
    # imports of names this library replaced, each with its one-line ImportError
    (None, r"ReplacedImportError: nnx_ppo\.algorithms\.types\.LoggingLevel",
     "imports LoggingLevel (no logging levels here, a fixed set of metrics): " + MIG + "metrics"),
    (None, r"ReplacedImportError: nnx_ppo\.algorithms\.checkpointing\."
           r"(make_checkpoint_fn|load_checkpoint|CheckpointCallback)",
     "the original's checkpoint callbacks; here train_ppo(checkpoint_dir=, resume_from=): " + MIG + "checkpoints"),
    (None, r"ReplacedImportError: nnx_ppo\.algorithms\."
           r"(config\.Distillation|distillation\.default_distillation_config)",
     "distillation takes a TrainConfig here: " + MIG + "recording-activations-and-distillation"),
    (None, r"ReplacedImportError: nnx_ppo\.wrappers\.episode_wrapper",
     "EpisodeWrapper is TimeLimit(random_reset_steps=) here: " + MIG + "environments"),
    (None, r"ReplacedImportError: nnx_ppo\.algorithms\."
           r"(ppo\.default_config|config\.(VideoConfig|VideoData|TrainResult))",
     "default_config()/VideoConfig/TrainResult replaced: " + MIG + "configs"),
    # ---- train_ppo's signature
    (None, r"unexpected keyword argument\(s\) 'checkpoint_fn'",
     "train_ppo(checkpoint_fn=) is checkpoint_dir= here: " + MIG + "train_ppo"),
    (None, r"unexpected keyword argument\(s\) '(seed|total_steps)'",
     "train_ppo(seed=, total_steps=) overrides are dataclasses.replace on the config here: " + MIG + "train_ppo"),
    (None, r"unexpected keyword argument\(s\) 'video_fn'",
     "train_ppo(video_fn=) is on_evaluation= here: " + MIG + "train_ppo"),
    (None, r"new_training_state\(\) takes 3 positional arguments",
     "new_training_state is (env, network, config) here: " + MIG + "the-originals-import-paths"),
    # ---- configs
    (r"::test_default_checkpoint_every_steps$", r"None != 500000",
     "TrainConfig.checkpoint_every_steps defaults to None here (500_000 in the original): " + MIG + "configs"),
    (None, r"FrozenInstanceError: cannot assign to field",
     "configs are frozen dataclasses here (dataclasses.replace): " + MIG + "configs"),
    # ---- networks
    (None, r"StatefulModuleOutput\.__init__\(\) takes 1 positional argument",
     "StatefulModuleOutput fields are keyword-only here: " + MIG + "networks"),
    (None, r"PPONetworkOutput\.__init__\(\) takes 1 positional argument",
     "PPONetworkOutput fields are keyword-only here: " + MIG + "networks"),
    (r"^networks/recurrent_test\.py::", r"LSTM\.__init__\(\) got an unexpected keyword argument "
     r"'(use_optimized|gate_fn|activation_fn|\w+_init)'",
     "LSTM has no gate_fn, activation_fn, *_init or use_optimized keywords here: " + MIG + "networks"),
    (r"^networks/recurrent_test\.py::LSTMTest::test_output_shape$", r"'float' object has no attribute 'shape'",
     "regularization_loss is a scalar already averaged over the batch (default 0.0) here, [B] in the original: "
     + MIG + "networks"),
    (r"^networks/delay_test\.py::DelayTest::test_rejects_k_steps_zero$", r"ValueError not raised",
     "Delay accepts k_steps=0 here (k_steps >= 0; the original required >= 1): " + MIG + "networks"),
    (None, r"AR1VariationalBottleneck\.__init__\(\) got an unexpected keyword argument 'ar1_weight'",
     "ar1_weight is smoothness_weight here (keyword-only, weights the sum: ar1_weight / latent_size): "
     + MIG + "networks (AR1VariationalBottleneck paragraph)"),
    (None, r"(AR1)?VariationalBottleneck\.__init__\(\) missing 1 required positional argument: 'kl_weight'",
     "kl_weight has no default here (1.0 in the original): " + MIG + "networks (AR1VariationalBottleneck paragraph)"),
    (r"^networks/variational_test\.py::", r"KeyError: '(l2_diff|mu|sigma)'|Too many indices|"
     r"Tuples differ: \(\) != \(\d+,?\)",
     "module metrics are batch means (scalars) here, per-env arrays in the original, and the bottlenecks do not "
     "log mu and sigma: " + MIG + "metrics"),
]


def internals_of(run: Path, node: str) -> list[str]:
    """The INTERNAL_NAMES a test's source uses: its body, its class's setUp,
    and the module-level functions or methods of its class it calls."""
    parts = node.split("::")
    path = run / parts[0]
    if len(parts) < 2 or not path.exists():
        return []
    tree = ast.parse(path.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    name = re.sub(r"\[.*\]$", "", parts[-1])
    bodies: list[ast.AST] = []
    methods: dict[str, ast.AST] = {}
    if len(parts) == 3:
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == parts[1]), None)
        if cls is not None:
            methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
            bodies += [methods[m] for m in (name, "setUp") if m in methods]
    elif name in funcs:
        bodies.append(funcs[name])
    seen = set()
    used: set[str] = set()
    while bodies:
        b = bodies.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        for n in ast.walk(b):
            ident = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
            if ident is None:
                continue
            if ident in INTERNAL_NAMES:
                used.add(ident)
            if isinstance(n, ast.Name) and ident in funcs:
                bodies.append(funcs[ident])
            if isinstance(n, ast.Attribute) and ident in methods:
                bodies.append(methods[ident])
    return sorted(used)


def classify(node: str, outcome: str, error: str, internals: list[str]) -> tuple[str, str]:
    if outcome in ("passed", "skipped"):
        return outcome, ""
    if internals:
        return INT, "uses the original's internals: " + "; ".join(f"{n} ({INTERNAL_NAMES[n]})" for n in internals)
    m = re.search(r"ReplacedImportError: nnx_ppo\.[\w.]+\.(\w+) is from the original", error or "")
    if m and m.group(1) in INTERNAL_NAMES:
        # the test itself names no internal, but its file imports one at module level
        return INT, f"its file imports the original's internal {m.group(1)} ({INTERNAL_NAMES[m.group(1)]})"
    for node_re, err_re, reason in TABLE:
        if node_re is not None and not re.search(node_re, node):
            continue
        if err_re is not None and not re.search(err_re, error or ""):
            continue
        return DOC, reason
    return "break", "no documented difference or original internal explains it"


# --------------------------------------------------------------------------
# The conftest written into the temporary directory.
# --------------------------------------------------------------------------
CONFTEST = r'''
import importlib.util, json, os, sys
import nnx_ppo  # this library (the installed package)

_HERE = os.path.dirname(os.path.abspath(__file__))
_DUMMIES = os.path.join(_HERE, "_original_test_dummies")
_spec = importlib.util.spec_from_file_location(
    "nnx_ppo.test_dummies", os.path.join(_DUMMIES, "__init__.py"),
    submodule_search_locations=[_DUMMIES])
_mod = importlib.util.module_from_spec(_spec)
sys.modules["nnx_ppo.test_dummies"] = _mod
_spec.loader.exec_module(_mod)
nnx_ppo.test_dummies = _mod

_OUT = os.environ["ORIGINAL_TESTS_OUT"]

if os.environ.get("ORIGINAL_TESTS_DEFER") == "1":
    # --defer-replaced: a module-level import of a name this library replaced
    # gives a placeholder that raises the same ReplacedImportError when used,
    # so the tests of that file that never use the name still run.
    import nnx_ppo._original_paths as _op
    _resolve = _op.resolve

    class _Deferred:
        def __init__(self, path, exc):
            object.__setattr__(self, "_path", path)
            object.__setattr__(self, "_exc", exc)

        def _raise(self, *a, **k):
            raise _op.ReplacedImportError(str(self._exc))

        def __getattr__(self, attr):
            if attr.startswith("__") and attr.endswith("__"):
                raise AttributeError(attr)
            self._raise()

        __call__ = __iter__ = __getitem__ = __or__ = __ror__ = __eq__ = __hash__ = __bool__ = _raise
        __mro_entries__ = _raise

    def resolve(path):
        try:
            return _resolve(path)
        except _op.ReplacedImportError as exc:
            return _Deferred(path, exc)

    _op.resolve = resolve


def _write(rec):
    with open(_OUT, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _error(report):
    lr = report.longrepr
    if getattr(report, "when", "collect") == "collect":  # the import error is the last "E   " line
        elines = [l[4:] for l in str(lr).splitlines() if l.startswith("E   ")]
        if elines:
            return elines[-1]
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return str(lr)


def pytest_collection_finish(session):
    for item in session.items:
        _write({"event": "collected", "node": item.nodeid})


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "collect_error", "node": report.nodeid, "error": _error(report),
                "longrepr": str(report.longrepr)[-4000:]})


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "skipped":
            outcome = "skipped"
        else:
            outcome = report.outcome
        _write({"event": "result", "node": report.nodeid, "when": report.when, "outcome": outcome,
                "duration": report.duration,
                "error": _error(report) if outcome == "failed" else "",
                "longrepr": str(report.longrepr)[-4000:] if outcome == "failed" else ""})
'''


def get_sdist(path: str | None, work: Path) -> Path:
    if path:
        return Path(path)
    d = work / "sdist"
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"nnx-ppo=={VERSION}", "-d", str(d)], check=True, stdout=subprocess.DEVNULL)
    return next(d.glob("nnx_ppo-*.tar.gz"))


def lay_out(sdist: Path, work: Path) -> tuple[Path, list[str]]:
    with tarfile.open(sdist) as tar:
        tar.extractall(work / "src", filter="data")
    pkg = next((work / "src").glob("nnx_ppo-*")) / "nnx_ppo"
    run = work / "run"
    run.mkdir()
    files = []
    for f in sorted(pkg.rglob("*_test.py")):
        rel = f.relative_to(pkg)
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, run / rel)
        files.append(str(rel))
    shutil.copytree(pkg / "test_dummies", run / "_original_test_dummies")
    (run / "conftest.py").write_text(CONFTEST)
    return run, files


def test_functions(path: Path, rel: str) -> list[str]:
    """Node ids of the test methods/functions of a file, read with ast."""
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test"):
                    out.append(f"{rel}::{node.name}::{m.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            out.append(f"{rel}::{node.name}")
    return out


def run_file(run: Path, rel: str, timeout: float, defer: bool = False) -> list[dict]:
    out = run / (rel.replace("/", "__") + ".events.jsonl")
    if out.exists():
        out.unlink()
    env = dict(os.environ, ORIGINAL_TESTS_OUT=str(out), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               PYTHONDONTWRITEBYTECODE="1", ORIGINAL_TESTS_DEFER="1" if defer else "0")
    env.pop("PYTHONPATH", None)
    t0 = time.time()
    status = "done"
    log = run / (rel.replace("/", "__") + ".log")
    with open(log, "w") as logf:
        p = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "--rootdir", str(run), "-o", "addopts=", rel],
                             cwd=run, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc, status = None, "timeout"
    wall = time.time() - t0
    events = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    collected = [e["node"] for e in events if e["event"] == "collected"]
    cerrs = [e for e in events if e["event"] == "collect_error"]
    results: dict[str, dict] = {}
    for e in events:
        if e["event"] != "result":
            continue
        r = results.get(e["node"])
        # keep the first failure (setup/call), then teardown errors if nothing failed before
        if r is None or (r["outcome"] == "passed" and e["outcome"] == "failed"):
            results[e["node"]] = {"node": e["node"], "outcome": e["outcome"], "when": e["when"],
                                  "duration": e["duration"], "error": e["error"], "longrepr": e["longrepr"]}
    recs = []
    if cerrs and not collected:
        err = cerrs[0]
        for node in test_functions(run / rel, rel) or [rel]:
            recs.append({"node": node, "outcome": "failed", "when": "collect", "duration": 0.0,
                         "error": err["error"], "longrepr": err["longrepr"]})
    else:
        for node in collected:
            if node in results:
                recs.append(results[node])
            else:
                recs.append({"node": node, "outcome": "failed", "when": status if status == "timeout" else "crash",
                             "duration": 0.0,
                             "error": "not run: the file's pytest process "
                                      f"{'timed out' if status == 'timeout' else f'ended (rc={rc})'} "
                                      f"before this test finished", "longrepr": log.read_text()[-3000:]})
        if not collected and not cerrs:
            recs.append({"node": rel, "outcome": "failed", "when": "crash", "duration": 0.0,
                         "error": f"pytest collected nothing (rc={rc}, {status})", "longrepr": log.read_text()[-3000:]})
    print(f"  {rel}: {len(recs)} tests, {sum(r['outcome'] == 'passed' for r in recs)} passed, "
          f"{wall:.0f}s{' TIMEOUT' if status == 'timeout' else ''}", file=sys.stderr, flush=True)
    for r in recs:
        r["file"] = rel
        r["file_wall_s"] = round(wall, 1)
        r["internals"] = internals_of(run, r["node"])
    return recs


def first_line(s: str) -> str:
    s = (s or "").strip()
    return s.splitlines()[0][:300] if s else ""


CLASSES = ("passed", "skipped", "documented", "internal", "break")
FIELDS = ("mode", "node", "file", "outcome", "when", "class", "reason", "error", "internals", "duration",
          "file_wall_s", "error_text")


def summarize(recs: list[dict], mode: str, n_files: int, wall: float | None) -> dict:
    counts = {c: sum(r["class"] == c for r in recs) for c in CLASSES}
    total = len(recs)
    public = total - counts["internal"]
    return {
        "bench": "original_tests", "original": f"nnx-ppo {VERSION}", "mode": mode,
        "date": time.strftime("%Y-%m-%d"), "files": n_files, "total": total, **counts,
        "public_api_tests": public,
        "public_pass_rate": round(counts["passed"] / public, 4) if public else None,
        "bar_met": counts["break"] == 0 and public > 0 and counts["passed"] / public >= 0.8,
        "wall_s": None if wall is None else round(wall, 1),
    }


def report(recs: list[dict], summary: dict) -> None:
    print(json.dumps(summary))
    print()
    print(f"mode {summary['mode']}:")
    print(f"{'file':40s} {'total':>5s} {'pass':>5s} {'skip':>5s} {'doc':>5s} {'int':>5s} {'break':>5s}")
    for rel in sorted({r["file"] for r in recs}):
        rs = [r for r in recs if r["file"] == rel]
        c = {k: sum(r["class"] == k for r in rs) for k in CLASSES}
        print(f"{rel:40s} {len(rs):5d} {c['passed']:5d} {c['skipped']:5d} {c['documented']:5d} "
              f"{c['internal']:5d} {c['break']:5d}")
    print(f"{'all':40s} {summary['total']:5d} {summary['passed']:5d} {summary['skipped']:5d} "
          f"{summary['documented']:5d} {summary['internal']:5d} {summary['break']:5d}")
    print(f"pass rate among tests using only public API: {summary['passed']}/{summary['public_api_tests']}"
          f" = {summary['public_pass_rate']}")
    breaks = [r for r in recs if r["class"] == "break"]
    if breaks:
        print("breaks:")
        for r in breaks:
            print(f"  {r['node']}: {r['error']}")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", help="the original's sdist (default: pip download it)")
    ap.add_argument("--jobs", type=int, default=2, help="test files run at once (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per test file (default 900)")
    ap.add_argument("--only", action="append", default=[], help="run only files whose path contains this")
    ap.add_argument("--mode", choices=("plain", "deferred", "both"), default="both",
                    help="plain: the test files as they are (the measure); deferred: a module-level import of a "
                         "name this library replaced gives a placeholder that raises the same ImportError when "
                         "used, so the file's other tests run; both (default): plain, then deferred")
    ap.add_argument("--reclassify", metavar="JSONL",
                    help="run nothing: classify the results in JSONL again with this script's table")
    ap.add_argument("--keep", help="lay the run out in this directory and keep it")
    ap.add_argument("--out", default=str(RESULTS),
                    help="per-test JSON lines (default bench/results/original_tests.jsonl)")
    args = ap.parse_args()

    modes = ["plain", "deferred"] if args.mode == "both" else [args.mode]
    walls: dict[str, float | None] = {}
    n_files = 0
    if args.reclassify:
        recs = [json.loads(line) for line in Path(args.reclassify).read_text().splitlines() if line.strip()]
        modes = [m for m in ("plain", "deferred") if any(r["mode"] == m for r in recs)]
        n_files = len({r["file"] for r in recs})
        walls = {m: None for m in modes}
    else:
        tmp = None
        if args.keep:
            work = Path(args.keep)
            work.mkdir(parents=True, exist_ok=True)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="original_tests_")
            work = Path(tmp.name)
        recs = []
        try:
            sdist = get_sdist(args.sdist, work)
            run, files = lay_out(sdist, work)
            if args.only:
                files = [f for f in files if any(s in f for s in args.only)]
            n_files = len(files)
            for mode in modes:
                print(f"mode {mode}:", file=sys.stderr, flush=True)
                t0 = time.time()
                with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                    defer = mode == "deferred"
                    per_file = list(pool.map(lambda f, d=defer: run_file(run, f, args.timeout, d), files))
                walls[mode] = time.time() - t0
                for rs in per_file:
                    for r in rs:
                        r["mode"] = mode
                        text = (r["error"] or "").strip().splitlines()
                        r["error_text"] = " | ".join(line.strip() for line in text)[:1500]
                        r["error"] = first_line(r["error"])
                        recs.append(r)
        finally:
            if tmp is not None:
                tmp.cleanup()

    for r in recs:
        r["class"], r["reason"] = classify(r["node"], r["outcome"], r.get("error_text") or r["error"], r["internals"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in recs:
            f.write(json.dumps({k: r.get(k) for k in FIELDS}) + "\n")
    for mode in modes:
        rs = [r for r in recs if r["mode"] == mode]
        report(rs, summarize(rs, mode, n_files, walls.get(mode)))


if __name__ == "__main__":
    main()
