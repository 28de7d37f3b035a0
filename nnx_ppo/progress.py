"""Progress on long work and how it stops: a tqdm bar, Ctrl-C handling, formatting."""

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
        import sys

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
