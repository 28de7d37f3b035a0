"""The one runner that owns a run directory: what a run is (:class:`RunSpec`), the one object that
writes its directory (:class:`Run`), the directory's files and their rules (lock, config, metrics,
curves, checkpoints, best policies), the logger that fills it, and the progress bar of a run.

Every entry that writes a run directory goes through here: ``nnx-ppo
train`` (also ``--seeds``), ``sweep``, ``distill`` and ``resume`` build a
RunSpec and open a :class:`Run`, which they hand to the trainer
(``run=``); ``train_ppo``, ``train_seeds``, ``train_population`` and
``train_distillation`` with ``run_dir=`` describe their arguments as a
RunSpec (:func:`open_output`) and open the same Run. The Run:

- locks the directory (:class:`RunLock`: a second run
  is refused naming the holder's pid);
- writes ``config.json`` (the RunSpec's :meth:`~RunSpec.to_dict`) once,
  atomically, when training begins, or for a resume appends the changes
  :func:`~nnx_ppo.algorithms.config.resume_changes` allows to its
  ``resumed`` list (and refuses the others in one line);
- logs every row (:class:`RunLogger`: ``metrics.jsonl``,
  TensorBoard, the learning curve; config.json written again if it
  vanished), records failures, saves checkpoints and best policies into
  ``checkpoints/`` (through the trainer's hooks), and shows progress.

Its layer sits above ``algorithms/``: the trainers see a Run only as their
:class:`~nnx_ppo.algorithms._outputs.RunOutput`.

The logger (:class:`RunLogger`: ``metrics.jsonl``, TensorBoard, W&B,
``learning_curve.png``) comes with the curves read back from ``metrics.jsonl``
(:func:`seed_curves`, :func:`seed_band`, :func:`plot_learning_curve`);
:class:`Progress` is the tqdm bar, :class:`StopFlag` how Ctrl-C and SIGTERM stop a run.

Layout of a run directory::

    RUN_DIR/
      config.json          env spec, env kwargs, network kind/kwargs/seed, full TrainConfig
      metrics.jsonl        one JSON object per iteration (and per evaluation, marked "eval": true)
      learning_curve.png   eval return and training episode return vs env steps
      tb/                  TensorBoard event files (tensorboardX)
      checkpoints/         training-state checkpoints (the last one is the final network)

Everything here is plain Python/NumPy; no JAX is imported with this module, none is needed to read a run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from nnx_ppo.algorithms.config import TrainConfig, config_from_dict, config_to_dict, resume_changes
from nnx_ppo.envs.registry import spec_of

__all__ = ["RunSpec", "Run", "open_output", "named_network", "checkpoints_of", "NAMED_NETWORK_WIDTH",
           "PYTHON_NETWORK", "CONFIG_FILE", "METRICS_FILE", "CURVE_FILE", "TB_DIR", "CHECKPOINT_DIR",
           "default_run_dir", "train_config_to_dict", "train_config_from_dict", "write_run_config",
           "read_run_config", "read_metrics", "truncate_metrics", "check_writable", "clear_run", "run_data",
           "RUN_ENTRIES", "RunOutputWarning", "RunDataWarning", "MetricsError", "FAILURE_KEY", "failure_rows",
           "RunLock", "RunDirInUseError", "append_resumed", "training_env_kwargs", "make_run_envs", "RunLogger",
           "plot_learning_curve", "seed_curves", "seed_band", "new_figure", "save_figure", "CURVE_INTERVAL",
           "pretty_path", "fmt_seconds", "StopFlag", "Progress"]


# ----------------------------------------------------------------------- the run directory: its files and their rules

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "learning_curve.png"
TB_DIR = "tb"
CHECKPOINT_DIR = "checkpoints"
LOCK_FILE = ".lock"
FAILURE_KEY = "failure"
"""The key of a failure row of ``metrics.jsonl``: a member or seed that
failed (non-finite values, a replay mismatch) gets one row with its reason
under this key, its ``failure_type``, ``iteration`` and ``env_steps``."""
SCHEMA_VERSION = 2
"""config.json's ``schema`` (1: before it was recorded; 2: written once, a
resume appends ``{"at", "command", "changes"}`` to ``resumed``)."""


def default_run_dir(env_spec: str, root: str | os.PathLike = "runs") -> Path:
    """``runs/<env>-<YYYYmmdd-HHMMSS>`` (env spec made filesystem-safe; a
    numeric suffix is added if that directory already exists)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", env_spec).strip("_") or "env"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in itertools.count():
        path = Path(root) / (f"{safe}-{stamp}-{i}" if i else f"{safe}-{stamp}")
        if not path.exists():
            return path


# --------------------------------------------------------------------------- config.json


