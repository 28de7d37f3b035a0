"""One run, one runner: train, sweep and resume write, lock and resume a run
directory the same way (each test is a case that failed before).

Budgets are tiny: cue_memory with 2 cues and a delay of 2, an LSTM of width
8, 8 envs x 16 steps, 1024 env steps."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo.runner import RunSpec

TINY = [
    "cue_memory", "--env-kwargs", '{"n_cues": 2, "delay": 2}', "--network", "lstm", "--hidden-size", "8",
    "--ppo.n-envs", "8", "--ppo.n-minibatches", "2", "--ppo.rollout-length", "16", "--ppo.n-epochs", "1",
    "--eval.n-envs", "8", "--eval.max-episode-length", "16", "--ppo.total-steps", "1024",
    "--eval.every-steps", "512", "--checkpoint-every-steps", "512", "--quiet",
]


def _one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("nnx-ppo: error:")]
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    return lines[0]


def _last_step(run: Path) -> int:
    return max(r["env_steps"] for r in rd.read_metrics(run))


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("train") / "run"
    assert cli.main(["train", *TINY, "--ppo.reward-scale", "10", "--run-dir", str(run)]) == 0
    return run


def test_resume_of_a_sweep_through_train_keeps_the_sweep(tmp_path, capsys):
    """Case 1 and 4: ``train --resume SWEEP`` used to fail, then rewrite
    config.json without its members (the sweep was lost); ``sweep --resume
    --ppo.total-steps N`` trained nothing. Every spelling now continues the
    sweep with the flags given, and config.json only gains a ``resumed`` entry."""
    run = tmp_path / "sweep"
    # Without learning-rate decay the longer budgets leave the program as it was: the
    # resumes load it from the compilation cache (a resume with a longer decay:
    # tests/test_cli.py::test_distill_a_run_into_a_gru_then_eval_it).
    assert cli.main(["sweep", *TINY, "--ppo.no-learning-rate-decay", "--grid", "ppo.learning-rate=3e-3,3e-4",
                     "--run-dir", str(run)]) == 0
    before = json.loads((run / rd.CONFIG_FILE).read_text())
    assert cli.main(["train", "--resume", str(run), "--ppo.total-steps", "1536"]) == 0
    assert _last_step(run) == 1536
    assert cli.main(["sweep", "--resume", str(run), "--ppo.total-steps", "2048"]) == 0
    assert _last_step(run) == 2048
    after = json.loads((run / rd.CONFIG_FILE).read_text())
    assert {k: v for k, v in after.items() if k != "resumed"} == {k: v for k, v in before.items() if k != "resumed"}
    assert [e["changes"] for e in after["resumed"]] == [{"ppo.total_steps": [1024, 1536]},
                                                        {"ppo.total_steps": [1536, 2048]}]
    assert rd.read_run_config(run)["config"]["ppo"]["total_steps"] == 2048
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--member", "1", "--episodes", "2"]) == 0


def test_resume_refuses_what_makes_the_run_and_records_what_it_changes(train_run, capsys):
    """Case 4: ``--seed 5`` was accepted on resume and written into
    config.json (the parameters came from seed 0), and ``--ppo.n-epochs``
    changed silently. A refused change is one line naming the flag, and
    writes nothing; an accepted one is printed and recorded."""
    config = (train_run / rd.CONFIG_FILE).read_text()
    for flag, value in (("--seed", "5"), ("--ppo.n-envs", "16"), ("--hidden-size", "16")):
        capsys.readouterr()
        assert cli.main(["resume", str(train_run), flag, value]) == 2
        assert flag in _one_error_line(capsys.readouterr().err)
        assert (train_run / rd.CONFIG_FILE).read_text() == config
    assert cli.main(["resume", str(train_run), "--ppo.n-epochs", "2"]) == 0  # already trained: nothing to do
    out = capsys.readouterr().out
    assert "--ppo.n-epochs 2 (was 1)" in out and "nothing to do" in out
    assert (train_run / rd.CONFIG_FILE).read_text() == config


def test_reward_scale_is_one_thing_and_returns_are_in_env_units(train_run):
    """Case 3: ``train --reward-scale 10`` scaled the logged training
    returns (above the env's maximum) while ``sweep`` did not. There is one
    reward scale, ``--ppo.reward-scale``, and returns are in env units."""
    saved = rd.read_run_config(train_run)
    assert saved["config"]["ppo"]["reward_scale"] == 10 and "reward_scale" not in saved
    returns = [r["train/episode_return"] for r in rd.read_metrics(train_run)
               if isinstance(r.get("train/episode_return"), float)]
    assert returns and max(returns) <= 1.0  # cue_memory pays at most 1 per episode
    with pytest.raises(SystemExit):  # no second spelling (tyro names --ppo.reward-scale)
        cli.main(["train", "--reward-scale", "10", "--print-config"])


_HOLDER = textwrap.dedent("""
    import sys, time
    from nnx_ppo.runner import RunLock
    RunLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(120)
""")


def test_a_second_run_into_a_locked_directory_is_refused(tmp_path, capsys):
    """Case 2: two ``train --run-dir SAME`` both ran and interleaved their
    metrics and checkpoints. The second is refused in one line naming the
    holder's pid; a lock left by a killed process is taken over with a warning."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert cli.main(["train", *TINY, "--run-dir", str(run)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert f"pid {holder.pid}" in line and "in use by another run" in line
        assert cli.main(["sweep", *TINY, "--grid", "ppo.learning-rate=1e-3,3e-4", "--run-dir", str(run)]) == 2
        assert f"pid {holder.pid}" in _one_error_line(capsys.readouterr().err)
        assert sorted(p.name for p in run.iterdir()) == [rd.LOCK_FILE]
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with rd.RunLock(run):
            assert (run / rd.LOCK_FILE).read_text() == str(os.getpid())
    assert any(f"pid {holder.pid}" in str(w.message) and "taking it over" in str(w.message) for w in caught)
    assert sorted(p.name for p in run.iterdir()) == []  # released cleanly: no lock file


def test_a_failed_start_leaves_no_directory_behind(tmp_path, capsys):
    """The lock is taken before anything is checked; a start refused after
    it (an unknown network keyword) leaves no directory of its own."""
    run = tmp_path / "run"
    assert cli.main(["train", *TINY, "--network-kwargs", '{"no_such": 1}', "--run-dir", str(run)]) == 2
    _one_error_line(capsys.readouterr().err)
    assert not run.exists()


def test_a_vanished_config_is_written_again(tmp_path):
    """Case 6: config.json deleted while training was never written again,
    so eval and resume refused the run afterwards."""
    content = {"env": "cue_memory", "network": {"kind": "mlp"}, "config": {}}
    rd.write_run_config(tmp_path, content)
    logger = rd.RunLogger(tmp_path, steps_per_iteration=8, tensorboard=False, config=content)
    try:
        logger({"train/episode_return": 1.0}, 8)
        (tmp_path / rd.CONFIG_FILE).unlink()
        with pytest.warns(rd.RunOutputWarning, match="had vanished"):
            logger({"train/episode_return": 1.0}, 16)
    finally:
        logger.close()
    assert json.loads((tmp_path / rd.CONFIG_FILE).read_text()) == content


def test_resume_without_a_checkpoint_is_one_line_and_writes_nothing(tmp_path, capsys):
    """Case 6: a sweep killed before its first checkpoint, then ``sweep
    --resume``: it printed "resuming", wrote an empty sweep.md, then a
    FileNotFoundError (exit 1)."""
    run = tmp_path / "sweep"
    content = RunSpec(env="cue_memory", env_kwargs={"n_cues": 2, "delay": 2},
                      network={"kind": "lstm", "hidden_size": 8}, config=cli.TrainCommand().config,
                      command=("nnx-ppo", "sweep")).to_dict()
    content.update(members=[{"seed": 0, "hyperparameters": {}}], population={"seeds": [0]})
    run.mkdir()
    rd.write_run_config(run, content)
    assert cli.main(["sweep", "--resume", str(run)]) == 2
    captured = capsys.readouterr()
    assert "no checkpoints to resume from" in _one_error_line(captured.err) and captured.out == ""
    assert sorted(p.name for p in run.iterdir()) == [rd.CONFIG_FILE]


def test_a_value_the_config_refuses_is_its_own_line(capsys):
    """Case 7: a value a config refuses printed a 7-line box naming
    ``__tyro-dummy-inner__.config.ppo``."""
    for argv, message in (
        (["train", "--ppo.total-steps", "0"], "PPOConfig.total_steps must be a positive integer, got 0"),
        (["train", "--ppo.n-envs", "6", "--ppo.n-minibatches", "4"], "must be divisible by n_minibatches"),
        (["sweep", "--eval.n-envs", "-1", "--grid", "ppo.learning-rate=1e-3"], "EvalConfig.n_envs"),
    ):
        assert cli.main(argv) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert message in line and "tyro" not in line


@pytest.mark.slow  # a process of its own, compiling a sweep (train's Ctrl-C: tests/test_cli.py)
def test_stopping_a_sweep_says_how_to_continue(tmp_path):
    """Case 4: Ctrl-C on a sweep printed a finished-looking table and no
    "stopped early; continue with ..." line."""
    run = tmp_path / "sweep"
    argv = [*TINY, "--grid", "ppo.learning-rate=1e-3,3e-4", "--run-dir", str(run), "--ppo.total-steps", "200000",
            "--eval.every-steps", "100000", "--checkpoint-every-steps", "100000"]
    proc = subprocess.Popen([sys.executable, "-m", "nnx_ppo.cli", "sweep", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not rd.read_metrics(run) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "stopped early; continue with: nnx-ppo resume " in out


def test_resuming_a_read_only_run_is_one_line(train_run, capsys, monkeypatch):
    """Case 6: ``train --resume`` of a read-only run directory printed an
    18-line OSError traceback. (The test runs as root, whom permissions do
    not stop, so the directory's writability is what os.access answers.)"""
    config = (train_run / rd.CONFIG_FILE).read_text()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != train_run / rd.METRICS_FILE
                        and real_access(path, mode))
    assert cli.main(["resume", str(train_run), "--ppo.total-steps", "2048"]) == 2
    assert f"{train_run / rd.METRICS_FILE} is not writable" in _one_error_line(capsys.readouterr().err)
    assert (train_run / rd.CONFIG_FILE).read_text() == config


def test_a_run_spec_is_its_config_json(tmp_path):
    """RunSpec.to_dict is config.json (with the schema version and an empty
    resume history); RunSpec.load reads the same spec back, with the changes
    its resumes recorded applied."""
    config = cli.TrainCommand().config
    spec = RunSpec(env="cue_memory", network={"kind": "lstm", "hidden_size": 8}, config=config,
                   env_kwargs={"delay": 2}, train_env_kwargs={"random_reset_steps": 3}, seeds=(0, 1),
                   extra={"preset": {"env": "cue_memory", "network": "lstm"}}, command=("nnx-ppo", "train"))
    content = spec.to_dict()
    assert content["schema"] == rd.SCHEMA_VERSION and content["resumed"] == [] and content["seeds"] == [0, 1]
    rd.write_run_config(tmp_path, content)
    assert RunSpec.load(tmp_path) == spec
    longer = dataclasses.replace(config, ppo=dataclasses.replace(config.ppo, total_steps=2 * config.ppo.total_steps))
    rd.append_resumed(tmp_path, {"ppo.total_steps": [config.ppo.total_steps, longer.ppo.total_steps]}, ["resume"])
    assert RunSpec.load(tmp_path) == dataclasses.replace(spec, config=longer)
