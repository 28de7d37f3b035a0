"""The logger that fills a run directory (:class:`RunLogger`: ``metrics.jsonl``,
TensorBoard, W&B, ``learning_curve.png``) and the curves read back from
``metrics.jsonl`` (:func:`seed_curves`, :func:`seed_band`,
:func:`plot_learning_curve`). The files themselves are :mod:`nnx_ppo.run_dir`'s.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from nnx_ppo.run_dir import (
    CONFIG_FILE,
    CURVE_FILE,
    METRICS_FILE,
    TB_DIR,
    RunOutputWarning,
    read_metrics,
    truncate_metrics,
    write_run_config,
)

__all__ = ["RunLogger", "plot_learning_curve", "seed_curves", "seed_band", "save_figure", "CURVE_INTERVAL"]

CURVE_INTERVAL = 30.0
"""Seconds between redraws of ``learning_curve.png`` during training: it is
drawn at the first evaluation, then at most this often (a seed batch logs one
evaluation row per seed), and when the run ends."""


def _json_float(x: float) -> float | str | None:
    """JSON has no NaN/inf; keep them readable as strings."""
    x = float(x)
    return x if math.isfinite(x) else str(x)


def seed_curves(rows: list[dict[str, Any]], metric: str = "eval/episode_return",
                eval_rows: bool | None = None) -> dict[Any, tuple[list[int], list[float]]]:
    """Per seed (``None`` for a run of one seed), the ``(env_steps, values)``
    of ``metric`` in step order: from the evaluation rows for an ``eval/...``
    metric, else from the iteration rows (``eval_rows`` says which instead)."""
    if eval_rows is None:
        eval_rows = metric.startswith("eval/")
    curves: dict[Any, tuple[list[int], list[float]]] = {}
    for r in rows:
        if bool(r.get("eval")) == eval_rows and isinstance(r.get(metric), (int, float)):
            xs, ys = curves.setdefault(r.get("seed"), ([], []))
            xs.append(int(r["env_steps"]))
            ys.append(float(r[metric]))
    return curves


def seed_band(rows: list[dict[str, Any]], metric: str = "eval/episode_return"
              ) -> tuple[list[int], list[float], list[float], list[float]]:
    """``(steps, mean, lowest, highest)`` of ``metric`` over the seeds at each
    step (of the rows :func:`seed_curves` reads): the band is the observed
    range, so it never leaves what some seed reached."""
    by_step: dict[int, list[float]] = {}
    for xs, ys in seed_curves(rows, metric).values():
        for x, y in zip(xs, ys):
            by_step.setdefault(x, []).append(y)
    steps = sorted(by_step)
    return (steps, [sum(by_step[x]) / len(by_step[x]) for x in steps], [min(by_step[x]) for x in steps],
            [max(by_step[x]) for x in steps])


def plot_learning_curve(rows: list[dict[str, Any]], path: str | os.PathLike, title: str = "") -> None:
    """Eval return and training episode return vs env steps. One seed: the
    eval return with the min-max band of its episodes. Several seeds: the
    mean eval return over seeds with the min-max band over seeds, and each
    seed's training return as a thin line."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    train = seed_curves([r for r in rows if r.get("train/completed_episodes", 1) > 0], "train/episode_return",
                        eval_rows=False)
    n_seeds = len({r["seed"] for r in rows if "seed" in r})
    if n_seeds > 1:
        eval_x, eval_y, eval_lo, eval_hi = seed_band(rows)
        band_label = f"eval return, min-max over {n_seeds} seeds"
    else:
        (eval_x, eval_y), = seed_curves(rows).values() or [([], [])]
        lo, hi = seed_curves(rows, "eval/episode_return_min"), seed_curves(rows, "eval/episode_return_max")
        eval_lo, eval_hi = (next(iter(lo.values()))[1], next(iter(hi.values()))[1]) if lo and hi else ([], [])
        band_label = "eval return, min-max over its episodes"
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for i, (train_x, train_y) in enumerate(train.values()):
        label = "train episode return" + (" (each seed)" if n_seeds > 1 else "") if i == 0 else None
        ax.plot(train_x, train_y, color="tab:blue", alpha=0.6 if n_seeds <= 1 else 0.35,
                linewidth=1 if n_seeds <= 1 else 0.7, label=label)
    if eval_x:
        if len(eval_lo) == len(eval_x) and len(eval_hi) == len(eval_x):
            ax.fill_between(eval_x, eval_lo, eval_hi, color="tab:orange", alpha=0.2, linewidth=0, label=band_label)
        label = f"eval return, mean of {n_seeds} seeds" if n_seeds > 1 else "eval return (deterministic)"
        ax.plot(eval_x, eval_y, "o-", color="tab:orange", linewidth=2, markersize=4, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if train or eval_x:
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)


