"""The process a command runs in: one-line warnings, quiet library logs, the
compilation cache on disk, joining a run of several processes, and how
every command that trains ends: training into an open
:class:`~nnx_ppo.runner.Run`, with each way it can end turned into an exit
code and one line, the run directory intact (``train``, ``--seeds``,
``distill``, ``sweep`` and ``resume`` alike).

=====  ==================================================================
code   how training ended
=====  ==================================================================
0      done, or stopped early by Ctrl-C / SIGTERM (a checkpoint is saved)
1      failed: non-finite values, a replay mismatch, an env, checkpoint or disk error
130    aborted by a second Ctrl-C (the last checkpoint is kept)
=====  ==================================================================

Only :mod:`nnx_ppo.app.commands` is imported with this module (``nnx-ppo
--help`` imports it); what training needs is imported when it runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nnx_ppo import runner as rd
from nnx_ppo.app.commands import PROG, CliError, TrainCommand, print_error, usage_errors

if TYPE_CHECKING:
    from nnx_ppo.runner import Run, StopFlag

__all__ = ["format_warning", "quiet_library_logs", "compilation_cache", "join_processes", "train_into"]


_python_format_warning = warnings.formatwarning


def format_warning(message, category, filename, lineno, line=None) -> str:
    """The library's own warnings (e.g. a skipped unreadable checkpoint) as
    one line; others as Python formats them."""
    if category.__module__.startswith("nnx_ppo."):
        return f"{PROG}: warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


def _closed_loop(value) -> bool:
    return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"


def quiet_library_logs() -> None:
    """Failures are reported in one line by the command itself: the logs that
    orbax's background threads write when a checkpoint fails (absl errors,
    asyncio callbacks after the loop closed) are not shown as well."""
    import logging

    for name in ("absl", "concurrent.futures", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    shown, unraisable = sys.excepthook, sys.unraisablehook
    # tensorstore callbacks after a failure raise "Event loop is closed"
    sys.excepthook = lambda kind, value, tb: None if _closed_loop(value) else shown(kind, value, tb)
    sys.unraisablehook = lambda info: None if _closed_loop(info.exc_value) else unraisable(info)


def compilation_cache() -> None:
    """Keep compiled programs on disk between runs
    (:func:`nnx_ppo.algorithms.ppo.enable_compilation_cache`): in the
    folder ``JAX_COMPILATION_CACHE_DIR`` names, else ``~/.cache/nnx_ppo/jax``;
    ``JAX_ENABLE_COMPILATION_CACHE=false`` turns it off. A folder that cannot
    be made is a warning, not an error."""
    import jax

    from nnx_ppo.algorithms.ppo import enable_compilation_cache

    if not jax.config.jax_enable_compilation_cache:
        return
    try:
        enable_compilation_cache(os.environ.get("JAX_COMPILATION_CACHE_DIR") or None,
                                 jax.config.jax_persistent_cache_min_compile_time_secs)
    except OSError as e:
        warnings.warn(f"no compilation cache ({e}); every run compiles afresh", stacklevel=2)


def join_processes(cmd: TrainCommand) -> None:
    """``--coordinator-address``: join a run of several processes before
    anything touches a device (``nnx_ppo.algorithms.distributed.initialize``)."""
    flags = cmd.processes
    if flags.coordinator_address is None:
        if flags.num_processes != 1 or flags.process_id != 0:
            raise CliError("--num-processes and --process-id need --coordinator-address HOST:PORT")
        return
    from nnx_ppo.algorithms.distributed import check_same_everywhere, initialize, watch_peers

    with usage_errors(ValueError):
        initialize(flags.coordinator_address, flags.num_processes, flags.process_id, timeout=flags.distributed_timeout)
        # Every process must train the same run: compare a hash of the settings (all but --process-id).
        settings = {**vars(cmd), "processes": dataclasses.replace(flags, process_id=0),
                    "config": rd.train_config_to_dict(cmd.config)}
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
        check_same_everywhere(digest, "settings (flags)")
    # A peer that dies or hangs ends every process within --distributed-timeout, in one line.
    watch_peers(flags.distributed_timeout)


def train_into(run: Run, train: Callable[[StopFlag], Any]) -> tuple[int, Any, bool]:
    """``train(stop)`` into ``run`` (``stop()`` turns True after a Ctrl-C or
    SIGTERM): ``(exit code, its result or None, whether a stop was
    asked)``; ``run`` is closed (its directory released) in every case. A
    usage error (:class:`~nnx_ppo.app.commands.CliError`) passes through, and
    a bad row of a resumed run's metrics.jsonl becomes one (before training)."""
    from nnx_ppo.algorithms.distributed import await_lost_peer, process_count
    from nnx_ppo.algorithms.ppo import FootprintError, NonFiniteError
    from nnx_ppo.runner import StopFlag, pretty_path

    stop = StopFlag(run.write)
    code, result = 0, None
    try:  # (a bad metrics row of a resumed run, a config too large for the memory: refused before training)
        with stop, usage_errors(rd.MetricsError, FootprintError):
            result = train(stop)
    except KeyboardInterrupt:
        run.close()
        where = f" is in {pretty_path(run.path / rd.CHECKPOINT_DIR)}" if run.path is not None else " is kept"
        print_error(f"aborted; metrics so far are kept, and the last saved checkpoint (if any){where}")
        code = 130
    except NonFiniteError as e:
        run.close()
        print_error(str(e))
        code = 1
    except (ValueError, OSError, RuntimeError) as e:  # env checks, checkpoints, shapes, the disk
        run.close()
        if process_count() > 1:  # a collective that failed because a peer is gone: the watch names the peer
            await_lost_peer(e)
        print_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        code = 1
    finally:
        run.close()
    return code, result, stop.requested