def train_config_to_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready data (a learning-rate schedule becomes its
    description, see :func:`nnx_ppo.algorithms.config.config_to_dict`)."""
    return config_to_dict(config)


def train_config_from_dict(data: dict[str, Any], *, learning_rate: Any = None) -> TrainConfig:
    """Inverse of :func:`train_config_to_dict`; unknown keys are skipped (with
    a warning) so older/newer run directories still load. ``learning_rate``
    replaces the saved one (required for a config saved with a schedule)."""
    return config_from_dict(data, where=CONFIG_FILE, learning_rate=learning_rate)


def training_env_kwargs(env_kwargs: dict[str, Any], train_env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of a run's training env, for
    :func:`nnx_ppo.envs.make`: the env's own (``env_kwargs``, which the
    evaluation env gets alone), what only training adds (``train_env_kwargs``),
    and time-limit counters that start at random steps
    (``random_initial_steps``), so that the vmapped episodes de-synchronize,
    unless ``train_env_kwargs`` says otherwise. This is the one place the
    rule is written."""
    return {"random_initial_steps": True, **env_kwargs, **train_env_kwargs}


def make_run_envs(env: str, env_kwargs: dict[str, Any], train_env_kwargs: dict[str, Any]):
    """``(train_env, eval_env)`` of a run: ``make(env, **training_env_kwargs(...))``
    and ``make(env, **env_kwargs)``."""
    from nnx_ppo.envs.registry import make

    return make(env, **training_env_kwargs(env_kwargs, train_env_kwargs)), make(env, **env_kwargs)


def append_resumed(run_dir: str | os.PathLike, changes: dict[str, list], command: list[str]) -> dict[str, Any]:
    """Record a resume in the run's ``config.json``: ``{"at", "command",
    "changes"}`` appended to its ``resumed`` list (``changes``: ``{"ppo.total_steps":
    [before, after]}``, see :func:`~nnx_ppo.algorithms.config.resume_changes`);
    nothing else in the file changes. Returns the file's new content."""
    content = _read_json(Path(run_dir) / CONFIG_FILE)
    entry = {"at": _dt.datetime.now().isoformat(timespec="seconds"), "command": list(command), "changes": changes}
    content["resumed"] = [*content.get("resumed", []), entry]
    write_run_config(Path(run_dir), content)
    return content


def _with_resume_changes(content: dict[str, Any]) -> dict[str, Any]:
    """``content`` with the config changes its resumes recorded applied to
    ``config`` (what the run trains with now)."""
    changes = [e.get("changes", {}) for e in content.get("resumed", []) if isinstance(e, dict)]
    if not any(changes) or not isinstance(content.get("config"), dict):
        return content
    config = json.loads(json.dumps(content["config"]))
    for change in changes:
        for name, (_, after) in change.items():
            *parents, leaf = name.split(".")
            node = config
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = after
    return {**content, "config": config}


class RunDirInUseError(ValueError):
    """Another process is training into the run directory (its pid is in the message)."""


_held_locks: dict[str, tuple[Any, bool]] = {}  # resolved run directory -> (its filelock.FileLock, created it?)