def save_figure(fig: Any, path: str | os.PathLike) -> None:
    """Write a matplotlib figure as PNG atomically (a reader never sees half a
    file) and close it; on failure (disk full, ...) no temporary file stays."""
    import matplotlib.pyplot as plt

    tmp = Path(str(path) + ".tmp.png")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def _end_last_line(path: Path) -> None:
    """Before rows are appended to ``path``: a half-written last line (of a
    run that was killed) is cut off, else the first new row would continue it
    and be lost with it; a whole row without its newline gets one."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:])
    except ValueError:  # (UnicodeDecodeError is one)
        with open(path, "r+b") as f:
            f.truncate(start)
        return
    with open(path, "ab") as f:
        f.write(b"\n")


class RunLogger:
    """Receives ``train_ppo``'s ``log_fn(metrics, env_steps)`` calls and writes
    ``metrics.jsonl``, TensorBoard events, the learning curve and (optionally)
    Weights & Biases.

    Rows whose keys all start with ``eval/`` are evaluation rows: they are
    written with ``"eval": true`` and refresh the learning curve (at most every
    :data:`CURVE_INTERVAL` seconds, and at the end). Text values
    (a failure row's, see :data:`~nnx_ppo.algorithms.outputs.FAILURE_KEY`) go into ``metrics.jsonl`` only.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        steps_per_iteration: int,
        title: str = "",
        tensorboard: bool = True,
        wandb_run: Any = None,
        resumed: bool = False,
        config: dict[str, Any] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.config = config  # config.json's content, written again if the file vanishes
        self.steps_per_iteration = steps_per_iteration
        self.title = title
        self.rows = read_metrics(self.run_dir)  # earlier rows of a resumed run, for the curve
        _end_last_line(self.run_dir / METRICS_FILE)
        self._file = open(self.run_dir / METRICS_FILE, "a", buffering=1)
        self._tensorboard = tensorboard
        self._tb = None
        self._first = True
        self._resumed = resumed
        self._wandb = wandb_run
        self._curve_drawn: float | None = None  # when learning_curve.png was last drawn (time.monotonic)

    @staticmethod
    def is_eval(metrics: dict[str, float]) -> bool:
        return bool(metrics) and all(k.startswith("eval/") for k in metrics)

    def _start(self, env_steps: int) -> None:
        """On the first row: a resumed run continues from its last checkpoint,
        so rows a crashed run logged after it are dropped (here and, via
        ``purge_step``, in TensorBoard)."""
        purge = None
        if self._resumed:
            if truncate_metrics(self.run_dir, env_steps - 1):
                self._file.close()
                self._file = open(self.run_dir / METRICS_FILE, "a", buffering=1)
                self.rows = read_metrics(self.run_dir)
            purge = env_steps
        if self._tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / TB_DIR), purge_step=purge)

    def __call__(self, metrics: dict[str, float], env_steps: int, seed: int | None = None) -> None:
        """Log one row; ``seed`` (runs of several seeds) is written into the
        row and prefixes the TensorBoard tags (``seed3/eval/...``)."""
        if self._first:
            self._first = False
            self._start(int(env_steps))
        is_eval = self.is_eval(metrics)
        row: dict[str, Any] = {"env_steps": int(env_steps)}
        if seed is not None:
            row["seed"] = int(seed)
        if is_eval:
            row["eval"] = True
        else:
            row["iteration"] = int(env_steps) // self.steps_per_iteration
        row.update({k: v if isinstance(v, str) else _json_float(v) for k, v in metrics.items()})
        self._keep_config()
        self._file.write(json.dumps(row) + "\n")
        self.rows.append(row)
        numbers = {k: v for k, v in metrics.items() if not isinstance(v, str)}  # (a failure row's text: the file only)
        if self._tb is not None:
            for k, v in numbers.items():
                if math.isfinite(float(v)):
                    self._tb.add_scalar(k if seed is None else f"seed{seed}/{k}", float(v), int(env_steps))
        if self._wandb is not None and numbers:
            self._wandb.log(numbers, step=int(env_steps))
        if is_eval:
            if self._tb is not None:
                self._tb.flush()
            if self._curve_drawn is None or time.monotonic() - self._curve_drawn >= CURVE_INTERVAL:
                self.refresh_curve()

    def _keep_config(self) -> None:
        """``config.json`` deleted while the run trains is written again (with
        a warning): without it the run could not be evaluated or resumed."""
        if self.config is not None and not (self.run_dir / CONFIG_FILE).exists():
            import warnings

            write_run_config(self.run_dir, self.config)
            warnings.warn(f"{self.run_dir / CONFIG_FILE} had vanished; written again from the run's description",
                          RunOutputWarning, stacklevel=3)

    def log_video(self, path: Path, frames: list, fps: float, env_steps: int, max_tb_frames: int = 100) -> None:
        """Log a video already written to ``path``: to TensorBoard as an
        animated GIF image summary (tag ``eval/video``, at most
        ``max_tb_frames`` frames, evenly spaced) and to W&B as a video."""
        if self._first:
            self._first = False
            self._start(int(env_steps))
        if self._tb is not None and frames:
            import io

            import imageio
            import numpy as np
            from tensorboardX.proto.summary_pb2 import Summary

            step = max(1, -(-len(frames) // max_tb_frames))
            shown = [np.asarray(f, np.uint8) for f in frames[::step]]
            buffer = io.BytesIO()
            imageio.mimsave(buffer, shown, format="gif", duration=1000.0 * step / fps, loop=0)
            height, width = shown[0].shape[:2]
            image = Summary.Image(height=height, width=width, colorspace=shown[0].shape[2] if shown[0].ndim == 3 else 1,
                                  encoded_image_string=buffer.getvalue())
            self._tb.file_writer.add_summary(Summary(value=[Summary.Value(tag="eval/video", image=image)]),
                                             int(env_steps))
            self._tb.flush()
        if self._wandb is not None:
            import wandb

            self._wandb.log({"eval/video": wandb.Video(str(path), format=Path(path).suffix.lstrip("."))},
                            step=int(env_steps))

    def refresh_curve(self) -> None:
        """Redraw ``learning_curve.png``. A curve that cannot be written (disk
        full, ...) is a warning, once, never the end of training."""
        self._curve_drawn = time.monotonic()
        try:
            plot_learning_curve(self.rows, self.run_dir / CURVE_FILE, self.title)
        except OSError as err:
            if not getattr(self, "_curve_warned", False):
                self._curve_warned = True
                import warnings

                warnings.warn(f"cannot write {self.run_dir / CURVE_FILE} ({err.strerror or err}); training goes on, "
                              f"and {METRICS_FILE} keeps every row", RunOutputWarning, stacklevel=2)

    def close(self) -> None:
        try:
            if self.rows:
                self.refresh_curve()
        finally:
            self._file.close()
            if self._tb is not None:
                self._tb.close()
            if self._wandb is not None:
                self._wandb.finish()
