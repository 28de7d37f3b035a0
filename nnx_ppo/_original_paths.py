"""The import paths of the original nnx-ppo 0.3.0, answered here (internal).

:data:`TABLE` holds every public name of the original whose path does not
simply work in this library: its dotted path in the original maps either to
``"module:attr"`` (the same thing here, under another path) or to a
:class:`Replaced` (importing it raises :class:`ReplacedImportError`, one line
naming what replaced it and the section of ``docs/migrating.md`` that says
more). Two things serve the table, and neither takes part in an import of
this library's own modules:

* an original module that exists here (``nnx_ppo.algorithms.config``, ...)
  takes at its end the module class :data:`ANSWERING` holds for it, where
  each of its names in :data:`NAMES` is a property giving :func:`resolve`'s
  answer (a property, not a module ``__getattr__``: Python's own probes of a
  module, ``__path__`` at every ``from ... import``, then find nothing
  without running any code of this table);
* an original module that does not exist here (``nnx_ppo.algorithms.types``,
  ``nnx_ppo.wrappers.episode_wrapper``, ...) is found on :data:`PATH`, an
  entry of the ``__path__`` of the package that held it (``nnx_ppo`` and
  ``nnx_ppo.algorithms`` after their own folder; ``nnx_ppo.networks.graph``,
  a package in the original and a module here, has it as its ``__path__``):
  a module without contents answered the same way. The import system asks
  the finder of that entry (:func:`install` registers it) only for a
  submodule of those packages that their folder lacks.

A replaced name raises on attribute access too, so ``hasattr`` raises for
it. Nothing else changes: a name or module the original did not have fails
as it would without the table. The list of the original's names, and the
check that each imports or fails this way, is ``tests/test_original_paths.py``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import sys
import types
from typing import Any, NamedTuple

__all__ = ["TABLE", "NAMES", "PATH", "Replaced", "ReplacedImportError", "resolve", "ANSWERING", "install"]

DOC = "docs/migrating.md"
SECTION = "the-originals-import-paths"  # the section of DOC listing this table


class Replaced(NamedTuple):
    """An original name this library replaced: ``by`` says with what (a
    clause of the one-line message), ``section`` is the anchor in
    ``docs/migrating.md`` that explains it."""

    by: str
    section: str = SECTION


class ReplacedImportError(ImportError):
    """Importing a name of the original nnx-ppo 0.3.0 that this library replaced."""


# Type aliases of the original, for annotations.
#: The carry of ``LSTM``: the tuple ``(h, c)``, each ``[B, H]``, as in the original.
LSTMCarry = tuple[Any, Any]
#: The carry of ``AR1VariationalBottleneck``: ``{"key", "prev_z", "has_previous"}``.
AR1State = dict[str, Any]

_RECORD = Replaced("use nnx_ppo.algorithms.evaluation.record_activations(env, network, paths)",
                   "recording-activations-and-distillation")
_RENDER = Replaced("record a video with nnx-ppo eval RUN_DIR --video FILE.mp4, "
                   "or env.render(states) of a Playground env")
_VIDEO = Replaced("pass train_ppo(on_evaluation=fn) (called with each evaluated policy), or run nnx-ppo train "
                  "--video-every N", "train_ppo")
_RESULT = Replaced("the trainers return nnx_ppo.algorithms.trainer.TrainResult (fields state, metrics, "
                   "eval_history of (steps, metrics))", "train_ppo")
_COLLECT = Replaced("use nnx_ppo.algorithms.ppo.collect_rollout (T steps of all envs, as a Trajectory)")
_PAIR = Replaced("use nnx_ppo.algorithms.ppo.collect_rollout with a nnx_ppo.algorithms.distillation.TeacherStudent")

#: original dotted path -> "module:attr" here, or what replaced it.
TABLE: dict[str, str | Replaced] = {
    "nnx_ppo.jax_dataclass.JaxDataclass": "nnx_ppo.networks.types:JaxDataclass",
    # the env protocol, the training state and the rollout's record
    "nnx_ppo.algorithms.types.EnvState": "nnx_ppo.envs.types:EnvState",
    "nnx_ppo.algorithms.types.RLEnv": "nnx_ppo.envs.types:RLEnv",
    "nnx_ppo.algorithms.types.TrainingState": "nnx_ppo.algorithms.ppo:TrainingState",
    "nnx_ppo.algorithms.types.Transition": "nnx_ppo.algorithms.ppo:Trajectory",
    "nnx_ppo.algorithms.types.DistillationState": "nnx_ppo.algorithms.ppo:TrainingState",
    "nnx_ppo.algorithms.types.DistillationTransition": "nnx_ppo.algorithms.ppo:Trajectory",
    "nnx_ppo.algorithms.rollout.tree_where": "nnx_ppo.networks.types:select_where",
    # the trainer (PPO's iteration is nnx_ppo.algorithms.ppo, which the trainer imports)
    "nnx_ppo.algorithms.ppo.train_ppo": "nnx_ppo.algorithms.trainer:train_ppo",
    # the network graph (a package in the original, one module here) and the carries' types
    "nnx_ppo.networks.graph.connection.Connection": "nnx_ppo.networks.graph:Connection",
    "nnx_ppo.networks.graph.graph.PopulationGraph": "nnx_ppo.networks.graph:PopulationGraph",
    "nnx_ppo.networks.graph.population.Population": "nnx_ppo.networks.graph:Population",
    "nnx_ppo.networks.recurrent.LSTMCarry": "nnx_ppo._original_paths:LSTMCarry",
    "nnx_ppo.networks.variational.AR1State": "nnx_ppo._original_paths:AR1State",
    "nnx_ppo.wrappers.reward_scaling_wrapper.RewardScalingWrapper": "nnx_ppo.envs.wrappers:RewardScale",
    # replaced
    "nnx_ppo.algorithms.types.LoggingLevel": Replaced("a fixed set of metrics is logged, with no levels", "metrics"),
    "nnx_ppo.wrappers.episode_wrapper.EpisodeWrapper": Replaced(
        "use nnx_ppo.envs.TimeLimit(env, max_len, random_reset_steps=max_len // 2)", "environments"),
    "nnx_ppo.algorithms.callbacks.wandb_video_fn": _VIDEO,
    "nnx_ppo.algorithms.config.VideoConfig": _VIDEO,
    "nnx_ppo.algorithms.config.VideoData": _VIDEO,
    "nnx_ppo.algorithms.config.TrainResult": _RESULT,
    "nnx_ppo.algorithms.config.DistillationTrainResult": _RESULT,
    "nnx_ppo.algorithms.config.DistillationTrainConfig": Replaced(
        "train_distillation takes a TrainConfig, as train_ppo does"),
    "nnx_ppo.algorithms.config.DistillationConfig": Replaced(
        "put its fields in TrainConfig(ppo=PPOConfig(...)); nnx_ppo.algorithms.distillation.DistillationConfig "
        "holds only teacher mixing"),
    "nnx_ppo.algorithms.checkpointing.CheckpointCallback": Replaced(
        "train_ppo(checkpoint_dir=DIR) saves checkpoints itself", "checkpoints"),
    "nnx_ppo.algorithms.checkpointing.make_checkpoint_fn": Replaced(
        "use train_ppo(checkpoint_dir=DIR), and resume_from=DIR to continue", "checkpoints"),
    "nnx_ppo.algorithms.checkpointing.load_checkpoint": Replaced(
        "use nnx_ppo.load_network(DIR, network), or train_ppo(resume_from=DIR) to continue training", "checkpoints"),
    "nnx_ppo.algorithms.metrics.compute_metrics": Replaced(
        "train_ppo computes a fixed set of metrics and passes them to log_fn", "metrics"),
    "nnx_ppo.algorithms.metrics.log_weight_stats": Replaced(
        "no weight statistics are logged; read the weights with nnx.state(network, nnx.Param)", "metrics"),
    "nnx_ppo.algorithms.ppo.default_config": Replaced("use TrainConfig() (some defaults differ)", "configs"),
    "nnx_ppo.algorithms.ppo.ppo_step": Replaced(
        "use nnx_ppo.algorithms.ppo.train_iteration (one iteration on a TrainingState)"),
    "nnx_ppo.algorithms.ppo.gae": Replaced(
        "use nnx_ppo.algorithms.ppo.compute_gae (terminations and truncations apart; returns advantages and returns)"),
    "nnx_ppo.algorithms.rollout.single_transition": _COLLECT,
    "nnx_ppo.algorithms.rollout.unroll_env": _COLLECT,
    "nnx_ppo.algorithms.rollout.eval_rollout": Replaced(
        "use nnx_ppo.evaluate(env, network, n_envs=..., max_episode_length=...)"),
    "nnx_ppo.algorithms.rollout.record_activations_rollout": _RECORD,
    "nnx_ppo.algorithms.rollout.eval_rollout_for_render_scan": _RENDER,
    "nnx_ppo.algorithms.rollout.unstack_trajectory": _RENDER,
    "nnx_ppo.algorithms.rollout.SlimState": _RENDER,
    "nnx_ppo.algorithms.rollout.SlimData": _RENDER,
    "nnx_ppo.algorithms.distillation.default_distillation_config": Replaced(
        "use TrainConfig() and nnx_ppo.algorithms.distillation.DistillationConfig()"),
    "nnx_ppo.algorithms.distillation.distillation_single_transition": _PAIR,
    "nnx_ppo.algorithms.distillation.distillation_unroll_env": _PAIR,
    "nnx_ppo.algorithms.distillation.distillation_step": Replaced(
        "use nnx_ppo.algorithms.distillation.distillation_iteration"),
    "nnx_ppo.algorithms.distillation.new_distillation_state": Replaced(
        "train_distillation builds its state (a TrainingState); resume_from=DIR continues one"),
}

# Modules of the original with no names of their own (packages).
_PACKAGES = ("nnx_ppo.wrappers", "nnx_ppo.networks.graph")


def _entries() -> dict[str, dict[str, str | Replaced]]:
    by_module: dict[str, dict[str, str | Replaced]] = {name: {} for name in _PACKAGES}
    for path, entry in TABLE.items():
        module, name = path.rsplit(".", 1)
        by_module.setdefault(module, {})[name] = entry
    return by_module


#: original module -> {its names in the table: their entries}
NAMES = _entries()
# original modules with original submodules under them (packages)
_PARENTS = frozenset(module.rsplit(".", 1)[0] for module in NAMES)

PATH = "<nnx-ppo 0.3.0 import paths>"
"""The ``__path__`` entry (not a folder) under which the original's modules
that this library lacks are found."""


def message(path: str) -> str:
    """The one-line message for the replaced original name ``path``."""
    entry = TABLE[path]
    assert isinstance(entry, Replaced), path
    return f"{path} is from the original nnx-ppo 0.3.0 and was replaced: {entry.by} (see {DOC}#{entry.section})"


def resolve(path: str) -> Any:
    """What the original name ``path`` is here (raises ReplacedImportError for a replaced one)."""
    entry = TABLE[path]
    if isinstance(entry, Replaced):
        raise ReplacedImportError(message(path), name=path.rsplit(".", 1)[0])
    module, attr = entry.split(":")
    return getattr(importlib.import_module(module), attr)


def _resolved(path: str, _module: Any) -> Any:
    return resolve(path)


def _answering(module: str) -> type:
    """The module class for the original module ``module``: each of its
    names of the table is a property giving :func:`resolve`'s answer; any
    other missing name raises Python's usual AttributeError."""
    names = {attr: property(functools.partial(_resolved, f"{module}.{attr}")) for attr in NAMES[module]}
    return type("OriginalPaths", (types.ModuleType,), names)


