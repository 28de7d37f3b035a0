"""Configs to and from JSON, and the rules read off their fields' metadata:
which numbers may differ per member (:func:`per_member_bounds`) and which
fields a resume may change (:func:`resume_changes`)."""

from __future__ import annotations

import copy
import dataclasses
import typing
import warnings
from typing import Any

from nnx_ppo.algorithms.config import PPOConfig, Schedule, TrainConfig, describe_schedule

__all__ = ["ScheduleNotSavedError", "UnknownFieldWarning", "config_to_dict", "config_from_dict", "per_member_bounds",
           "flat_fields", "resume_changes"]


class ScheduleNotSavedError(ValueError):
    """A saved config was trained with a learning-rate schedule, which cannot
    be saved; pass the schedule again to load it."""


class UnknownFieldWarning(UserWarning):
    """A saved config has a field this version's config does not (an older or newer version's); it is ignored."""


def config_to_dict(config: Any) -> dict[str, Any]:
    """``dataclasses.asdict(config)``, JSON-ready. A learning-rate schedule
    (a callable) cannot be serialized; it is replaced by a description, its
    module and qualified name (e.g. ``"<schedule my_module.warmup>"``), and
    :func:`config_from_dict` then asks for the schedule again."""

    def convert(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return type(value)(convert(v) for v in value)
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if callable(value):
            return describe_schedule(value)
        return copy.deepcopy(value)

    return convert(config)


def config_from_dict(data: dict[str, Any], cls: type = TrainConfig, where: str = "config", *,
                     learning_rate: float | Schedule | None = None) -> Any:
    """Rebuild a config dataclass (nested ones included) from its
    :func:`config_to_dict` (``dataclasses.asdict``) form. Unknown fields (from
    an older or newer version) are skipped with a warning naming ``where``.

    ``learning_rate``, if given, replaces the saved ``PPOConfig.learning_rate``
    (a number or a schedule). It is required when the config was saved with
    a schedule (saved as a description only): without it that raises
    :class:`ScheduleNotSavedError`."""
    if learning_rate is not None:
        if cls is PPOConfig:
            data = {**data, "learning_rate": learning_rate}
        elif isinstance(data.get("ppo"), dict):
            data = {**data, "ppo": {**data["ppo"], "learning_rate": learning_rate}}
    if cls is PPOConfig:
        saved = data.get("learning_rate")
        if isinstance(saved, str):
            raise ScheduleNotSavedError(
                f"{where}: this config was saved with a learning-rate schedule ({saved}), and a schedule "
                "cannot be saved; pass it again as learning_rate=... (config_from_dict, "
                "checkpointing.load_config) to load the config"
            )
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            warnings.warn(f"{where}: ignoring unknown field {key!r} of {cls.__name__}", UnknownFieldWarning,
                          stacklevel=2)
            continue
        hint = hints.get(key)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = config_from_dict(value, hint, where)
        kwargs[key] = value
    return cls(**kwargs)


def per_member_bounds() -> dict[str, tuple[float, float]]:
    """``{PPOConfig field: (low, high)}`` of the fields that may differ
    between the members of one program (declared with ``member=`` on the
    field), in field order; the bounds are the range population-based
    training keeps a perturbed value in."""
    return {f.name: f.metadata["member"] for f in dataclasses.fields(PPOConfig) if "member" in f.metadata}


def flat_fields(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """``{"ppo.total_steps": field, "seed": field, ...}``: every leaf field of a config class."""
    hints = typing.get_type_hints(cls, include_extras=False)
    out = {}
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.update(flat_fields(hint, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = f
    return out


def resume_changes(saved: dict[str, Any], config: TrainConfig) -> dict[str, list]:
    """What resuming a run saved with the config ``saved`` (its
    :func:`config_to_dict` form) with ``config`` changes: ``{"ppo.total_steps":
    [before, after], ...}``, in field order. A change to a field not declared
    ``resume=True`` (the network's seed, the state's shapes, anything that
    changes what the run is) raises a ValueError in one line naming the
    field (as its flag, ``--ppo.n-envs``)."""
    now = config_to_dict(config)
    changes = {}
    for name, field in flat_fields(TrainConfig).items():
        before, after = saved, now
        for part in name.split("."):
            before = before.get(part, field.default) if isinstance(before, dict) else field.default
            after = after[part]
        if before == after:
            continue
        if not field.metadata.get("resume", False):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"cannot change {flag} when resuming ({before!r} in the run, {after!r} given): it "
                             "changes the network, the training state or what the run is; start a new run instead")
        changes[name] = [before, after]
    return changes
