"""Processes of one run that disagree on its settings refuse to start,
instead of training apart until one waits forever. Two JAX processes on
127.0.0.1: marked slow like tests/algorithms/test_multihost.py."""

import subprocess

import pytest

from tests.algorithms.test_multihost import _command, _free_port

pytestmark = pytest.mark.slow


def test_processes_with_other_settings_refuse_to_start(tmp_path):
    address = f"127.0.0.1:{_free_port()}"
    workers = []
    for process_id, steps in ((0, "512"), (1, "1024")):
        cmd, env = _command(tmp_path / "run", 1, "--coordinator-address", address, "--num-processes", "2",
                            "--process-id", str(process_id))
        cmd[cmd.index("--ppo.total-steps") + 1] = steps
        workers.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in workers]
    finally:
        for proc in workers:  # stop whatever still runs, by its own pid
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, out in zip(workers, outputs):
        assert proc.returncode == 2, out[-2000:]
        assert "processes [1] were started with other settings (flags) than process 0" in out, out[-2000:]