def _write_pid(fd: int) -> None:
    """``on_acquired`` of the lock: the holder's pid, alone, in the lock file
    it has just locked (a module function, so that every lock has the same hook)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


class RunLock:
    """The exclusive right of one process to write a run directory: a
    :class:`filelock.FileLock` (an ``flock`` on ``RUN_DIR/.lock``), the file
    holding the holder's pid and removed when the lock is released. A second
    run into a locked directory raises :class:`RunDirInUseError` naming that
    pid. The kernel drops the lock of a process that dies; the file with its
    pid stays, and the next run takes the lock over with a warning.
    Re-entrant within a process (the CLI and the trainer it calls both take
    it). Use as a context manager, or ``acquire``/``release``."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)

    def acquire(self) -> "RunLock":
        import filelock

        key = str(self.run_dir.resolve())
        if key in _held_locks:
            _held_locks[key][0].acquire()  # filelock counts the re-entries
            return self
        created = not self.run_dir.exists()
        # timeout=0: one try, refused at once; no soft (marker file) fallback where
        # flock is missing: that fails as an unwritable directory, as before.
        lock = filelock.FileLock(Path(key) / LOCK_FILE, timeout=0, thread_local=False, fallback_to_soft=False,
                                 on_acquired=_write_pid)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            previous = self._holder()  # read before locking: the lock file of a killed run still names it
            lock.acquire()
        except filelock.Timeout:  # (a TimeoutError, so an OSError: caught first)
            raise RunDirInUseError(f"{os.fspath(self.run_dir)} is in use by another run (pid "
                                   f"{self._holder() or 'unknown'}); wait for it to end, or pick another run "
                                   "directory") from None
        except OSError as e:
            raise ValueError(f"cannot write the run directory {os.fspath(self.run_dir)}: "
                             f"{e.strerror or e}") from None
        if previous and previous != str(os.getpid()):
            warnings.warn(f"{os.fspath(self.run_dir)} was locked by pid {previous}, which ended without releasing "
                          "it (killed?); taking it over", RunOutputWarning, stacklevel=2)
        _held_locks[key] = (lock, created)
        return self

    def _holder(self) -> str:
        """The pid in the lock file ("" when there is none)."""
        try:
            return (self.run_dir / LOCK_FILE).read_text(errors="replace")[:64].strip()
        except (FileNotFoundError, IsADirectoryError):
            return ""

    def release(self) -> None:
        key = str(self.run_dir.resolve())
        held = _held_locks.get(key)
        if held is None:
            return
        lock, created = held
        if lock.lock_counter == 1:
            del _held_locks[key]
            (self.run_dir / LOCK_FILE).unlink(missing_ok=True)  # released cleanly: no lock file
            if created and not any(self.run_dir.iterdir()):
                self.run_dir.rmdir()  # a run that wrote nothing leaves no directory
        lock.release()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_writable(run_dir: str | os.PathLike) -> None:
    """Before anything is written or compiled (and without writing anything):
    ``run_dir`` can be created and written, and none of its parts (``tb/``,
    ``checkpoints/``, ``videos/``, ``config.json``, ...) is of the wrong
    kind. A ValueError in one line names what is in the way."""
    path = Path(run_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())  # (the root at least)
    if not existing.is_dir():
        raise ValueError(f"cannot create the run directory {os.fspath(path)}: {os.fspath(existing)} is a file "
                         "(Not a directory)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write the run directory {os.fspath(path)}: {os.fspath(existing)} is not writable")
    for name in (TB_DIR, CHECKPOINT_DIR, "videos", CONFIG_FILE, METRICS_FILE, CURVE_FILE):
        part = path / name
        if part.exists() and part.is_dir() != (name in (TB_DIR, CHECKPOINT_DIR, "videos")):
            kind = "directory" if part.is_dir() else "file"
            raise ValueError(f"{os.fspath(part)} is a {kind} in the way of the run's own {name}; move it away or "
                             "pick another run directory")


RUN_ENTRIES = (CONFIG_FILE, METRICS_FILE, CURVE_FILE, TB_DIR, CHECKPOINT_DIR, "source", "videos", LOCK_FILE)
"""What a run directory holds of its own (anything else in it is foreign)."""


def run_data(run_dir: str | os.PathLike) -> list[str]:
    """What of a run's data ``run_dir`` holds, in words, for a message
    (``["config.json", "13 metrics rows", "tb/", "a best policy"]``); empty
    when there is nothing a fresh run could lose."""
    from nnx_ppo.algorithms.checkpointing import held_checkpoints

    path = Path(run_dir)
    found = [CONFIG_FILE] if (path / CONFIG_FILE).exists() else []
    metrics = path / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size:
        rows = sum(1 for line in metrics.read_text(errors="replace").splitlines() if line.strip())
        found.append(f"{rows} metrics rows")
    for folder in (TB_DIR, "videos", "source"):
        if (path / folder).is_dir() and any((path / folder).iterdir()):
            found.append(f"{folder}/")
    held = held_checkpoints(path / CHECKPOINT_DIR)
    return found + ([held] if held is not None else [])


def clear_run(run_dir: str | os.PathLike) -> None:
    """Delete a run's own files and folders (:data:`RUN_ENTRIES`, its lock
    aside) from ``run_dir``, checkpoints included (what ``--overwrite``
    asks for); anything else in it stays."""
    import shutil

    for entry in (Path(run_dir) / name for name in RUN_ENTRIES if name != LOCK_FILE):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, via a temporary file beside it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_run_config(run_dir: Path, content: dict[str, Any]) -> None:
    """Write ``content`` as the run's ``config.json`` (atomically, via a temporary file)."""
    _replace_text(Path(run_dir) / CONFIG_FILE, json.dumps(content, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); the run's config cannot be read") from None


def read_run_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's ``config.json`` as a dict, with the config changes its
    resumes recorded applied to ``config``; ``FileNotFoundError`` if
    ``run_dir`` is not a run directory, ``ValueError`` (one line) if its
    config.json is broken."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not an nnx-ppo run directory (no {CONFIG_FILE})")
    content = _read_json(path)
    if not isinstance(content, dict) or not isinstance(content.get("env"), str) or "network" not in content:
        raise ValueError(f"{path} does not describe an nnx-ppo run (expected an object with 'env' and 'network')")
    return _with_resume_changes(content)


# --------------------------------------------------------------------------- metrics.jsonl


