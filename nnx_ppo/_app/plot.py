"""``nnx-ppo plot``: runs side by side, a curve each and a table.

Every run is drawn as the mean of its seeds' curves of the metric (an
``eval/...`` metric from the evaluation rows, any other from the rows written
during training) with the min-max band over seeds, labelled by the run
directory's name. The table gives per run: the number of seeds, the final and
best values (means over seeds), the interquartile mean of the final values
over seeds, and, with a threshold, the first env step (and the seconds of
training) at which the seeds' mean reached it. The statistics
(:func:`interquartile_mean`, :func:`bootstrap_interval`) are scipy's, and
the sweep report and bench/ use them too. Plain Python, NumPy, SciPy and
matplotlib: no JAX.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nnx_ppo import runner as rd
from nnx_ppo._app.commands import CliError, PlotCommand
from nnx_ppo._app.runs import read_run
from nnx_ppo.runner import pretty_path

__all__ = ["run_plot", "summarize_run", "interquartile_mean", "bootstrap_interval", "format_value", "mean",
           "elapsed_seconds", "threshold_reached", "threshold_cells"]


def mean(values: list[float]) -> float:
    """The mean of ``values`` (nan for none)."""
    return sum(values) / len(values) if values else math.nan


def interquartile_mean(values: Any, axis: int | None = None) -> Any:
    """The mean of the middle half of ``values``: ``scipy.stats.trim_mean(values,
    0.25)``, a quarter of them (rounded down) cut from each end (nan for no
    values). Along ``axis`` when given (an array then, for
    :func:`bootstrap_interval`), else of all of them (a float)."""
    import numpy as np
    from scipy.stats import trim_mean

    x = np.asarray(values, float)
    if axis is not None:
        return trim_mean(x, 0.25, axis=axis)
    return float(trim_mean(x, 0.25, axis=None)) if x.size else math.nan


def bootstrap_interval(values: Any, statistic: Any = interquartile_mean, n_resamples: int = 2000, seed: int = 0, *,
                       groups: bool = False) -> tuple[float, float]:
    """95% percentile-bootstrap interval of ``statistic`` of ``values``
    (``scipy.stats.bootstrap``, ``method="percentile"``): the values resampled
    with replacement. ``statistic(x, axis=...)`` reduces along ``axis`` like
    numpy's (``np.mean``, ``np.median``, :func:`interquartile_mean`).

    With ``groups``, ``values`` is a list of groups (e.g. a task's seeds), each
    resampled within itself and the statistic taken over them pooled (the
    stratified bootstrap rliable uses for aggregate scores); a group of one
    value stays as it is. Fewer than two values to resample: ``(s, s)`` for
    ``s`` the statistic of the values (nan for none)."""
    import numpy as np
    from scipy.stats import bootstrap

    samples = [np.asarray(g, float).ravel() for g in values] if groups else [np.asarray(values, float).ravel()]
    moving = [g for g in samples if g.size > 1]  # (scipy resamples only samples of two or more)
    fixed = np.concatenate([g for g in samples if g.size == 1] or [np.empty(0)])
    if not moving:
        point = float(statistic(fixed, axis=-1)) if fixed.size else math.nan
        return point, point

    def pooled(*resampled: Any, axis: int = -1) -> Any:
        batch = resampled[0].shape[:-1]
        return statistic(np.concatenate([*resampled, np.broadcast_to(fixed, (*batch, fixed.size))], axis=-1), axis=-1)

    result = bootstrap(moving, pooled, n_resamples=n_resamples, method="percentile", confidence_level=0.95,
                       vectorized=True, axis=-1, rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def elapsed_seconds(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds of training at each iteration's env step (the longest of its
    rows: a seed batch's or a population's members train at once)."""
    out: dict[int, float] = {}
    for r in rows:
        t = r.get("time/elapsed_seconds")
        if not r.get("eval") and isinstance(t, (int, float)):
            out[r["env_steps"]] = max(out.get(r["env_steps"], 0.0), float(t))
    return out


def threshold_reached(steps: list[int], values: list[float], elapsed: dict[int, float],
                      threshold: float | None) -> dict[str, Any]:
    """``steps_to_threshold`` and ``seconds_to_threshold`` of a curve: the
    first env step at which it reached ``threshold``, and the seconds of
    training then (from ``elapsed``); None where it never did (or without one)."""
    reached = [x for x, y in zip(steps, values) if threshold is not None and y >= threshold]
    return {"steps_to_threshold": reached[0] if reached else None,
            "seconds_to_threshold": elapsed.get(reached[0]) if reached else None}


def threshold_cells(threshold: float | None, entry: dict[str, Any] | None = None, seconds: str = "s") -> list[str]:
    """The table columns of the steps and ``seconds`` to ``threshold`` (none
    without one): their headers, or the values of ``entry`` (a summary's
    :func:`threshold_reached`)."""
    if threshold is None:
        return []
    if entry is None:
        return [f"steps to {threshold:g}", f"{seconds} to {threshold:g}"]
    return [format_value(entry["steps_to_threshold"], ","), format_value(entry["seconds_to_threshold"], ".1f")]


def summarize_run(rows: list[dict[str, Any]], metric: str, threshold: float | None = None) -> dict[str, Any]:
    """One row of the table for a run's metrics rows (see the module docstring)."""
    curves = rd.seed_curves(rows, metric)
    finals = [ys[-1] for _, ys in curves.values() if ys]
    steps, means, _, _ = rd.seed_band(rows, metric)
    return {"seeds": len(curves), "final": mean(finals), "best": mean([max(ys) for _, ys in curves.values() if ys]),
            "iqm_final": interquartile_mean(finals),
            **threshold_reached(steps, means, elapsed_seconds(rows), threshold)}


def _plot(runs: list[tuple[str, list[dict[str, Any]]]], metric: str, threshold: float | None, path: str) -> None:
    fig, ax = rd.new_figure((7.5, 4.5))
    for i, (name, rows) in enumerate(runs):
        steps, mean, lo, hi = rd.seed_band(rows, metric)
        color = f"C{i % 10}"
        n = len(rd.seed_curves(rows, metric))
        ax.plot(steps, mean, "o-", color=color, linewidth=2, markersize=3,
                label=f"{name} ({n} seeds: mean, min-max band)" if n > 1 else name)
        if n > 1:
            ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
    if threshold is not None:
        ax.axhline(threshold, color="gray", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    rd.save_figure(fig, path)


def format_value(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def run_plot(cmd: PlotCommand) -> int:
    if not cmd.runs:
        raise CliError("give at least one run directory")
    if not cmd.out.lower().endswith(".png"):
        raise CliError(f"--out must end in .png, got {cmd.out!r}")
    runs = []
    for run in cmd.runs:
        read_run(Path(run))
        rows = rd.read_metrics(run)
        if not rd.seed_curves(rows, cmd.metric):
            if cmd.metric.startswith("eval/"):
                raise CliError(f"{run} has no evaluation rows with {cmd.metric!r} (is evaluation on?)")
            raise CliError(f"{run} has no training rows with {cmd.metric!r} (metrics.jsonl names the metrics)")
        runs.append((Path(run).resolve().name, rows))
    names = [name for name, _ in runs]
    if len(set(names)) != len(names):  # the same directory name in two places: tell them apart
        runs = [(pretty_path(Path(run)), rows) for run, (_, rows) in zip(cmd.runs, runs)]
    _plot(runs, cmd.metric, cmd.threshold, cmd.out)
    header = ["run", "seeds", "final", "best", "IQM final", *threshold_cells(cmd.threshold, seconds="seconds")]
    table = []
    for name, rows in runs:
        s = summarize_run(rows, cmd.metric, cmd.threshold)
        table.append([name, str(s["seeds"]), format_value(s["final"]), format_value(s["best"]),
                      format_value(s["iqm_final"]), *threshold_cells(cmd.threshold, s)])
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    print(f"{cmd.metric} (means over seeds; IQM: interquartile mean of the seeds' final values)")
    for row in [header, *table]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print(f"plot: {cmd.out}")
    return 0
