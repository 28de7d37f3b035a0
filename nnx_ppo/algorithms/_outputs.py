"""What a trainer writes besides its result, as an interface the run layer implements.

The trainers (:mod:`nnx_ppo.algorithms.trainer`) know nothing of run
directories: they write to a :class:`RunOutput`. Run directories, progress
bars and networks named by a string (``"mlp"``, a
:class:`~nnx_ppo.network_spec.NetworkSpec`) belong to the run layer
(:mod:`nnx_ppo.runner`), which sits above ``algorithms/``. The package root
(``nnx_ppo/__init__.py``, imported before any of its modules) names it in
:data:`RUN_LAYER`, so that ``train_ppo(..., run_dir=...)`` reaches it
(:func:`nnx_ppo.algorithms.trainer.run_layer`) with no import running up the
layers. Declarations only: no JAX is imported here, and no code runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["RunOutput", "RunLayer", "RUN_LAYER"]


class RunOutput(Protocol):
    """Where one run's outputs go (the run layer's :class:`nnx_ppo.runner.Run`).

    Attributes:
      checkpoint_dir: where the training state is saved (None: nowhere).
      checkpoint_metadata: what each checkpoint records besides the state.
    """

    checkpoint_dir: str | None
    checkpoint_metadata: dict[str, Any]

    def begin(self, record: dict[str, Any]) -> None:
        """Training begins: the run's description is written, with what the
        algorithm ``record``s (a population's members, a distillation's settings)."""

    def log(self, metrics: dict[str, Any], env_steps: int, seed: int | None = None) -> None:
        """One row: an iteration's statistics or an evaluation (keys ``eval/...``)."""

    def record_failure(self, failure: Any, seed: int) -> None:
        """The :class:`~nnx_ppo.algorithms.trainer.Failure` of batch entry ``seed``."""

    def earlier_failures(self) -> dict[int, Any]:
        """The failures a resumed run recorded before (seed -> :class:`~nnx_ppo.algorithms.trainer.Failure`)."""

    def close(self) -> None:
        """End the outputs (files flushed, the progress bar closed, the run directory released)."""


class RunLayer(Protocol):
    """What the trainers ask of the run layer (see :mod:`nnx_ppo.runner`)."""

    def open_output(self, run_dir, *, progress: bool, train_env, eval_env, network_spec, network, config,
                    seeds, resuming: bool) -> RunOutput:
        """Open ``run_dir`` (or None: only a progress bar) for a trainer's run."""

    def named_network(self, named, env, eval_env, seed: int) -> tuple[Callable, Any] | None:
        """``(factory(rngs), spec)`` of a network named by a string or a
        NetworkSpec; None for a network object or factory function."""

    def checkpoints_of(self, resume_from) -> str:
        """``resume_from``, or the checkpoint directory of the run directory it names."""


RUN_LAYER: str | None = None
"""The module implementing :class:`RunLayer` (``"nnx_ppo.runner"``), named by the package root."""
