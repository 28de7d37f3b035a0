"""What a run directory's data goes through (issue 52): metrics.jsonl
checked before a resume compiles (a bad row named by file and line, the
resume not recorded), damaged lines reported, a half-written last line
skipped quietly and not continued by the next row; a Ctrl-C during a
checkpoint write waits for it to end; training metrics plotted; the one-line
messages (progress rate, unknown config fields) and the package metadata."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo._app import runs as app_runs

REPO = Path(__file__).resolve().parents[2]
TINY = ["--network", "mlp", "--hidden-size", "8", "--ppo.n-envs", "8", "--ppo.n-minibatches", "2",
        "--ppo.rollout-length", "16", "--ppo.n-epochs", "1", "--eval.n-envs", "4",
        "--eval.max-episode-length", "8", "--quiet"]
STEPS = 8 * 16  # env steps per iteration


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run of 2 iterations (an evaluation after each)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli.main(["train", *TINY, "--ppo.total-steps", str(2 * STEPS), "--eval.every-steps", str(STEPS),
                     "--run-dir", str(run)]) == 0
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _lines(run: Path) -> list[str]:
    return (run / rd.METRICS_FILE).read_text().splitlines()


def _write_lines(run: Path, lines: list[str], end: str = "\n") -> None:
    (run / rd.METRICS_FILE).write_text("\n".join(lines) + end)


def _one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def _data_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, rd.RunDataWarning)]


# --------------------------------------------------------------------------- 1. metrics.jsonl


def test_a_bad_row_stops_a_resume_before_it_compiles_and_is_not_recorded(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    lines = _lines(run)
    row = json.loads(lines[1])
    row["env_steps"] = "abc"
    lines[1] = json.dumps(row)
    _write_lines(run, lines)
    before = {name: (run / name).read_bytes() for name in (rd.CONFIG_FILE, rd.METRICS_FILE)}
    capsys.readouterr()
    assert cli.main(["resume", str(run), "--ppo.total-steps", str(4 * STEPS)]) == 2
    out, err = capsys.readouterr()
    error = _one_line(err)
    assert str(run / rd.METRICS_FILE) in error and "line 2" in error and "env_steps" in error, error
    assert "compiling" not in out  # refused before the training step compiled
    assert {name: (run / name).read_bytes() for name in before} == before  # the resume is not recorded
    assert json.loads((run / rd.CONFIG_FILE).read_text())["resumed"] == []


def test_damaged_lines_are_reported_and_a_half_written_last_line_is_not(tmp_path):
    rows = [{"env_steps": STEPS * (i + 1), "iteration": i + 1, "train/episode_return": 0.1 * i} for i in range(4)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(2, '{"env_steps": 256, "train/epi')  # damaged: line 3
    lines.insert(4, "\x00\x00\x00")  # line 5
    lines.append('{"env_steps": 640, "iter')  # the last line, half written
    tmp_path.joinpath(rd.METRICS_FILE).write_text("\n".join(lines))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert rd.read_metrics(tmp_path) == rows
    [message] = _data_warnings(record)
    assert str(tmp_path / rd.METRICS_FILE) in message
    assert re.search(r"\blines 3, 5 \(", message), message  # not the half-written last line (7)
    formatted = app_runs.format_warning(record[0].message, record[0].category, record[0].filename, record[0].lineno)
    assert _one_line(formatted).startswith("nnx-ppo: warning: ") and formatted.count("\n") == 1

    half = tmp_path / "half"
    half.mkdir()
    _write_lines(half, [json.dumps(r) for r in rows] + ['{"env_steps": 640, "iter'], end="")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert rd.read_metrics(half) == rows
    assert not _data_warnings(record)


def test_plot_reports_the_lines_it_skips(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    lines = _lines(run)
    _write_lines(run, [*lines[:1], "not json", *lines[1:]])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cli.main(["plot", str(run), "--out", str(tmp_path / "plot.png")]) == 0
    [message] = _data_warnings(record)
    assert str(run / rd.METRICS_FILE) in message and re.search(r"\bline 2\b", message)


def test_a_resume_reports_damaged_lines_and_keeps_every_new_row(trained, tmp_path):
    """A damaged middle line is reported and the resume goes on; a half-written
    last line is skipped quietly, and the first new row is not appended to it (and lost)."""
    run = _copy(trained, tmp_path)
    lines = _lines(run)
    damaged = len(lines) // 2 + 1  # the line number it gets
    _write_lines(run, [*lines[:damaged - 1], "{damaged", *lines[damaged - 1:], '{"env_steps": 300, "iter'], end="")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert cli.main(["resume", str(run), "--ppo.total-steps", str(4 * STEPS)]) == 0
    messages = _data_warnings(record)
    assert messages and all(m == messages[0] for m in messages), messages
    assert re.search(rf"\bline {damaged}\b", messages[0]) and str(run / rd.METRICS_FILE) in messages[0]
    iterations = [r["iteration"] for r in rd.read_metrics(run) if not r.get("eval")]
    assert iterations == list(range(1, 5))
    assert [json.loads((run / rd.CONFIG_FILE).read_text())["resumed"][0]["changes"]] == [
        {"ppo.total_steps": [2 * STEPS, 4 * STEPS]}]


# --------------------------------------------------------------------------- 2. Ctrl-C during a checkpoint write


def _committed(root: Path) -> list[Path]:
    from nnx_ppo.algorithms import checkpointing

    return sorted(p for p in root.rglob("step_*") if checkpointing.latest_checkpoint(p) == p)


def _leftovers(root: Path) -> list[Path]:
    from orbax.checkpoint.path import atomicity  # orbax writes a checkpoint into a temporary sibling first

    return [p for p in root.rglob(f"*{atomicity.TMP_DIR_SUFFIX}*")]


def test_ctrl_c_twice_during_a_checkpoint_write_lets_it_finish(tmp_path, monkeypatch):
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from nnx_ppo.algorithms import checkpointing
    from nnx_ppo.algorithms.config import TrainConfig
    from nnx_ppo.runner import StopFlag

    save = ocp.Checkpointer.save  # the write that CheckpointManager.save makes

    def ctrl_c_twice_then_save(self, *args, **kwargs):
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python runs the handler between bytecodes of the main thread
                pass
        save(self, *args, **kwargs)

    monkeypatch.setattr(ocp.Checkpointer, "save", ctrl_c_twice_then_save)
    said = []
    with StopFlag(said.append) as stop, pytest.raises(KeyboardInterrupt):
        checkpointing.save_policy(tmp_path, {"w": jnp.arange(6.0)}, {}, TrainConfig(), step=STEPS)
    assert stop() and len(said) == 1  # the first Ctrl-C asked for a stop, the second aborted: after the write
    assert [p.name for p in _committed(tmp_path)] == [f"step_{STEPS:012d}"] and not _leftovers(tmp_path)


_INTERRUPTED_SAVE = """
import asyncio, os, signal, sys
from orbax.checkpoint._src import asyncio_utils
from nnx_ppo import cli

