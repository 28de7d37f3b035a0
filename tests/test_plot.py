"""``nnx-ppo plot`` and the run's own learning curve: bands stay in the
observed range, the table's numbers (final, best, IQM, steps and seconds to a
threshold). Synthetic run directories: no training."""

import json

import pytest

from nnx_ppo import cli
from nnx_ppo import runner as rd
from nnx_ppo._app.plot import interquartile_mean, summarize_run


def _run(path, evals, seconds_per_step=0.01):
    """A run directory whose seeds' eval returns at steps 100, 200, ... are ``evals[seed]``."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"env": "cue_memory", "network": {"kind": "mlp"}}))
    rows = []
    for seed, values in evals.items():
        for i, value in enumerate(values):
            step = 100 * (i + 1)
            extra = {} if seed is None else {"seed": seed}
            rows.append({"env_steps": step, **extra, "train/episode_return": value,
                         "time/elapsed_seconds": step * seconds_per_step})
            rows.append({"env_steps": step, **extra, "eval": True, "eval/episode_return": value,
                         "eval/episode_return_min": value - 1, "eval/episode_return_max": value + 1})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_interquartile_mean():
    assert interquartile_mean([4, 1, 3, 2]) == 2.5
    assert interquartile_mean([1, 2, 3, 4, 5]) == pytest.approx(3.0)
    assert interquartile_mean([1, 2, 3, 100]) == 2.5  # an outlier does not move it
    assert interquartile_mean([7.0]) == 7.0


def test_seed_band_is_the_observed_range(tmp_path):
    """CartPole-like returns capped at 500: the band never goes above 500
    (a mean +- 1.96 SEM band went to about 550)."""
    run = _run(tmp_path / "r", {0: [100, 500, 500], 1: [300, 500, 480], 2: [20, 200, 500]})
    steps, mean, lo, hi = rd.seed_band(rd.read_metrics(run))
    assert steps == [100, 200, 300]
    assert hi == [300, 500, 500] and lo == [20, 200, 480]
    assert mean[1] == pytest.approx(400)
    rd.plot_learning_curve(rd.read_metrics(run), tmp_path / "curve.png", "three seeds")
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_plot_compares_runs(tmp_path, capsys):
    a = _run(tmp_path / "a", {0: [0.2, 0.6, 1.0], 1: [0.4, 0.9, 0.8]})
    b = _run(tmp_path / "b", {None: [0.1, 0.3, 0.5]}, seconds_per_step=0.5)
    rows = rd.read_metrics(a)
    s = summarize_run(rows, "eval/episode_return", threshold=0.7)
    assert s["seeds"] == 2 and s["final"] == pytest.approx(0.9) and s["best"] == pytest.approx(0.95)
    assert s["iqm_final"] == pytest.approx(0.9)
    assert s["steps_to_threshold"] == 200 and s["seconds_to_threshold"] == pytest.approx(2.0)  # mean 0.75 at 200
    assert summarize_run(rd.read_metrics(b), "eval/episode_return", 0.7)["steps_to_threshold"] is None
    out = tmp_path / "cmp.png"
    assert cli.main(["plot", str(a), str(b), "--out", str(out), "--threshold", "0.7"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert out.stat().st_size > 0
    assert printed[1].split() == ["run", "seeds", "final", "best", "IQM", "final", "steps", "to", "0.7",
                                  "seconds", "to", "0.7"]
    assert printed[2].split() == ["a", "2", "0.900", "0.950", "0.900", "200", "2.0"]
    assert printed[3].split() == ["b", "1", "0.500", "0.500", "0.500", "-", "-"]
    assert cli.main(["plot", str(a), "--out", str(tmp_path / "x.jpg")]) == 2
    assert cli.main(["plot", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert cli.main(["plot", str(a), "--metric", "eval/nope", "--out", str(out)]) == 2
    assert "no evaluation rows with 'eval/nope'" in capsys.readouterr().err
