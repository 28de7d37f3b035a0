"""Many hosts: one training run over the devices of several processes.

Every process runs the same program (JAX's multi-controller model): call
:func:`initialize` first in each, then train as usual. The env mesh of
:mod:`nnx_ppo.algorithms.sharding` then spans every process's devices, each
process steps the envs on its own devices, parameters are replicated, and
XLA all-reduces the gradient across processes. Checkpoints are written by
all processes through orbax (each its shards; process 0 the metadata, the
JSON files and the final rename), so the checkpoint directory must be on a
filesystem every process sees. Only process 0 should log and write run
directories (:func:`is_primary`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["initialize", "check_port_free", "check_same_everywhere", "is_primary", "process_count", "barrier",
           "to_global"]


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               local_device_count: int | None = None) -> None:
    """Join the run as process ``process_id`` of ``num_processes``
    (``jax.distributed.initialize``); call before anything touches a device.

    Args:
      coordinator_address: ``HOST:PORT`` of process 0 (it listens there).
      num_processes: how many processes take part.
      process_id: this process's index, ``0 .. num_processes - 1``.
      local_device_count: on CPU, expose this many host devices in this
        process (``--xla_force_host_platform_device_count``); CPU processes
        exchange data through gloo.
    """
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, num_processes={num_processes}), got {process_id}")
    if ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be HOST:PORT, got {coordinator_address!r}")
    if process_id == 0:
        check_port_free(coordinator_address)
    if local_device_count is not None:
        import os

        flag = f"--xla_force_host_platform_device_count={int(local_device_count)}"
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), flag]).strip()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)


def check_port_free(coordinator_address: str) -> None:
    """Process 0 listens on the coordinator's port: a ValueError in one line
    when something else holds it (instead of a crash inside gRPC)."""
    import socket

    port = coordinator_address.rpartition(":")[2]
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"coordinator_address must be HOST:PORT with a numeric port, "
                         f"got {coordinator_address!r}") from None
    with socket.socket(socket.AF_INET) as probe:  # the coordinator listens on every interface
        try:
            probe.bind(("", port_number))
        except OSError as err:
            raise ValueError(f"coordinator address {coordinator_address} is not free for process 0 to listen on "
                             f"({err.strerror}); pick another port, or end the program holding it") from None


def check_same_everywhere(digest: bytes, what: str) -> None:
    """Every process must pass the same ``digest`` (e.g. a hash of its
    settings); a ValueError in every process names those that differ from
    process 0. No-op alone."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    mine = np.frombuffer(digest[:16].ljust(16, b"\0"), dtype=np.uint32)
    everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
    differ = [i for i in range(len(everyone)) if not np.array_equal(everyone[i], everyone[0])]
    if differ:
        raise ValueError(f"processes {differ} were started with other {what} than process 0; start every process "
                         "with the same flags (only --process-id differs)")


def process_count() -> int:
    """Number of processes in the run (1 without :func:`initialize`)."""
    return jax.process_count()


def is_primary() -> bool:
    """True in process 0, the one that logs and writes run directories."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (no-op alone)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def to_global(tree: Any, shardings: Any) -> Any:
    """Place ``tree`` (each process holding the same full values on its own
    devices) on ``shardings``, which may span other processes' devices:
    every process keeps the shards of its own devices. Typed PRNG keys go
    through their key data. Alone, this is ``jax.device_put``."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def place(leaf, sharding):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = jax.device_put(np.asarray(jax.random.key_data(leaf)), sharding)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        return jax.device_put(np.asarray(leaf), sharding)

    return jax.tree.map(place, tree, shardings)
