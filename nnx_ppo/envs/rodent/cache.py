"""``enable_compilation_cache``: keep compiled XLA programs on disk between runs.

The rodent's MJX step is a large program; compiling it is most of the
start-up time of a rodent run on a CPU. With JAX's persistent compilation
cache a second run (same code, same shapes, same JAX and CPU) loads the
compiled programs instead (docs/rodent.md has the measured effect).
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["enable_compilation_cache", "default_cache_dir"]


def default_cache_dir() -> pathlib.Path:
    """``$XDG_CACHE_HOME/nnx_ppo/jax`` (default ``~/.cache/nnx_ppo/jax``)."""
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base, "nnx_ppo", "jax")


def enable_compilation_cache(path: str | os.PathLike | None = None, min_compile_seconds: float = 1.0) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in ``path`` (created if needed).

    Args:
      path: the cache folder; default :func:`default_cache_dir`.
      min_compile_seconds: programs that compiled faster than this are not stored.

    Returns the folder. Programs compiled after the call are cached (and
    looked up); call it before the first training iteration compiles.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder = pathlib.Path(path).expanduser() if path is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # so a cache already initialized (or disabled) picks up the new folder
    jax.config.update("jax_compilation_cache_dir", str(folder))
    return folder