def read_metrics(run_dir: str | os.PathLike, *, strict: bool = False) -> list[dict[str, Any]]:
    """All rows of ``metrics.jsonl``. A half-written last line (of a run that
    was killed) is skipped quietly. Any other line that is not JSON (damaged)
    is skipped with a :class:`RunDataWarning` naming the file and the line
    numbers. A JSON line that is no row the logger writes (``env_steps`` not a
    whole number, ...) is skipped with that warning too, or with ``strict``
    raises :class:`MetricsError` naming the file and the line."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    skipped: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i != last:
                skipped.append(i + 1)
            continue
        problem = _row_problem(row)
        if problem is None:
            rows.append(row)
        elif strict:
            raise MetricsError(f"{path} line {i + 1}: {problem}; fix or delete that line")
        else:
            skipped.append(i + 1)
    if skipped:
        _report_skipped(path, skipped)
    return rows


def _row_problem(row: Any) -> str | None:
    """What makes ``row`` (one parsed line of metrics.jsonl) no row the logger writes; None if nothing."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {json.dumps(row)[:40]}"
    if "env_steps" not in row:
        return "no env_steps (expected a whole number >= 0)"
    for key, lowest in (("env_steps", 0), ("iteration", 0), ("seed", None)):
        value = row.get(key, 0)
        whole = type(value) is int or isinstance(value, float) and value.is_integer()  # (bool is no whole number)
        if not whole or (lowest is not None and value < lowest):
            return f"{key} is {json.dumps(value)[:40]}, expected a whole number{'' if lowest is None else ' >= 0'}"
    if not isinstance(row.get("eval", False), bool):
        return f"eval is {json.dumps(row['eval'])[:40]}, expected true or false"
    return None


_reported: set[tuple[str, tuple[int, ...]]] = set()  # (file, skipped lines) already warned about


def _report_skipped(path: Path, lines: list[int]) -> None:
    """One :class:`RunDataWarning` per file and set of skipped lines in a process."""
    key = (str(path.resolve()), tuple(lines))
    if key in _reported:
        return
    _reported.add(key)
    shown = ", ".join(map(str, lines[:10])) + (f", ... ({len(lines)} lines)" if len(lines) > 10 else "")
    what = "lines" if len(lines) > 1 else "line"
    rows = "not readable metrics rows" if len(lines) > 1 else "not a readable metrics row"
    warnings.warn(f"{path}: skipped {what} {shown} ({rows}: damaged?); the other rows are read", RunDataWarning,
                  stacklevel=3)


def failure_rows(rows: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Per seed (member index of a sweep; None for a run of one seed), its
    first failure row (see :data:`FAILURE_KEY`) among ``rows``."""
    failures: dict[Any, dict[str, Any]] = {}
    for r in rows:
        if isinstance(r.get(FAILURE_KEY), str):
            failures.setdefault(r.get("seed"), r)
    return failures


def truncate_metrics(run_dir: str | os.PathLike, max_env_steps: int) -> int:
    """Drop rows logged after ``max_env_steps`` (e.g. past the checkpoint a
    crashed run is resumed from). Returns how many rows were dropped."""
    rows = read_metrics(run_dir)
    kept = [r for r in rows if int(r.get("env_steps", 0)) <= max_env_steps]
    if len(kept) != len(rows):
        _replace_text(Path(run_dir) / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in kept))
    return len(rows) - len(kept)


class RunOutputWarning(UserWarning):
    """Part of a run directory (the learning curve) could not be written; training goes on."""


class RunDataWarning(UserWarning):
    """Lines of a run's ``metrics.jsonl`` could not be read and were skipped; the other rows are read."""


class MetricsError(ValueError):
    """A row of ``metrics.jsonl`` is no row the logger writes (the message names the file and the line)."""


# --------------------------------------------------------------------------- the logger

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
    train = seed_curves([r for r in rows if r.get("train/completed_episodes", 1) > 0], "train/episode_return")
    n_seeds = len({r["seed"] for r in rows if "seed" in r})
    if n_seeds > 1:
        eval_x, eval_y, eval_lo, eval_hi = seed_band(rows)
        band_label = f"eval return, min-max over {n_seeds} seeds"
    else:
        (eval_x, eval_y), = seed_curves(rows).values() or [([], [])]
        lo, hi = seed_curves(rows, "eval/episode_return_min"), seed_curves(rows, "eval/episode_return_max")
        eval_lo, eval_hi = (next(iter(lo.values()))[1], next(iter(hi.values()))[1]) if lo and hi else ([], [])
        band_label = "eval return, min-max over its episodes"
    fig, ax = new_figure((7, 4.2))
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
    save_figure(fig, path)


def new_figure(size: tuple[float, float]) -> tuple[Any, Any]:
    """``(figure, axes)``: a new matplotlib figure of ``size`` inches at 100
    dpi, drawn without a display (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size, dpi=100)


def save_figure(fig: Any, path: str | os.PathLike) -> None:
    """Lay out a matplotlib figure (``tight_layout``), write it as PNG
    atomically (a reader never sees half a file) and close it; on failure
    (disk full, ...) no temporary file stays."""
    import matplotlib.pyplot as plt

    tmp = Path(str(path) + ".tmp.png")
    try:
        fig.tight_layout()
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
        os.truncate(path, start)
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
    (a failure row's, see :data:`FAILURE_KEY`) go into ``metrics.jsonl`` only.
    """

    def __init__(self, run_dir: str | os.PathLike, *, steps_per_iteration: int, title: str = "",
                 tensorboard: bool = True, wandb_run: Any = None, resumed: bool = False,
                 config: dict[str, Any] | None = None):
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
        """On the first row (nothing after it): a resumed run continues from
        its last checkpoint, so rows a crashed run logged after it are dropped
        (here and, via ``purge_step``, in TensorBoard)."""
        if not self._first:
            return
        self._first = False
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
            write_run_config(self.run_dir, self.config)
            warnings.warn(f"{self.run_dir / CONFIG_FILE} had vanished; written again from the run's description",
                          RunOutputWarning, stacklevel=3)

    def log_video(self, path: Path, frames: list, fps: float, env_steps: int, max_tb_frames: int = 100) -> None:
        """Log a video already written to ``path``: to TensorBoard as an
        animated GIF image summary (tag ``eval/video``, at most
        ``max_tb_frames`` frames, evenly spaced) and to W&B as a video."""
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


# ----------------------------------------------------------------------------- progress: the bar, and how a run stops


def pretty_path(p: Path) -> str:
    """``p`` relative to the current directory where it is under it, else absolute."""
    path = p.resolve()
    return str(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)


def fmt_seconds(s: float) -> str:
    """``s`` seconds as ``M:SS`` or ``H:MM:SS``."""
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:d}:{sec:02d}"


