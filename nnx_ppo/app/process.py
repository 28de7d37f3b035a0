"""The process a command runs in: one-line warnings, quiet library logs, the
compilation cache on disk, and joining a run of several processes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import warnings

from nnx_ppo.app.commands import PROG, CliError, TrainCommand

__all__ = ["format_warning", "quiet_library_logs", "compilation_cache", "join_processes"]


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
    if cmd.coordinator_address is None:
        if cmd.num_processes != 1 or cmd.process_id != 0:
            raise CliError("--num-processes and --process-id need --coordinator-address HOST:PORT")
        return
    from nnx_ppo import run_dir as rd
    from nnx_ppo.algorithms.distributed import check_same_everywhere, initialize, watch_peers

    try:
        initialize(cmd.coordinator_address, cmd.num_processes, cmd.process_id, timeout=cmd.distributed_timeout)
        # Every process must train the same run: compare a hash of the settings (all but --process-id).
        settings = {f.name: getattr(cmd, f.name) for f in dataclasses.fields(cmd)
                    if f.name not in ("process_id", "config")}
        settings["config"] = rd.train_config_to_dict(cmd.config)
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).digest()
        check_same_everywhere(digest, "settings (flags)")
    except ValueError as e:
        raise CliError(str(e)) from None
    # A peer that dies or hangs ends every process within --distributed-timeout, in one line.
    watch_peers(cmd.distributed_timeout)
