"""Many devices: training sharded over local devices, and over the devices
of several processes.

*Local devices* (``jax.sharding``). By env: the env states, network carries
and running episode statistics (leaves ``[B, ...]``, or ``[S, B, ...]`` for a
seed batch) are split over a one-axis :class:`~jax.sharding.Mesh` named
``"envs"``; parameters, optimizer state and keys are replicated. The jitted
iteration is the same program: XLA partitions the rollout and the replay by
env and inserts the all-reduce of the gradient. Minibatches take an equal
share of every device's envs (``PPOConfig.shuffle_blocks``), so no env
sequence moves between devices. By seed (a seed batch of
:func:`~nnx_ppo.algorithms.population.train_seeds` with
``TrainConfig.shard_seeds``): every leaf of the ``[S, ...]`` state is split
on its seed axis over a mesh named ``"seeds"``; each device trains whole
seeds and nothing crosses devices during an iteration.

*Several processes* (hosts). Every process runs the same program (JAX's
multi-controller model): call :func:`initialize` first in each, then train
as usual. The env mesh then spans every process's devices, each process
steps the envs on its own devices, parameters are replicated, and XLA
all-reduces the gradient across processes. Checkpoints are written by all
processes through orbax (each its shards; process 0 the metadata, the JSON
files and the final rename), so the checkpoint directory must be on a
filesystem every process sees. Only process 0 should log and write run
directories (:func:`is_primary`).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from nnx_ppo.algorithms.config import PPOConfig

__all__ = ["initialize", "any_process", "watch_peers"]


DEFAULT_TIMEOUT = 120
"""Seconds a process waits for the others to join, and for a silent peer, before it ends."""


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               local_device_count: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Join the run as process ``process_id`` of ``num_processes``
    (``jax.distributed.initialize``); call before anything touches a device.

    Args:
      coordinator_address: ``HOST:PORT`` of process 0 (it listens there).
      num_processes: how many processes take part.
      process_id: this process's index, ``0 .. num_processes - 1``.
      local_device_count: on CPU, expose this many host devices in this
        process (``--xla_force_host_platform_device_count``); CPU processes
        exchange data through gloo.
      timeout: seconds to wait for every process to join; then the process
        prints one line saying what it waited for and ends (exit code 1).
        JAX's own heartbeat gives up on a silent peer after ``2 * timeout``
        (:func:`watch_peers` ends the run sooner, in one line).
    """
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id must be in [0, num_processes={num_processes}), got {process_id}")
    if ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be HOST:PORT, got {coordinator_address!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if process_id == 0:
        check_port_free(coordinator_address)
    if local_device_count is not None:
        flag = f"--xla_force_host_platform_device_count={int(local_device_count)}"
        os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), flag]).strip()
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    waited = "the other processes" if process_id == 0 else f"process 0 at {coordinator_address}"
    message = (f"process {process_id}: {waited} did not join within {timeout:g} s; start all {num_processes} "
               "processes with the same --coordinator-address and --num-processes (or wait longer: "
               "--distributed-timeout)")
    # JAX ends a process whose peers do not join with a C++ abort; this ends it first, in one line.
    joined = _end_unless(message, timeout)
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=int(timeout) + 60,
                               heartbeat_timeout_seconds=max(10, int(2 * timeout)),
                               shutdown_timeout_seconds=max(1, int(timeout)))
    joined.set()


def _end_unless(message: str, timeout: float):
    """An event; unless it is set within ``timeout`` seconds, print
    ``message`` as an error and end the process with exit code 1."""
    done = threading.Event()

    def expire() -> None:
        if not done.wait(timeout):
            _end(message)

    threading.Thread(target=expire, name="nnx-ppo-join-timeout", daemon=True).start()
    return done