run_sync, pending = asyncio_utils.run_sync, [2]

def ctrl_c_twice(coro):  # Ctrl-C, then again once the first was handled, while the first save's event loop runs
    async def interrupted():
        while pending[0]:
            pending[0] -= 1
            os.kill(os.getpid(), signal.SIGINT)
            flag = getattr(signal.getsignal(signal.SIGINT), "__self__", None)  # the runner's StopFlag
            for _ in range(500):  # two Ctrl-C's the handler has not yet seen would count once
                await asyncio.sleep(0.01)
                if getattr(flag, "requested", True):
                    break
        return await coro
    return run_sync(interrupted())

asyncio_utils.run_sync = ctrl_c_twice
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_second_ctrl_c_during_a_save_ends_quietly_with_the_save_complete(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_SAVE, "train", *TINY, "--ppo.total-steps", str(8 * STEPS),
         "--checkpoint-every-steps", str(STEPS), "--run-dir", str(run)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out
    for noise in ("Traceback", "never awaited", "Exception ignored"):
        assert noise not in out, out
    assert _one_line(proc.stderr).startswith("nnx-ppo: error: aborted"), out
    assert len(_committed(run / rd.CHECKPOINT_DIR)) == 1 and not _leftovers(run / rd.CHECKPOINT_DIR), out


# --------------------------------------------------------------------------- 3. plot: training metrics


def test_plot_draws_a_training_metric(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rd.write_run_config(run, {"env": "cue_memory", "network": {"kind": "mlp"}})
    train = {0: [0.1, 0.4, 0.2], 1: [0.3, 0.5, 0.6]}
    rows = []
    for seed, values in train.items():
        for i, value in enumerate(values):
            rows.append({"env_steps": STEPS * (i + 1), "seed": seed, "iteration": i + 1,
                         "train/episode_return": value})
            rows.append({"env_steps": STEPS * (i + 1), "seed": seed, "eval": True, "eval/episode_return": -value})
    (run / rd.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "train.png"
    assert cli.main(["plot", str(run), "--metric", "train/episode_return", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    final = sum(v[-1] for v in train.values()) / len(train)
    best = sum(max(v) for v in train.values()) / len(train)
    assert printed[0].startswith("train/episode_return")
    assert printed[2].split()[:4] == ["run", str(len(train)), f"{final:.3f}", f"{best:.3f}"]
    assert cli.main(["plot", str(run), "--metric", "train/nope", "--out", str(out)]) == 2
    assert "no training rows with 'train/nope'" in _one_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- 4. frictions


def test_pyproject_license_is_an_spdx_string():
    """setuptools deprecates a license table (a warning printed three times per
    install); a string needs setuptools 77 or later to build."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert isinstance(project["project"]["license"], str) and project["project"]["license"].strip()
    [setuptools] = [Requirement(r) for r in project["build-system"]["requires"]
                    if Requirement(r).name == "setuptools"]
    assert not setuptools.specifier.contains("76.0") and setuptools.specifier.contains("77.0")


def test_the_first_progress_line_shows_no_rate(capsys):
    """The bar's first line (no terminal: a line per redraw) has no rate or
    time left yet (tqdm's "?"); the next has both."""
    from nnx_ppo.runner import Progress

    bar = Progress(4 * STEPS, quiet=False, interval=0.0)
    bar.start()
    bar.iteration({}, STEPS)
    time.sleep(0.05)
    bar.iteration({}, 2 * STEPS)
    first, second = [line.strip() for line in capsys.readouterr().err.splitlines() if "steps/s" in line][:2]
    assert "? steps/s" in first and "<?" in first, first
    rate = float(re.search(r"([\d.]+)k? steps/s", second).group(1))
    assert rate > 0 and "<?" not in second, second


def test_an_unknown_config_field_is_a_one_line_warning():
    from nnx_ppo.algorithms.config import TrainConfig

    saved = {**rd.train_config_to_dict(TrainConfig()), "bogus_field": 1}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rd.train_config_from_dict(saved)
    [w] = [w for w in record if "bogus_field" in str(w.message)]
    line = _one_line(app_runs.format_warning(w.message, w.category, w.filename, w.lineno))
    assert line.startswith("nnx-ppo: warning: ") and "bogus_field" in line
