"""Every public import path of the original nnx-ppo 0.3.0 works here or fails
in one line naming what replaced it (``nnx_ppo/_original_paths.py``;
docs/migrating.md, "The original's import paths").

ORIGINAL lists the original's public module-level names, module by module
(its tests, ``test_dummies``, ``conftest`` and ``_private`` names aside).
Each is one of:

* defined here in the same module (not in the table);
* in the table as ``"module:attr"``: the original path gives that object;
* in the table as replaced: ``from <module> import <name>`` (and the
  attribute) raise ``ImportError`` with the table's one-line message.
"""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from nnx_ppo import _original_paths
from nnx_ppo._original_paths import TABLE, Replaced, ReplacedImportError

ROOT = pathlib.Path(__file__).resolve().parent.parent

ORIGINAL = {
    "nnx_ppo.jax_dataclass": ["JaxDataclass"],
    "nnx_ppo.algorithms.callbacks": ["wandb_video_fn"],
    "nnx_ppo.algorithms.checkpointing": ["CheckpointCallback", "make_checkpoint_fn", "load_checkpoint"],
    "nnx_ppo.algorithms.config": ["PPOConfig", "EvalConfig", "VideoConfig", "TrainConfig", "DistillationConfig",
                                  "DistillationTrainConfig", "VideoData", "TrainResult", "DistillationTrainResult"],
    "nnx_ppo.algorithms.distillation": ["default_distillation_config", "distillation_single_transition",
                                        "distillation_unroll_env", "distillation_loss", "distillation_step",
                                        "new_distillation_state", "train_distillation"],
    "nnx_ppo.algorithms.metrics": ["compute_metrics", "log_weight_stats"],
    "nnx_ppo.algorithms.ppo": ["default_config", "train_ppo", "ppo_step", "gae", "ppo_loss", "new_training_state"],
    "nnx_ppo.algorithms.rollout": ["single_transition", "unroll_env", "eval_rollout", "record_activations_rollout",
                                   "SlimData", "SlimState", "eval_rollout_for_render_scan", "unstack_trajectory",
                                   "tree_where"],
    "nnx_ppo.algorithms.types": ["EnvState", "RLEnv", "TrainingState", "Transition", "DistillationTransition",
                                 "DistillationState", "LoggingLevel"],
    "nnx_ppo.networks.adapter": ["PPOAdapter"],
    "nnx_ppo.networks.containers": ["Sequential", "Concat", "Parallel", "Splitter"],
    "nnx_ppo.networks.delay": ["Delay"],
    "nnx_ppo.networks.factories": ["make_mlp_layers", "make_mlp", "make_mlp_actor_critic"],
    "nnx_ppo.networks.feedforward": ["Dense"],
    "nnx_ppo.networks.graph": ["Connection", "PopulationGraph", "Population"],
    "nnx_ppo.networks.graph.connection": ["Connection"],
    "nnx_ppo.networks.graph.graph": ["PopulationGraph"],
    "nnx_ppo.networks.graph.population": ["Population"],
    "nnx_ppo.networks.normalizer": ["NormalizerStatistics", "Normalizer"],
    "nnx_ppo.networks.recording": ["Recorder", "with_recording", "extract_activations"],
    "nnx_ppo.networks.recurrent": ["LSTMCarry", "LSTM"],
    "nnx_ppo.networks.sampling_layers": ["ActionSampler", "NormalTanhSampler"],
    "nnx_ppo.networks.types": ["ModuleState", "ACTIVATION_KEY", "PPONetworkOutput", "StatefulModuleOutput",
                               "StatefulModule"],
    "nnx_ppo.networks.utils": ["FilterSpec", "Flattener", "Filter", "Scale", "Merge", "Map"],
    "nnx_ppo.networks.variational": ["VariationalBottleneck", "AR1State", "AR1VariationalBottleneck"],
    "nnx_ppo.wrappers": [],
    "nnx_ppo.wrappers.episode_wrapper": ["EpisodeWrapper"],
    "nnx_ppo.wrappers.reward_scaling_wrapper": ["RewardScalingWrapper"],
}
NAMES = [f"{module}.{name}" for module, names in ORIGINAL.items() for name in names]


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _anchors(text: str) -> set[str]:
    """The heading anchors of a Markdown page (Python-Markdown's toc slugs)."""
    slugs = set()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # comments in code blocks are not headings
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        slugs.add(re.sub(r"[-\s]+", "-", slug))
    return slugs


def _from_import(path: str):
    module, name = path.rsplit(".", 1)
    namespace: dict = {}
    exec(f"from {module} import {name}", namespace)
    return namespace[name]


def test_the_list_and_the_table_agree():
    assert len(NAMES) == len(set(NAMES)) == 86
    assert sorted(set(TABLE) - set(NAMES)) == [], "table entries that are not names of the original"