def _end(message: str) -> None:
    """Print ``message`` as one error line and end this process now (exit
    code 1), even while its main thread waits inside JAX."""
    print(f"nnx-ppo: error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def check_port_free(coordinator_address: str) -> None:
    """Process 0 listens on the coordinator's port: a ValueError in one line
    when something else holds it (instead of a crash inside gRPC)."""
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


def any_process(flag: bool) -> bool:
    """Whether ``flag`` holds in any process: every process calls it at the
    same point (e.g. a stop asked for in one process stops all of them at
    the same iteration). ``flag`` itself when alone."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray([int(bool(flag))], np.int32))))


def watch_peers(timeout: float = DEFAULT_TIMEOUT, on_lost=None, interval: float = 2.0):
    """Start a daemon thread that beats this process's heartbeat into the
    coordinator's key-value store every ``interval`` seconds and watches the
    others'. When a peer's heartbeat has not moved for ``timeout`` seconds,
    or the coordinator cannot be reached, it calls ``on_lost(message)``
    (default: print the message and end this process with exit code 1,
    even while the main thread waits in a collective). Returns a function
    that stops the watch. No-op alone."""
    if jax.process_count() == 1:
        return lambda: None
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
    me, count = jax.process_index(), jax.process_count()
    stopped = threading.Event()

    def lost(message: str) -> None:
        if stopped.is_set():
            return
        (on_lost or _end)(message)

    def beat() -> None:
        seen: dict[int, tuple[str, float]] = {}
        beats = 0
        while not stopped.wait(interval):
            beats += 1
            now = time.monotonic()
            try:
                client.key_value_set(f"nnx_ppo/heartbeat/{me}", str(beats), allow_overwrite=True)
                for peer in range(count):
                    if peer == me:
                        continue
                    try:
                        value = client.key_value_try_get(f"nnx_ppo/heartbeat/{peer}")
                    except Exception:  # not written yet
                        value = ""
                    if peer not in seen or seen[peer][0] != value:
                        seen[peer] = (value, now)
                    elif now - seen[peer][1] > timeout:
                        lost(f"process {me}: process {peer} stopped responding (no heartbeat for {timeout:g} s), "
                             "so this process ends too; restart every process with --resume to continue from the "
                             "last checkpoint")
                        return
            except Exception as err:  # the coordinator (process 0) is gone
                lost(f"process {me}: lost the coordinator, process 0 ({str(err).splitlines()[0][:160]}); "
                     "restart every process with --resume to continue from the last checkpoint")
                return

    threading.Thread(target=beat, name="nnx-ppo-peer-watch", daemon=True).start()
    atexit.register(stopped.set)  # before JAX's own shutdown (registered earlier, run later) ends the coordinator
    _WATCH.update(timeout=timeout + 2 * interval, stopped=stopped)
    return stopped.set


_WATCH: dict[str, Any] = {}


def await_lost_peer(error: BaseException) -> None:
    """Called with an error training raised in a run of several processes:
    when it is a collective that failed (a peer's connection closed) and
    :func:`watch_peers` runs, wait until the watch has named the lost peer
    and ended this process. Returns at once otherwise (or, if no peer is
    lost within the watch's timeout, after it)."""
    text = str(error)
    collective = any(word in text for word in ("Gloo", "gloo", "Connection closed", "Connection reset",
                                               "UNAVAILABLE", "DEADLINE_EXCEEDED", "NCCL"))
    if not collective or not _WATCH or _WATCH["stopped"].is_set():
        return
    time.sleep(_WATCH["timeout"])


def process_count() -> int:
    """Number of processes in the run (1 without :func:`initialize`)."""
    return jax.process_count()


def is_primary() -> bool:
    """True in process 0, the one that logs and writes run directories."""
    return jax.process_index() == 0


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


# ----------------------------------------------------------------------------- local devices


ENV_AXIS = "envs"
SEED_AXIS = "seeds"


def local_devices(n_devices: int | None, n_envs: int, n_seeds: int | None = None) -> list:
    """The first ``n_devices`` local devices (all when None); named errors
    when there are fewer or when ``n_envs`` (with ``n_seeds``: the number of
    seeds, split by seed) does not split evenly. In a run of several
    processes (:func:`nnx_ppo.algorithms.distributed.initialize`), every process's
    devices: the mesh spans them all."""
    if jax.process_count() > 1:
        available = jax.devices()
        if n_devices not in (None, len(available)):
            raise ValueError(f"TrainConfig.n_devices is {n_devices}, but a run of {jax.process_count()} processes "
                             f"uses all their {len(available)} devices; set n_devices=None")
        n_devices = None
    else:
        available = jax.local_devices()
    n = len(available) if n_devices is None else n_devices
    if n > len(available):
        raise ValueError(f"TrainConfig.n_devices is {n_devices} but only {len(available)} local devices exist "
                         f"({available[0].platform})")
    if n_seeds is not None and n_seeds % n:
        raise ValueError(f"the number of seeds ({n_seeds}) must be divisible by the number of devices ({n}) to "
                         "shard the seeds over them (TrainConfig.shard_seeds); change the seeds, "
                         "TrainConfig.n_devices, or shard the envs instead (shard_seeds=False)")
    if n_seeds is None and n_envs % n:
        raise ValueError(f"PPOConfig.n_envs ({n_envs}) must be divisible by the number of devices ({n}) to shard "
                         "the envs over them; change n_envs or TrainConfig.n_devices")
    return available[:n]


def seed_mesh(devices: list) -> Mesh:
    """A one-axis mesh over ``devices`` named :data:`SEED_AXIS`."""
    return Mesh(np.asarray(devices), (SEED_AXIS,))


def sharded_config(config: PPOConfig, n_devices: int) -> PPOConfig:
    """``config`` with ``shuffle_blocks`` a multiple of ``n_devices`` (1 becomes
    ``n_devices``), so that every block lies on one device."""
    blocks = config.shuffle_blocks
    if blocks % n_devices == 0:
        return config
    if blocks != 1:
        raise ValueError(f"PPOConfig.shuffle_blocks ({blocks}) must be a multiple of the number of devices "
                         f"({n_devices}) (or 1, which means one block per device)")
    try:
        return dataclasses.replace(config, shuffle_blocks=n_devices)
    except ValueError as err:
        raise ValueError(f"sharding over {n_devices} devices uses {n_devices} shuffle blocks: {err}") from None


def state_shardings(state: Any, mesh: Mesh, seed_batch: bool = False) -> Any:
    """Shardings for a :class:`~nnx_ppo.algorithms.state.TrainingState`: its
    rollout state and per-env return statistics split on their env axis
    (the leading one; the second with ``seed_batch``, whose leaves are
    ``[S, B, ...]``), everything else replicated (a pytree of the state's
    structure)."""
    replicated = NamedSharding(mesh, PartitionSpec())
    by_env = NamedSharding(mesh, PartitionSpec(None, ENV_AXIS) if seed_batch else PartitionSpec(ENV_AXIS))
    every = lambda tree, sharding: jax.tree.map(lambda _: sharding, tree)
    stats = state.return_stats
    return dataclasses.replace(
        every(state, replicated),
        rollout=every(state.rollout, by_env),
        return_stats=dataclasses.replace(every(stats, replicated),
                                         discounted_return=by_env),
    )


def seed_shardings(state: Any, mesh: Mesh) -> Any:
    """Shardings for a seed batch ``[S, ...]`` split by seed: every leaf on
    its leading axis over ``mesh`` (see :func:`seed_mesh`)."""
    by_seed = NamedSharding(mesh, PartitionSpec(SEED_AXIS))
    return jax.tree.map(lambda _: by_seed, state)


def place(state: Any, ppo: PPOConfig, devices: list, *, seed_batch: bool = False,
          by_seed: bool = False) -> tuple[Any, PPOConfig, Any, Mesh | None]:
    """Put a training state on ``devices`` (from :func:`local_devices`):
    by env (:func:`state_shardings`; ``seed_batch`` for ``[S, ...]`` states)
    or, with ``by_seed``, by seed (:func:`seed_shardings`). Returns the placed
    state, the config to compile with (:func:`sharded_config` when split by
    env), the shardings and the mesh; on one device the state and config
    unchanged and ``None, None``."""
    if len(devices) == 1:
        return state, ppo, None, None
    if by_seed:
        mesh = seed_mesh(devices)
        shardings = seed_shardings(state, mesh)
    else:
        mesh = Mesh(np.asarray(devices), (ENV_AXIS,))
        ppo = sharded_config(ppo, len(devices))
        shardings = state_shardings(state, mesh, seed_batch=seed_batch)
    return to_global(state, shardings), ppo, shardings, mesh


def replicated(tree: Any, mesh: Mesh | None) -> Any:
    """``tree`` readable by this process: in a run of several processes,
    every leaf replicated on every device of ``mesh`` (a seed's slice may
    live on another process); alone or without a mesh, ``tree`` itself."""
    if mesh is None or jax.process_count() == 1:
        return tree
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda t: t, out_shardings=jax.tree.map(lambda _: sharding, tree))(tree)
