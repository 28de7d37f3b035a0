"""Progress on long work and how it stops: a bar (plain lines without a terminal), Ctrl-C handling, formatting."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any


def pretty_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p.resolve())


def fmt_seconds(s: float) -> str:
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
                try:
                    self._previous[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def __call__(self) -> bool:
        return self.requested


def _terminal() -> bool:
    """Whether stderr (where the bar goes) is a terminal wide enough for a bar."""
    import shutil
    import sys

    return sys.stderr.isatty() and shutil.get_terminal_size((0, 0)).columns >= 40


class Progress:
    """Progress over env steps: a bar (tqdm) in a terminal; without one (output
    piped to a file, or a terminal too narrow for a bar) a plain line at most
    every ``interval`` seconds; with --quiet only the evaluations."""

    def __init__(self, total_steps: int, steps_per_iteration: int, quiet: bool, interval: float = 30.0):
        self.total = total_steps
        self.spi = steps_per_iteration
        self.quiet = quiet
        self.interval = interval
        self.plain = not quiet and not _terminal()
        self._last_line = -float("inf")
        self.bar = None
        self.t_start = time.perf_counter()
        self.compile_reported = False
        self._first_step: int | None = None
        self._first_time = 0.0
        self.eval_return: float | None = None
        self.train_return: float | None = None

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    def start(self) -> None:
        self.t_start = time.perf_counter()
        self.write("compiling... (the first call compiles the training step; this can take a while)")

    def iteration(self, metrics: dict[str, float], env_steps: int) -> None:
        if not self.compile_reported:
            self.compile_reported = True
            self.write(f"compiled in {time.perf_counter() - self.t_start:.1f} s")
            if not self.quiet and not self.plain:
                from tqdm.auto import tqdm

                self.bar = tqdm(
                    total=self.total,
                    initial=max(env_steps - self.spi, 0),
                    unit="step",
                    unit_scale=True,
                    dynamic_ncols=True,
                    smoothing=0.1,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]{postfix}",
                )
        if metrics.get("train/completed_episodes", 0) > 0:
            self.train_return = metrics.get("train/episode_return")
        if self.bar is not None:
            self.bar.update(min(env_steps, self.total) - self.bar.n)
            self._postfix()
        elif self.plain:
            self._plain_line(env_steps)

    def _plain_line(self, env_steps: int) -> None:
        """``[steps/total] 45%  12,345 steps/s  elapsed 0:40  left 0:49`` (rate-limited; the
        rate and what is left once a rate is measured, from the second line on)."""
        now = time.perf_counter()
        if now - self._last_line < self.interval and env_steps < self.total:
            return
        if self._first_step is None:
            self._first_step, self._first_time = env_steps, now
        self._last_line = now
        done = min(env_steps, self.total)
        rate = (done - self._first_step) / (now - self._first_time) if now > self._first_time else 0.0
        speed = f"  {rate:,.0f} steps/s" if rate > 0 else ""
        left = f"  left {fmt_seconds((self.total - done) / rate)}" if rate > 0 else ""
        self.write(f"[{done:>{len(str(self.total))}d}/{self.total}] {100 * done / self.total:3.0f}%"
                   f"{speed}  elapsed {fmt_seconds(now - self.t_start)}{left}")

    def evaluation(self, metrics: dict[str, float], env_steps: int) -> None:
        self.eval_return = metrics.get("eval/episode_return")
        msg = (f"[{env_steps:>{len(str(self.total))}d}/{self.total}] eval return "
               f"{self.eval_return:.3f} ± {metrics.get('eval/episode_return_std', float('nan')):.3f}"
               f"  (length {metrics.get('eval/episode_length', float('nan')):.1f})")
        if self.train_return is not None:
            msg += f"  train return {self.train_return:.3f}"
        if self.quiet:
            msg += f"  elapsed {fmt_seconds(time.perf_counter() - self.t_start)}"
        self.write(msg)
        if self.bar is not None:
            self._postfix()

    def _postfix(self) -> None:
        parts = []
        if self.eval_return is not None:
            parts.append(f"eval {self.eval_return:.3f}")
        if self.train_return is not None:
            parts.append(f"train {self.train_return:.3f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
