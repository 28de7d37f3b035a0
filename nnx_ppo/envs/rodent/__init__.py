"""Rodent tasks on dm-control's virtual rodent body, trainable under MJX on a CPU.

* ``rodent_imitation`` (:class:`RodentImitation`): track reference clips.
* ``rodent_run`` (:class:`RodentRun`): run forward without falling.

Both are ``mujoco_playground.MjxEnv`` subclasses; :func:`make_env` wraps one
in the Playground adapter as ``nnx_ppo.envs.make`` does. They need
``pip install "nnx_ppo[rodent]"`` (dm_control, for its ``rodent.xml``) and
MuJoCo Playground. See docs/rodent.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nnx_ppo._lazy import lazy_exports

_EXPORTS = {
    "nnx_ppo.envs.rodent.tasks": ("RodentImitation", "RodentRun"),
    "nnx_ppo.envs.rodent.clips": ("Clips", "generate_clips", "load_clips"),
    "nnx_ppo.envs.rodent.body": ("load_model", "rodent_xml_path"),
}
# all importable from here; the tasks are the public names
_, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["RodentImitation", "RodentRun"]

_CLASSES = {"rodent_imitation": "RodentImitation", "rodent_run": "RodentRun"}


def make_env(name: str, **config_overrides: Any):
    """The task ``name`` (``"rodent_imitation"`` or ``"rodent_run"``) in the
    Playground adapter (no time limit; ``make`` adds it). Keyword arguments
    override the task's config (e.g. ``n_clips=4``, ``iterations=6``)."""
    from nnx_ppo.envs.adapters import PlaygroundEnv
    from nnx_ppo.envs.rodent import body

    body.rodent_xml_path()  # the one-line ImportError before anything heavier
    if name not in _CLASSES:
        raise ValueError(f"unknown rodent task {name!r}; choose from {', '.join(_CLASSES)}")
    cls = __getattr__(_CLASSES[name])
    return PlaygroundEnv(cls(config_overrides=config_overrides or None), name)


if TYPE_CHECKING:
    from nnx_ppo.envs.rodent.body import load_model, rodent_xml_path
    from nnx_ppo.envs.rodent.clips import Clips, generate_clips, load_clips
    from nnx_ppo.envs.rodent.tasks import RodentImitation, RodentRun
