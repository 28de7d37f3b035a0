"""A run of several processes stops and fails as one: Ctrl-C on one process
stops all of them with a checkpoint; a process that never joins, or dies,
ends the others within --distributed-timeout with one line. Two JAX
processes on 127.0.0.1, each bounded and stopped by its own pid: marked
slow like tests/algorithms/test_multihost.py."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

from nnx_ppo import runner as rd
from tests.algorithms.test_multihost import _command, _free_port

pytestmark = pytest.mark.slow

LONG = "200000"  # env steps: far more than a test waits for


def _start(run: Path, process_ids, address: str, *extra: str) -> list[subprocess.Popen]:
    workers = []
    for process_id in process_ids:
        cmd, env = _command(run, 1, "--coordinator-address", address, "--num-processes", "2",
                            "--process-id", str(process_id), *extra)
        cmd[cmd.index("--ppo.total-steps") + 1] = LONG
        workers.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return workers


def _wait_for_rows(run: Path, workers, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not [r for r in rd.read_metrics(run) if not r.get("eval")]:
        assert time.monotonic() < deadline, "training did not start"
        assert all(w.poll() is None for w in workers), [w.communicate()[0][-2000:] for w in workers]
        time.sleep(1)


def _finish(workers, seconds: float) -> list[tuple[int, str, float]]:
    """Each worker's (exit code, output, seconds it took from now); kills what outlives ``seconds``."""
    t0, ended = time.monotonic(), []
    try:
        for proc in workers:
            out, _ = proc.communicate(timeout=max(1.0, seconds - (time.monotonic() - t0)))
            ended.append((proc.returncode, out, time.monotonic() - t0))
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return ended


def test_ctrl_c_on_one_process_stops_every_process_with_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    workers = _start(run, (0, 1), f"127.0.0.1:{_free_port()}")
    _wait_for_rows(run, workers)
    workers[0].send_signal(signal.SIGINT)
    ended = _finish(workers, 180)
    for code, out, _ in ended:
        assert code == 0, out[-3000:]
    assert "stopped early" in ended[0][1]
    steps = max(r["env_steps"] for r in rd.read_metrics(run))
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert f"step_{steps:012d}" in saved, saved
    assert not list((run / "checkpoints").glob(".tmp*")) and not list((run / "checkpoints").glob("*.tmp*"))


def test_a_process_that_never_joins_ends_the_run_in_one_line(tmp_path):
    [alone] = _start(tmp_path / "run", (0,), f"127.0.0.1:{_free_port()}", "--distributed-timeout", "10")
    [(code, out, seconds)] = _finish([alone], 120)
    assert code == 1, out[-3000:]
    assert seconds < 90
    errors = [line for line in out.splitlines() if line.startswith("nnx-ppo: error:")]
    assert errors and "did not join within 10 s" in errors[0], out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_a_process_that_dies_ends_the_others_in_one_line(tmp_path):
    run = tmp_path / "run"
    workers = _start(run, (0, 1), f"127.0.0.1:{_free_port()}", "--distributed-timeout", "15")
    _wait_for_rows(run, workers)
    workers[1].kill()
    [(code, out, seconds)] = _finish(workers[:1], 120)
    workers[1].wait()
    assert code == 1 and seconds < 90, (code, seconds, out[-3000:])
    errors = [line for line in out.splitlines() if line.startswith("nnx-ppo: error:")]
    assert errors and "process 1" in errors[-1], out[-3000:]
    print(f"process 0 ended {seconds:.0f} s after process 1 was killed: {errors[-1]}")
