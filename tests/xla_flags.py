"""The suite's quick CPU code generation, and running a test without it.

tests/conftest.py adds ``OPTIMIZATION_OFF`` and ``OLD_EMITTERS`` to XLA_FLAGS
(unless XLA_FLAGS already names an optimization level): the same programs
(HLO), compiled in a fraction of the time, to code that rounds a little
differently. A test whose claim is bit for bit between two compiled programs
runs again in a fresh process: at XLA's defaults, what users compile
(:func:`run_as_users_compile`), or with XLA's own emitters, as the suite ran it
before ``OLD_EMITTERS`` (:func:`run_with_fusion_emitters`).
"""

import os
import subprocess
import sys

# LLVM's optimization off: tests compile many small programs and run each
# briefly, so it costs more than it saves (tests/algorithms/test_ppo.py, 146 s -> 118 s).
OPTIMIZATION_OFF = "--xla_backend_optimization_level=0"
# XLA's older CPU emitters for fused operations compile in about half the time
# of its default fusion emitters: the whole suite (2 workers on 2 cores) took
# 752 CPU-seconds instead of 1,422. XLA aborts on a flag it does not know, so
# conftest.py adds it only where a child process accepts it.
OLD_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def xla_accepts(flag: str) -> bool:
    """Whether XLA (in a child process) starts with ``flag`` in XLA_FLAGS."""
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                           timeout=120)
    return probe.returncode == 0


def _flags() -> list[str]:
    return os.environ.get("XLA_FLAGS", "").split()


def optimization_off() -> bool:
    """Whether this process compiles with LLVM's optimization off (the suite's default)."""
    return OPTIMIZATION_OFF in _flags()


def old_emitters() -> bool:
    """Whether this process compiles with the older emitters (the suite's default)."""
    return OLD_EMITTERS in _flags()


def _run(test_file: str, test_id: str, flags: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{test_file}::{test_id}"],
                          env={**os.environ, "XLA_FLAGS": " ".join(flags)}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def run_as_users_compile(test_file: str, test_id: str) -> None:
    """Run one test of ``test_file`` in a fresh process whose CPU code is
    generated at XLA's defaults (optimization level 2, the fusion emitters)."""
    quick = {OPTIMIZATION_OFF.split("=")[0], OLD_EMITTERS.split("=")[0]}
    flags = [f for f in _flags() if f.split("=")[0] not in quick]
    _run(test_file, test_id, [*flags, "--xla_backend_optimization_level=2"])


def run_with_fusion_emitters(test_file: str, test_id: str) -> None:
    """Run one test of ``test_file`` in a fresh process with the suite's flags
    but XLA's default (fusion) emitters."""
    _run(test_file, test_id, [f for f in _flags() if f != OLD_EMITTERS])