#: original module -> the module class that answers its names of the table. A
#: module of this library that the original had takes it as its class at its
#: end: ``sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]``.
ANSWERING = {module: _answering(module) for module in NAMES}


class _Loader:
    """Makes an original module this library lacks: no contents, its
    ``__all__`` the table's names that work, those names answered by
    the class :data:`ANSWERING` holds for it. (An import loader; not an ``importlib.abc.Loader``,
    whose import costs more than this whole module.)"""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        mapped = sorted(attr for attr, entry in NAMES[name].items() if isinstance(entry, str))
        module.__doc__ = f"``{name}`` of the original nnx-ppo 0.3.0, kept as an import path (see {DOC}#{SECTION})."
        module.__all__ = mapped
        module.__dir__ = lambda: sorted(set(vars(module)) | set(mapped))
        module.__class__ = ANSWERING[name]


class _Finder:
    """The finder (a path entry finder) of :data:`PATH`: the original's
    modules this library lacks."""

    def find_spec(self, fullname, target=None):
        if fullname not in NAMES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _Loader(), origin="nnx-ppo 0.3.0 import path",
                                              is_package=fullname in _PARENTS)
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations.append(PATH)
        return spec

    def invalidate_caches(self):
        pass


def _path_hook(entry: str) -> _Finder:
    if entry != PATH:
        raise ImportError("not the original's import paths")
    return _Finder()


def install() -> None:
    """Let the import system find the original's modules under :data:`PATH`
    (once): the last of ``sys.path_hooks``, asked only for a ``__path__``
    entry that no other hook takes (folders and zip files are taken)."""
    if _path_hook not in sys.path_hooks:
        sys.path_hooks.append(_path_hook)