@pytest.mark.parametrize("path", [p for p in NAMES if p not in TABLE])
def test_unchanged_path(path):
    """Defined here in the module of the same name, with no help from the table."""
    module, name = path.rsplit(".", 1)
    assert name in vars(importlib.import_module(module)), path
    assert _from_import(path) is getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", [p for p in NAMES if isinstance(TABLE.get(p), str)])
def test_mapped_path(path):
    module, name = path.rsplit(".", 1)
    target_module, attr = TABLE[path].split(":")
    target = getattr(importlib.import_module(target_module), attr)
    assert _from_import(path) is target
    mod = importlib.import_module(module)
    assert getattr(mod, name) is target
    assert name not in vars(mod), f"{path} is defined in {module} itself now: drop it from the table"


@pytest.mark.parametrize("path", [p for p in NAMES if isinstance(TABLE.get(p), Replaced)])
def test_replaced_path_fails_in_one_line(path):
    module, name = path.rsplit(".", 1)
    entry = TABLE[path]
    expected = _original_paths.message(path)
    assert "\n" not in expected and entry.by in expected and f"docs/migrating.md#{entry.section}" in expected
    with pytest.raises(ImportError) as from_import:
        _from_import(path)
    assert isinstance(from_import.value, ReplacedImportError)
    assert str(from_import.value) == expected
    with pytest.raises(ImportError) as attribute:
        getattr(importlib.import_module(module), name)
    assert str(attribute.value) == expected
    assert name not in vars(importlib.import_module(module))


def test_messages_point_at_sections_that_exist():
    anchors = _anchors((ROOT / "docs" / "migrating.md").read_text())
    sections = {entry.section for entry in TABLE.values() if isinstance(entry, Replaced)}
    assert _original_paths.SECTION in anchors
    assert sorted(sections - anchors) == []


def test_the_docs_section_names_every_entry():
    section = _section((ROOT / "docs" / "migrating.md").read_text(), "The original's import paths")
    missing = [path for path in TABLE if path.rsplit(".", 1)[1] not in section]
    assert missing == []


@pytest.mark.parametrize("module", list(ORIGINAL))
def test_every_module_of_the_original_imports(module):
    """A module the original had and this library lacks imports as an empty
    module whose ``__all__`` is its names that work."""
    mod = importlib.import_module(module)
    if getattr(mod, "__file__", None) is None:
        mapped = [name for name in ORIGINAL[module] if isinstance(TABLE.get(f"{module}.{name}"), str)]
        assert mod.__all__ == sorted(mapped) and set(mapped) <= set(dir(mod))


@pytest.mark.parametrize("code, error, text", [
    ("from nnx_ppo.algorithms.config import Nope", "ImportError", "cannot import name 'Nope'"),
    ("from nnx_ppo.algorithms.types import Nope", "ImportError", "cannot import name 'Nope'"),
    ("from nnx_ppo.networks.graph import Nope", "ImportError", "cannot import name 'Nope'"),
    ("import nnx_ppo.algorithms.nope", "ModuleNotFoundError", "No module named 'nnx_ppo.algorithms.nope'"),
    ("import nnx_ppo.networks.graph.nope", "ModuleNotFoundError", "No module named 'nnx_ppo.networks.graph.nope'"),
    ("import nnx_ppo.wrappers.nope", "ModuleNotFoundError", "No module named 'nnx_ppo.wrappers.nope'"),
    ("import nnx_ppo.algorithms.types as t; t.Nope", "AttributeError", "has no attribute 'Nope'"),
    ("import nnx_ppo.algorithms.config as c; c.Nope", "AttributeError", "has no attribute 'Nope'"),
])
def test_names_the_original_lacked_fail_as_usual(code, error, text):
    with pytest.raises((ImportError, AttributeError)) as info:
        exec(code, {})
    assert type(info.value).__name__ == error and text in str(info.value)
    assert not isinstance(info.value, ReplacedImportError)


def test_in_a_fresh_interpreter_the_error_is_one_line_and_no_jax_is_loaded():
    """Nothing else imported first; the original's modules that this library
    lacks import without JAX (outside ``nnx_ppo.networks``, which loads it)."""
    code = (
        "import sys\n"
        "import nnx_ppo.algorithms.types, nnx_ppo.algorithms.callbacks, nnx_ppo.wrappers.episode_wrapper\n"
        "assert not {'jax', 'flax'} & set(sys.modules), sorted({'jax', 'flax'} & set(sys.modules))\n"
        "from nnx_ppo.algorithms.config import VideoConfig\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    expected = _original_paths.message("nnx_ppo.algorithms.config.VideoConfig")
    assert last == f"nnx_ppo._original_paths.ReplacedImportError: {expected}", proc.stderr
