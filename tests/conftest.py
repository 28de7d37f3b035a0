"""Suite-wide settings: strict JAX broadcasting, quick CPU code generation,
one compilation cache per run, the longest test files first."""

import os
import shutil
import tempfile

from tests.xla_flags import OLD_EMITTERS, OPTIMIZATION_OFF, xla_accepts

# Quick CPU code generation (tests/xla_flags.py): the programs (HLO) are
# unchanged; benchmarks and users compile at XLA's defaults, and the few tests
# whose claim is bit for bit between two programs run again without it. The xdist
# workers and the processes the tests start inherit the flags. Set
# XLA_FLAGS=--xla_backend_optimization_level=2 to run the suite at the defaults.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    flags = [OPTIMIZATION_OFF, *([OLD_EMITTERS] if xla_accepts(OLD_EMITTERS) else [])]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()

import jax  # noqa: E402  (after XLA_FLAGS)

from nnx_ppo.algorithms.ppo import enable_compilation_cache  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# Many tests compile the same program again (a resumed run, the same network
# trained twice, the CLI in a fresh process). A persistent compilation cache,
# fresh for every run and shared by the xdist workers and the subprocesses the
# tests start (they inherit the environment), compiles each program once. The
# cached executable is the one XLA built for that program, so results do not
# change; only the second compile is skipped.
_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_MIN_SECONDS_VARIABLE = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Programs compiled faster than this are not cached. Small programs repeat too (an
# env's reset for the same number of envs, an evaluation): measured on 5 files at
# 0.5 s and at 0.1 s, 203 and 191 CPU-seconds (two runs each).
_MIN_SECONDS = "0.1"
_own_cache: list[str] = []


def pytest_configure(config):
    if os.environ.get(_CACHE_VARIABLE) is None and not hasattr(config, "workerinput"):
        # The controller (or a run without xdist) creates the directory;
        # xdist workers and test subprocesses find it in the environment.
        _own_cache.append(tempfile.mkdtemp(prefix="nnx-ppo-test-xla-cache-"))
        os.environ[_CACHE_VARIABLE] = _own_cache[0]
        os.environ.setdefault(_MIN_SECONDS_VARIABLE, _MIN_SECONDS)
    if os.environ.get(_CACHE_VARIABLE):
        seconds = float(os.environ.get(_MIN_SECONDS_VARIABLE, _MIN_SECONDS))
        enable_compilation_cache(os.environ[_CACHE_VARIABLE], seconds)


def pytest_unconfigure(config):
    for directory in _own_cache:
        shutil.rmtree(directory, ignore_errors=True)


# The longest files first (seconds per file in a 2-worker run on a 2-core
# machine), so that no worker is left alone with one of them at the end. The
# Makefile passes --no-loadscope-reorder: otherwise xdist orders the files by
# their number of tests, not by this order.
_FIRST = (
    "test_ppo.py",                # 285 s
    "test_docs.py",               # 280
    "test_sharding.py",           # 150 (one subprocess)
    "test_cli.py",                # 140
    "test_replay_consistency.py", # 115
    "test_examples.py",           # 75 (measured at LLVM level 0; the older figures at the default)
    "test_population.py",         # 60 (2026-12-03, with a benchmark running beside it)
    "test_one_runner.py",         # 100 (2026-12-04)
    "test_python_run_dir.py",     # 50
    "test_original_protocol.py",  # 50 (its quick cases)
    "test_export_and_network_errors.py",  # 45
    "test_failed_members.py",     # 40
    "test_sweep.py",              # 40
    "test_distillation.py",       # 75
    "test_learning.py",           # 75
    "test_modular_body.py",       # 45 (2026-12-04, under load)
    "test_seeds.py",              # 60
    "test_adapters.py",           # 55
    "test_policy.py",             # 45
    "test_truncated_checkpoint.py",  # 25
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(_FIRST)))  # stable: the rest keep their order