class StopFlag:
    """First Ctrl-C (or SIGTERM): ask training to stop after the current
    compiled call. A second Ctrl-C aborts immediately; a repeated SIGTERM
    does not, since schedulers and ``timeout`` may deliver one twice (GNU
    ``timeout`` signals the command, then its process group)."""

    # A stop on request may take effect after the call that is running when it is noticed: the trainer then
    # dispatches each call before reading the last one's results (the device does not wait for the host).
    may_lag_one_call = True

    def __init__(self, announce):
        self.requested = False
        self._announce = announce
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.requested = True
        self._announce("stop requested: finishing the current step and saving a checkpoint "
                       "(Ctrl-C again to abort without saving)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(ValueError, OSError):
                    self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def __call__(self) -> bool:
        return self.requested


class Progress:
    """Progress over env steps: one tqdm bar on stderr, with the latest eval
    and train returns as its postfix. Where stderr is not a terminal (a log
    file) tqdm redraws it at most every ``interval`` seconds, a line each
    time; with --quiet there is no bar, only the evaluations."""

    def __init__(self, total_steps: int, quiet: bool, interval: float = 30.0):
        self.total = total_steps
        self.quiet = quiet
        self.interval = interval
        self.bar = None
        self.t_start = time.perf_counter()
        self.eval_return: float | None = None
        self.train_return: float | None = None

    def write(self, msg: str) -> None:
        """A line on stdout, above the bar (tqdm clears and redraws it)."""
        from tqdm import tqdm

        with tqdm.external_write_mode():
            print(msg, flush=True)

    def start(self) -> None:
        self.t_start = time.perf_counter()
        self.write("compiling... (the first call compiles the training step; this can take a while)")

    def iteration(self, metrics: dict[str, float], env_steps: int) -> None:
        if metrics.get("train/completed_episodes", 0) > 0:
            self.train_return = metrics.get("train/episode_return")
        done = min(env_steps, self.total)
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
            self.bar.update(done - self.bar.n)
            return
        from tqdm import tqdm

        self.write(f"compiled in {time.perf_counter() - self.t_start:.1f} s")
        terminal = sys.stderr.isatty()
        # The steps of the call that compiled are done when the bar starts: its rate is measured from here.
        self.bar = tqdm(total=self.total, initial=done, postfix=self._postfix(), unit=" steps", unit_scale=True,
                        smoothing=0.1, disable=self.quiet, dynamic_ncols=True,
                        mininterval=0.1 if terminal else self.interval,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]{postfix}"
                                   + ("" if terminal else "\n"))  # in a file: a line per redraw

    def evaluation(self, metrics: dict[str, float], env_steps: int) -> None:
        self.eval_return = metrics.get("eval/episode_return")
        msg = (f"[{env_steps:>{len(str(self.total))}d}/{self.total}] eval return "
               f"{self.eval_return:.3f} ± {metrics.get('eval/episode_return_std', float('nan')):.3f}"
               f"  (length {metrics.get('eval/episode_length', float('nan')):.1f})")
        if self.train_return is not None:
            msg += f"  train return {self.train_return:.3f}"
        if self.quiet:
            msg += f"  elapsed {fmt_seconds(time.perf_counter() - self.t_start)}"
        if self.bar is not None:
            self.bar.set_postfix_str(self._postfix(), refresh=False)
        self.write(msg)

    def _postfix(self) -> str:
        """``eval 0.912, train 0.850``: the latest returns."""
        return ", ".join(f"{name} {value:.3f}" for name, value in (("eval", self.eval_return),
                                                                  ("train", self.train_return)) if value is not None)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# ----------------------------------------------------------- the run: what it is, and the one writer of its directory

