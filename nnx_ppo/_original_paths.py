"""The import paths of the original nnx-ppo 0.3.0, answered here (internal).

:data:`TABLE` holds every public name of the original whose path does not
simply work in this library: its dotted path in the original maps either to
``"module:attr"`` (the same thing here, under another path) or to a
:class:`Replaced` (importing it raises :class:`ReplacedImportError`, one line
naming what replaced it and the section of ``docs/migrating.md`` that says
more). One import finder, installed from ``nnx_ppo/__init__.py``, serves the
table:

* an original module that does not exist here (``nnx_ppo.algorithms.types``,
  ``nnx_ppo.wrappers.episode_wrapper``, ...) is made on import: a module
  without contents whose ``__getattr__`` answers from the table;
* an original module that exists here (``nnx_ppo.algorithms.config``, ...)
  is imported as usual and then given a ``__getattr__`` for its names in
  the table (asked only for names the module lacks); one that has original
  submodules under it (``nnx_ppo.networks.graph``, a package in the
  original) also gets an empty ``__path__``.

A replaced name raises on attribute access too, so ``hasattr`` raises for
it. Nothing else changes: a name or module the original did not have fails
as it would without the table. The list of the original's names, and the
check that each imports or fails this way, is ``tests/test_original_paths.py``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from typing import Any, NamedTuple

__all__ = ["TABLE", "Replaced", "ReplacedImportError", "install"]

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


_BY_MODULE = _entries()
# original modules with original submodules under them (they need a __path__)
_PARENTS = frozenset(module.rsplit(".", 1)[0] for module in _BY_MODULE)


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


def _add_getattr(module: types.ModuleType) -> None:
    """Give ``module`` a ``__getattr__`` answering its names in the table
    (after the module's own ``__getattr__``, if it has one)."""
    name = module.__name__
    names = _BY_MODULE[name]
    if name in _PARENTS and not hasattr(module, "__path__"):
        module.__path__ = []  # type: ignore[attr-defined]
    own = module.__dict__.get("__getattr__")
    if not names or getattr(own, "_original_paths", False):
        return

    def __getattr__(attr: str) -> Any:
        if own is not None:
            try:
                return own(attr)
            except AttributeError:
                if attr not in names:
                    raise
        if attr not in names:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        return resolve(f"{name}.{attr}")

    __getattr__._original_paths = True  # type: ignore[attr-defined]
    module.__getattr__ = __getattr__  # type: ignore[method-assign]


class _Loader:
    """Loads an original module: ``inner`` (this library's module of that
    name) patched afterwards, or, without one, an empty module of the table.
    (An import loader; not an ``importlib.abc.Loader``, whose import costs
    more than this whole module.)"""

    def __init__(self, inner: Any = None):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec) if self.inner is not None else None

    def exec_module(self, module):
        if self.inner is not None:
            self.inner.exec_module(module)
        else:
            name = module.__name__
            mapped = sorted(attr for attr, entry in _BY_MODULE[name].items() if isinstance(entry, str))
            module.__doc__ = (f"``{name}`` of the original nnx-ppo 0.3.0, kept as an import path "
                              f"(see {DOC}#{SECTION}).")
            module.__all__ = mapped
            module.__dir__ = lambda: sorted(set(vars(module)) | set(mapped))
        _add_getattr(module)

    def __getattr__(self, attr):  # get_source, get_filename, ... of the wrapped loader
        if self.inner is None:
            raise AttributeError(attr)
        return getattr(self.inner, attr)


class _Finder:
    """The import finder (a meta path finder) of the original's modules,
    first in ``sys.meta_path``."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _BY_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        is_package = fullname in _PARENTS
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin="nnx-ppo 0.3.0 import path",
                                              is_package=is_package)


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once) and patch original
    modules imported before it."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in _BY_MODULE:
        module = sys.modules.get(name)
        if module is not None:
            _add_getattr(module)
