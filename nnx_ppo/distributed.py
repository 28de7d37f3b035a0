"""Many hosts: ``nnx_ppo.distributed.initialize(...)`` before training (see
:mod:`nnx_ppo.algorithms.distributed` and docs/scale.md)."""

from nnx_ppo.algorithms.distributed import barrier, initialize, is_primary, process_count, to_global

__all__ = ["initialize", "is_primary", "process_count", "barrier", "to_global"]
