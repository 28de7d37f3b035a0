"""Many hosts on one machine: two `nnx-ppo train` processes on 127.0.0.1
(CPU collectives through gloo), each with 2 forced host devices, train the
same run as one process with 4 devices."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

ARGS = ["cue_memory", "--network", "lstm", "--hidden-size", "8", "--env-kwargs", '{"n_cues": 2, "delay": 3}',
        "--ppo.n-envs", "16", "--ppo.rollout-length", "8", "--ppo.n-minibatches", "2", "--ppo.shuffle-blocks", "4",
        "--ppo.total-steps", "512", "--eval.every-steps", "256", "--eval.n-envs", "8",
        "--eval.max-episode-length", "5", "--checkpoint-every-steps", "256", "--quiet"]
TIMEOUT = 600

# Three JAX processes on 2 cores (about 45 s): `make test ARGS="-m slow"`.
pytestmark = pytest.mark.slow


def _command(run_dir: Path, devices: int, *extra: str) -> tuple[list[str], dict]:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env = {**os.environ, "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])}
    code = "import sys; from nnx_ppo.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, "train", *ARGS, "--run-dir", str(run_dir), *extra], env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(run_dir: Path, seed: int | None = None):
    from flax import nnx

    from nnx_ppo import load_network

    return jax.tree.leaves(nnx.state(load_network(run_dir / "checkpoints", seed=seed), nnx.Param))


def _max_diff(one, two) -> float:
    assert len(one) == len(two)
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) for a, b in zip(one, two))


def _train_one_and_two(root: Path, *extra: str) -> list[str]:
    """One process with 4 devices into ``root/one``; two processes with 2
    each into ``root/two``; returns their outputs."""
    cmd, env = _command(root / "one", 4, *extra)
    reference = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    address = f"127.0.0.1:{_free_port()}"
    workers = []
    for process_id in (0, 1):
        cmd, env = _command(root / "two", 2, *extra, "--coordinator-address", address, "--num-processes", "2",
                            "--process-id", str(process_id))
        workers.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for proc in (reference, *workers):
            out, _ = proc.communicate(timeout=TIMEOUT)
            outputs.append(out)
            assert proc.returncode == 0, out[-3000:]
    finally:
        for proc in (reference, *workers):  # stop whatever still runs, by its own pid
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multihost")
    return root, _train_one_and_two(root)


def test_two_processes_train_what_one_process_with_four_devices_trains(runs):
    root, _ = runs
    diff = _max_diff(_params(root / "one"), _params(root / "two"))
    assert diff < 1e-4, diff


def test_a_seed_batch_sharded_by_seed_over_two_processes(tmp_path):
    """--seeds 0 1 2 3 --shard-seeds: one seed per device, two devices per
    process; every seed's checkpointed parameters equal the one-process run's."""
    _train_one_and_two(tmp_path, "--seeds", "0", "1", "2", "3", "--shard-seeds")
    for seed in (0, 1, 2, 3):
        diff = _max_diff(_params(tmp_path / "one", seed), _params(tmp_path / "two", seed))
        assert diff < 1e-4, (seed, diff)


def test_only_process_zero_writes_the_run_directory(runs):
    root, (_, out0, out1) = runs
    rows = [json.loads(line) for line in (root / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows if not r.get("eval")] == [1, 2, 3, 4]  # one writer
    assert "run directory:" in out0 and "run directory:" not in out1
    steps = sorted(p.name for p in (root / "two" / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert steps == ["step_000000000256", "step_000000000512"]
    assert [p.name for p in (root / "two" / "checkpoints" / "best").iterdir()]  # the best policy, once