NAMED_NETWORK_WIDTH = 32
"""The width of a network named ``"mlp"``, ``"lstm"`` or ``"gru"`` in Python
(for another, pass ``NetworkSpec.sized(env, kind, width)``)."""

PYTHON_NETWORK = "python_class"
"""The ``config.json`` key naming a network object's class (a network the command line cannot rebuild)."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What a run is; ``config.json`` is its serialization (:meth:`to_dict`, :meth:`load`).

    Attributes:
      env: the env spec of :func:`nnx_ppo.envs.make` (``"python:CLASS"`` for
        an env object, which the command line cannot rebuild).
      network: how to rebuild the network (``NetworkSpec.to_dict()``), or
        ``{"python_class": ...}`` for a network object.
      config: the whole training configuration (a population's shared one).
      env_kwargs: the env's keyword arguments (the evaluation env gets them alone).
      train_env_kwargs: what only the training env adds
        (:func:`training_env_kwargs` is the rule).
      seeds: the seeds of a seed batch (empty: one run).
      extra: what the algorithm and the entry record besides: a
        population's ``members`` and ``population``, a distillation's
        ``distillation``, the CLI's ``preset`` and ``wandb_id``.
      command: the command line that started the run.
      env_rebuildable: False for an env object.
    """

    env: str
    network: dict[str, Any]
    config: TrainConfig
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: tuple[int, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ()
    env_rebuildable: bool = True

    def to_dict(self) -> dict[str, Any]:
        """``config.json``'s content, with the schema version, the time it was
        created and an empty ``resumed`` list."""
        content: dict[str, Any] = {
            "schema": SCHEMA_VERSION, "env": self.env, "env_kwargs": dict(self.env_kwargs),
            "train_env_kwargs": dict(self.train_env_kwargs), "network": dict(self.network),
            "config": train_config_to_dict(self.config),
            "created": _dt.datetime.now().isoformat(timespec="seconds"), "command": list(self.command),
            "resumed": [],
        }
        if not self.env_rebuildable:
            content["env_rebuildable"] = False
        if self.seeds:
            content["seeds"] = [int(s) for s in self.seeds]
        return {**content, **self.extra}

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "RunSpec":
        """The spec of the run in ``run_dir``, as it trains now (its resumes' changes applied)."""
        saved = read_run_config(run_dir)
        own = {"schema", "env", "env_kwargs", "train_env_kwargs", "network", "config", "created", "command",
               "resumed", "seeds", "env_rebuildable", "source"}
        return cls(env=saved["env"], network=saved["network"], config=train_config_from_dict(saved["config"]),
                   env_kwargs=saved.get("env_kwargs", {}), train_env_kwargs=saved.get("train_env_kwargs", {}),
                   seeds=tuple(saved.get("seeds", ())), extra={k: v for k, v in saved.items() if k not in own},
                   command=tuple(saved.get("command", ())), env_rebuildable=saved.get("env_rebuildable", True))

    @classmethod
    def of_python(cls, *, train_env, eval_env, network_spec, network, config: TrainConfig, seeds) -> "RunSpec":
        """The spec of a Python call: the envs as the command line would
        rebuild them when both come from one :func:`~nnx_ppo.envs.make`
        spec (else by class, not rebuildable), the network by its spec (else by class)."""

        if network_spec is not None:
            described = network_spec.to_dict()
        else:
            described = {PYTHON_NETWORK: f"{type(network).__module__}.{type(network).__qualname__}"}
        train, evaluation = spec_of(train_env), spec_of(eval_env)
        command = (os.path.basename(sys.executable), *sys.argv)
        if train is None or evaluation is None or train[0] != evaluation[0] or set(evaluation[1]) - set(train[1]):
            return cls(env=f"python:{type(train_env).__name__}", network=described, config=config,
                       seeds=tuple(seeds or ()), command=command, env_rebuildable=False)
        added = {k: v for k, v in train[1].items() if evaluation[1].get(k) != v}
        # The inverse of training_env_kwargs: random_initial_steps is on unless said otherwise.
        if not added.pop("random_initial_steps", False):
            added["random_initial_steps"] = False
        return cls(env=train[0], network=described, config=config, env_kwargs=evaluation[1], train_env_kwargs=added,
                   seeds=tuple(seeds or ()), command=command)

    @property
    def n_entries(self) -> int:
        """How many seeds or members train together (1 for one run)."""
        return max(len(self.seeds), len(self.extra.get("members", ())), 1)

    @property
    def title(self) -> str:
        """``lstm on cue_memory``: the learning curve's title."""
        return f"{self.network.get('kind', self.network.get(PYTHON_NETWORK))} on {self.env}"


class Run:
    """The one writer of a run directory (or, with ``path`` None, only a progress bar).

    Open it with :meth:`open` (the directory is locked from then on), hand
    it to a trainer (``run=``), which calls :meth:`begin` (config.json) and
    then logs through it; :meth:`close` releases everything.
    """

    def __init__(self, path: Path | None, spec: RunSpec, *, resuming: bool, bar, lock, wandb_run=None,
                 writes: bool = True):
        self.path = path
        self.spec = spec
        self.resuming = resuming
        self.bar = bar
        self.logger: RunLogger | None = None
        self.checkpoint_dir = None if path is None else str((path / CHECKPOINT_DIR).resolve())
        self.checkpoint_metadata: dict[str, Any] = {} if path is None else {"run_dir": str(path.resolve())}
        if path is not None and PYTHON_NETWORK not in spec.network:
            self.checkpoint_metadata["network"] = dict(spec.network)
        self._lock = lock
        self._wandb_run = wandb_run
        self._writes = writes
        self._shown_step: int | None = None
        self._pending: tuple[int, list[dict]] | None = None  # a batch's evaluations at one step, shown as their mean

    @classmethod
    def open(cls, path: str | os.PathLike | None, spec: RunSpec, *, resuming: bool, progress: bool,
             quiet: bool = False, wandb_run=None, primary: bool = True) -> "Run":
        """Lock ``path`` (checked writable first) and start the progress bar
        (``quiet``: evaluations only). In a run of several processes only
        the ``primary`` one writes; the others only save their part of the checkpoints."""
        ppo = spec.config.ppo
        total = ppo.n_iterations * ppo.steps_per_iteration * spec.n_entries
        bar = Progress(total, quiet) if progress and primary else None
        if path is None:
            return cls(None, spec, resuming=resuming, bar=bar, lock=None)
        path = Path(path)
        if not primary:
            return cls(path, spec, resuming=resuming, bar=None, lock=None, writes=False)
        check_writable(path)
        lock = RunLock(path).acquire()
        held = [] if resuming else run_data(path)
        if held:
            lock.release()
            from nnx_ppo.algorithms.trainer import check_fresh_checkpoint_dir

            check_fresh_checkpoint_dir(str(path / CHECKPOINT_DIR))  # (checkpoints: its own error, naming them)
            raise RunDirInUseError(f"run_dir {os.fspath(path)!r} already holds a run's data ({', '.join(held)}); a "
                                      "fresh run never replaces it: resume it (resume_from=), delete it yourself, "
                                      "or give another run_dir")
        return cls(path, spec, resuming=resuming, bar=bar, lock=lock, wandb_run=wandb_run)

    def begin(self, record: dict[str, Any]) -> None:
        """Write ``config.json`` (a fresh run; ``record``: what the algorithm
        adds, e.g. the members; the spec's own entries win) or record the
        resume in it; open the logger and start the bar."""
        if self.path is not None and self._writes:
            spec = dataclasses.replace(self.spec, extra={**record, **self.spec.extra})
            if self.resuming and (self.path / CONFIG_FILE).exists():
                read_metrics(self.path, strict=True)  # a bad row stops the resume here, before it is recorded
                changes = resume_changes(read_run_config(self.path)["config"], spec.config)
                content = append_resumed(self.path, changes, list(spec.command))
            else:
                content = spec.to_dict()
                self.path.mkdir(parents=True, exist_ok=True)
                sources = _snapshot_own_code(spec, self.path)
                if sources:
                    content["source"] = sources
                write_run_config(self.path, content)
            self.spec = spec
            self.logger = RunLogger(self.path, steps_per_iteration=spec.config.ppo.steps_per_iteration,
                                       title=spec.title, resumed=self.resuming, config=content,
                                       wandb_run=self._wandb_run)
        if self.bar is not None:
            self.bar.start()

    def write(self, message: str) -> None:
        """A line above the progress bar (or printed, without one)."""
        if self.bar is not None:
            self.bar.write(message)
        elif self._writes:
            print(message, flush=True)

    def log(self, metrics: dict[str, Any], env_steps: int, seed: int | None = None) -> None:
        """One row into the run directory; the bar moved once per step, and a
        batch's evaluations at one step shown as their mean."""
        if self.logger is not None:
            self.logger(metrics, env_steps, seed)
        if self.bar is None:
            return
        if RunLogger.is_eval(metrics):
            if self._pending is not None and self._pending[0] != env_steps:
                self._show_evaluations()
            self._pending = (env_steps, [*(self._pending or (0, []))[1], metrics])
            if len(self._pending[1]) >= self.spec.n_entries:  # (a failed seed's shows at the next step)
                self._show_evaluations()
            return
        self._show_evaluations()
        if self._shown_step != env_steps:
            self._shown_step = env_steps
            self.bar.iteration(metrics, env_steps * self.spec.n_entries)

    def _show_evaluations(self) -> None:
        if self._pending is not None:
            steps, rows = self._pending
            self._pending = None
            mean = {k: sum(float(r[k]) for r in rows) / len(rows) for k in rows[0] if all(k in r for r in rows)}
            self.bar.evaluation(mean, steps * self.spec.n_entries)

    def record_failure(self, failure, seed: int) -> None:
        """Batch entry ``seed``'s :class:`~nnx_ppo.algorithms.trainer.Failure` as a failure row
        (``{"failure": reason, "failure_type": "NonFiniteError"}``, see :data:`FAILURE_KEY`;
        it stays failed on resume)."""
        if self.logger is not None:
            self.logger({FAILURE_KEY: str(failure.error), "failure_type": type(failure.error).__name__},
                        failure.env_steps, seed)

    def earlier_failures(self) -> dict[int, Any]:
        """The failures of the run so far (seed -> :class:`~nnx_ppo.algorithms.trainer.Failure`), for a resume."""
        if self.path is None or not self.resuming:
            return {}
        from nnx_ppo.algorithms.functional import ReplayMismatchError
        from nnx_ppo.algorithms.ppo import NonFiniteError
        from nnx_ppo.algorithms.trainer import Failure

        kinds = {"NonFiniteError": NonFiniteError, "ReplayMismatchError": ReplayMismatchError}
        return {seed: Failure(iteration=int(row["iteration"]), env_steps=int(row["env_steps"]),
                              error=kinds.get(row.get("failure_type"), RuntimeError)(row[FAILURE_KEY]))
                for seed, row in failure_rows(read_metrics(self.path)).items()}

    def close(self) -> None:
        """Close the bar and the logger, then release the directory."""
        try:
            if self.bar is not None:
                self._show_evaluations()
                self.bar.close()
            if self.logger is not None:
                self.logger.close()
        finally:
            self.bar = self.logger = None  # (closing twice does nothing)
            if self._lock is not None:
                self._lock.release()
                self._lock = None


def _snapshot_own_code(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    """Copy the files of the user's env and network (``FILE.py:NAME`` or
    ``MODULE:NAME`` references) into ``run_dir/source/``; what
    :func:`nnx_ppo.envs.registry.snapshot` returns, for ``config.json``."""
    from nnx_ppo.envs.registry import is_own_code, snapshot
    from nnx_ppo.network_spec import is_factory_reference

    refs = [spec.env] if spec.env_rebuildable and is_own_code(spec.env) else []
    kind = spec.network.get("kind")
    if isinstance(kind, str) and is_factory_reference(kind):
        refs.append(kind)
    return snapshot(refs, run_dir) if refs else {}


def open_output(run_dir, *, progress: bool, train_env, eval_env, network_spec, network, config: TrainConfig,
                seeds, resuming: bool) -> Run:
    """The Run of a trainer's ``run_dir=`` / ``progress=`` (the run layer's
    part of :class:`~nnx_ppo.algorithms._outputs.RunLayer`)."""
    from nnx_ppo.algorithms.distributed import is_primary

    spec = RunSpec.of_python(train_env=train_env, eval_env=eval_env, network_spec=network_spec, network=network,
                             config=config, seeds=seeds)
    return Run.open(run_dir, spec, resuming=resuming, progress=progress, primary=is_primary())


def named_network(named, env, eval_env, seed: int):
    """``(factory(rngs), spec)`` of a network named by a string (``"mlp"``,
    ``"lstm"``, ``"gru"``, ``"MODULE:FUNCTION"``, ``"FILE.py:FUNCTION"``) or a
    :class:`~nnx_ppo.network_spec.NetworkSpec`, for ``env`` (the env spec
    recorded from ``eval_env``'s, or ``env``'s, :func:`~nnx_ppo.envs.make`
    call); None for a network object or factory function."""
    from nnx_ppo.network_spec import NetworkSpec

    if not isinstance(named, (str, NetworkSpec)):
        return None
    env_spec, env_kwargs = spec_of(eval_env) or spec_of(env) or (None, {})
    spec = named
    if isinstance(named, str):
        spec = NetworkSpec.sized(env_spec or "", named, NAMED_NETWORK_WIDTH, seed=seed, env_kwargs=env_kwargs)
    if env_spec is not None and not spec.env:
        spec = dataclasses.replace(spec, env=env_spec, env_kwargs=env_kwargs)
    return (lambda rngs: spec.build(env, rngs)), spec


def checkpoints_of(resume_from) -> str:
    """``resume_from``, or the checkpoint directory of the run directory it names."""
    path = Path(resume_from)
    if (path / CONFIG_FILE).is_file() and (path / CHECKPOINT_DIR).is_dir():
        return str(path / CHECKPOINT_DIR)
    return resume_from
