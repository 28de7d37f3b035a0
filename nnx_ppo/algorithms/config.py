"""Configuration dataclasses. Frozen, documented, passed whole.

Field names follow the original nnx-ppo where it had them.

Configs to and from JSON (:func:`config_to_dict`, :func:`config_from_dict`),
and the rules read off their fields' metadata: which numbers may differ per
member (:func:`per_member_bounds`) and which fields a resume may change
(:func:`resume_changes`).

The ``Attributes`` of the three configs are also the help of their flags in
``nnx-ppo train --help`` (tyro reads them): single backquotes there, no Sphinx roles.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import math
import numbers
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal

from tyro.constructors import PrimitiveConstructorSpec  # tyro is light: no NumPy or JAX

from nnx_ppo import _original_paths

__all__ = [
    "PPOConfig", "EvalConfig", "TrainConfig", "ScheduleNotSavedError", "config_to_dict", "config_from_dict",
    "per_member_bounds", "resume_changes",
]

SeedBatching = Literal["vmap", "map"]  # TrainConfig.seed_batching
SEED_BATCHING = typing.get_args(SeedBatching)  # its choices, for checks and messages
Precision = Literal["default", "bfloat16"]  # PPOConfig.precision (nnx_ppo.networks.feedforward.PRECISIONS)


def check_seed_batching(value: Any, where: str = "seed_batching") -> None:
    """``value`` must be one of :data:`SEED_BATCHING`; the error names ``where``."""
    if value not in SEED_BATCHING:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, SEED_BATCHING))}, got {value!r}")


def check_compiler_options(value: Any, where: str = "compiler_options") -> None:
    """``value`` must be None or a dict of XLA option names (strings) to
    values (strings, numbers or bools); the error names ``where``. Whether
    the backend has the options is checked when the program is built
    (:func:`nnx_ppo.algorithms.ppo.compile_iterations`)."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a dict of XLA option names to values, or None; got "
                         f"{type(value).__name__} {value!r}")
    for name, option in value.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: option names must be non-empty strings, got {name!r}")
        if not isinstance(option, (str, numbers.Real)):
            raise ValueError(f"{where}[{name!r}] must be a string, a number or a bool, got "
                             f"{type(option).__name__} {option!r}")


def check_seed(value: Any, where: str = "seed") -> int:
    """``value`` as a seed: an int that fits JAX's 64-bit seeds
    (``-2**63 <= seed < 2**63``); the error names ``where``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{where} must be an integer, got {value!r}")
    if not -(2**63) <= int(value) < 2**63:
        raise ValueError(f"{where} must be between -2**63 and 2**63 - 1 (JAX's 64-bit seeds), got {value}")
    return int(value)


def check_seeds(seeds: Any, where: str = "seeds") -> list[int]:
    """``seeds`` as a non-empty list of distinct seeds (each as :func:`check_seed`
    accepts it); the error names ``where`` (e.g. ``"train_seeds: seeds"`` or
    ``"--seeds"``). The one check of a list of seeds, for the trainers and the
    command line alike."""
    seeds = [check_seed(s, f"{where}: each seed") for s in seeds]
    if not seeds:
        raise ValueError(f"{where} must name at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{where} must be distinct, got {seeds}")
    return seeds


# A learning-rate schedule: optimizer update count -> learning rate (an optax schedule).
Schedule = Callable[[Any], Any]

SCHEDULE_PREFIX = "<schedule "


def describe_schedule(schedule: Schedule) -> str:
    """A stable, readable stand-in for a schedule in JSON (no memory address)."""
    name = getattr(schedule, "__qualname__", None) or type(schedule).__qualname__
    module = getattr(schedule, "__module__", None) or type(schedule).__module__
    return f"{SCHEDULE_PREFIX}{module}.{name}>"


# How the command line (tyro) reads PPOConfig.learning_rate: a plain number, shown as FLOAT (a schedule
# is given from Python only; as a default it is shown by its description).
_LEARNING_RATE_FLAG = PrimitiveConstructorSpec(
    nargs=1,
    metavar="FLOAT",
    instance_from_str=lambda args: float(args[0]),
    is_instance=lambda value: callable(value) or (isinstance(value, numbers.Real) and not isinstance(value, bool)),
    str_from_instance=lambda value: [describe_schedule(value) if callable(value) else str(value)],
)


_checks_deferred = contextvars.ContextVar("nnx_ppo_config_checks_deferred", default=False)


@contextlib.contextmanager
def deferred_checks():
    """Within this block the configs skip their value checks (a parser that
    builds them field by field, the command line's, runs :func:`checked`
    afterwards, so a bad value is one line of the config's own text)."""
    token = _checks_deferred.set(True)
    try:
        yield
    finally:
        _checks_deferred.reset(token)


def checked(config: "TrainConfig") -> "TrainConfig":
    """``config`` after running every value check of it and its parts (a
    ValueError names the first bad field, e.g. ``PPOConfig.total_steps must
    be a positive integer, got 0``)."""
    return dataclasses.replace(config, ppo=dataclasses.replace(config.ppo), eval=dataclasses.replace(config.eval))


def _field(default: Any, *, member: tuple[float, float] | None = None, resume: bool = False) -> Any:
    """A config field with its rules declared once, as field metadata:

    - ``member``: the field may differ between the members of one compiled
      program (a number that changes no array shape), and these are the
      bounds population-based training keeps it in
      (:func:`per_member_bounds`);
    - ``resume``: the field may change when a run is resumed (the others
      would change the network, the state's shapes or the run's meaning;
      :func:`resume_changes`).
    """
    return dataclasses.field(default=default, metadata={"resume": resume, "member": member})


class ConfigTypeError(TypeError, ValueError):
    """A config field given a value of the wrong type (a dict where a
    PPOConfig goes, a string where a number does); one line naming the
    field, the type expected and what was given. A ValueError too, like the
    configs' other checks, so that code catching those catches it."""


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ == "bool")


_KINDS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    int: (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    bool: (_is_bool, "True or False"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _type_rule(hint: Any) -> tuple[Callable[[Any], bool], str] | None:
    """``(accepts(value), "what it expects")`` for a field's annotation;
    None where the field's own check is the type check (a ``Literal``, a
    number-or-schedule)."""
    if dataclasses.is_dataclass(hint):
        return (lambda v: isinstance(v, hint)), f"{'an' if hint.__name__[0] in 'AEIOU' else 'a'} {hint.__name__}"
    if hint in _KINDS:
        return _KINDS[hint]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        rule = _type_rule(rest[0]) if len(rest) == 1 else None
        if rule is not None:
            accepts, what = rule
            return (lambda v: v is None or accepts(v)), f"{what} or None"
    return None


@functools.cache
def _type_rules(cls: type) -> dict[str, tuple[Callable[[Any], bool], str]]:
    hints = typing.get_type_hints(cls)
    rules = {f.name: _type_rule(hints[f.name]) for f in dataclasses.fields(cls)}
    return {name: rule for name, rule in rules.items() if rule is not None}


def _check_types(config: Any) -> None:
    """Every field of ``config`` must have its annotated type (an int is a
    number; a bool is not an integer): a :class:`ConfigTypeError` names the first that does not."""
    owner = type(config).__name__
    for name, (accepts, what) in _type_rules(type(config)).items():
        value = getattr(config, name)
        if not accepts(value):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            kind = what.split()[-1]
            hint = f"; build one with {kind}(...)" if isinstance(value, dict) and kind.endswith("Config") else ""
            raise ConfigTypeError(f"{owner}.{name} must be {what}, got {type(value).__name__} {shown}{hint}")


_OPTIONAL = ("value_clip_range", "gradient_clipping", "weight_decay", "replay_tolerance", "target_kl")


def _require_positive_int(owner: str, name: str, value: Any, allow_none: bool = False) -> None:
    """``owner.name`` must be a positive ``int`` (not a bool; ``None`` too if allowed)."""
    if allow_none and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{owner}.{name} must be a positive integer{extra}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of PPO.

    Attributes:
      n_envs: environments stepped in parallel (the batch B).
      rollout_length: steps per env per iteration (the horizon T).
      total_steps: env steps to train for (rounded up to whole iterations).
      gae_lambda: GAE lambda.
      discounting_factor: discount gamma.
      clip_range: PPO ratio clipping epsilon.
      learning_rate: optimizer step size: a positive number, or (from
        Python) an optax schedule of the update count, see `make_optimizer`;
        a schedule is saved as a description only (`config_to_dict`).
      learning_rate_decay: decay the learning rate linearly to 0 over training
        (not with a schedule).
      normalize_advantages: standardize advantages per minibatch.
      combine_advantages: with dict rewards, sum the per-key advantages into one.
      n_epochs: passes over each rollout.
      n_minibatches: groups of whole env sequences per epoch; must divide n_envs.
      shuffle_blocks: the env axis is cut into this many contiguous blocks;
        every epoch permutes the envs within each block, and every minibatch
        takes an equal share of each block. Sharded over devices, the blocks
        are the devices' shards, so no env sequence crosses devices (training
        on `D` devices uses `D` blocks when this is 1). `n_envs` must be
        divisible by `shuffle_blocks * n_minibatches`.
      critic_loss_weight: weight of the value loss.
      value_clip_range: clip the value update like the policy ratio (None: off).
      gradient_clipping: global-norm clip (None: off).
      weight_decay: AdamW weight decay (None: plain Adam).
      bootstrap_on_truncation: a time-limit truncation bootstraps from the value
        of the true final observation; off, truncation cuts the return like a
        termination.
      recompute_advantages: recompute advantages and value targets by GAE in
        every minibatch from the current critic's values of its replayed
        steps (the bootstrap values after the rollout's last step and at
        truncations stay the rollout's); off, both are computed once per
        iteration from the rollout's values.
      replay_tolerance: before the first update of every iteration the
        replayed log-likelihoods and values must equal the rollout's; a
        larger max |log ratio| or value difference on the first minibatch
        stops training with `ReplayMismatchError` (None: not checked; the
        measurement is logged as `replay/...` either way).
      normalize_rewards: divide the rewards GAE sees by a running standard
        deviation of the discounted return (see
        `nnx_ppo.algorithms.ppo.ReturnStatistics`), so value targets have a
        scale near one; logged returns stay in the env's units.
      target_kl: stop an iteration's updates early once a minibatch's
        approximate KL between the current and the rollout policy
        (`policy/approx_kl`, measured before its update) exceeds
        `1.5 * target_kl`: that minibatch and the rest of the iteration's
        updates are skipped (logged as `optimizer/updates_skipped`, the
        fraction skipped). None: every update runs.
      regularization_weight: multiplies the modules' regularization losses
        (a sampler's entropy bonus, a bottleneck's KL) in the total loss;
        with the samplers' entropy bonus the effective entropy weight is
        `regularization_weight * entropy_weight`.
      reward_scale: multiplies the rewards the learner sees (GAE, value
        targets; before `normalize_rewards`); logged returns stay in the
        env's units.
      replay_unroll: how many time steps the loss replay's scans over time
        (recurrent cells, `replay_in_time`) run per loop step (`lax.scan`'s
        `unroll`): a larger value removes the loop's per-step overhead and
        lets the compiler fuse across steps, at the cost of a longer compile. None (default): the whole rollout on an
        accelerator (GPU, TPU), 1 on a CPU or with `precision="bfloat16"`
        (whose replay scans the whole network: unrolled over 20 steps at the
        rodent users' size it did not compile within 150 s on a TPU). Changes
        no result beyond float rounding; the replay check holds either way.
      precision: the matrix products of the library's modules in the
        rollout, the replay and evaluation: `"default"` (float32 at JAX's
        default matmul precision) or `"bfloat16"` (inputs rounded to
        bfloat16, products summed in float32; parameters, optimizer and
        everything else stay float32). Rollout and replay compute alike, so
        the replay check holds under both (`compute_precision`); under
        bfloat16 the replay runs the whole network one step at a time at the
        rollout's shapes (slower than the modules' fast replays), since
        rounded inputs turn a TPU's last-bit differences between shapes into
        visible ones.
    """

    n_envs: int = 256
    rollout_length: int = 32
    total_steps: int = _field(1_000_000, resume=True)
    gae_lambda: float = _field(0.95, member=(0.5, 1.0))
    discounting_factor: float = _field(0.99, member=(0.8, 0.9995))
    clip_range: float = _field(0.2, member=(0.02, 0.5))
    learning_rate: Annotated[float | Schedule, _LEARNING_RATE_FLAG] = _field(3e-4, member=(1e-6, 1e-1))
    learning_rate_decay: bool = False
    normalize_advantages: bool = True
    combine_advantages: bool = False
    n_epochs: int = _field(4, resume=True)
    n_minibatches: int = _field(4, resume=True)
    shuffle_blocks: int = 1
    critic_loss_weight: float = _field(0.5, member=(0.05, 5.0))
    value_clip_range: float | None = _field(None, member=(0.02, 2.0))
    gradient_clipping: float | None = _field(0.5, member=(0.05, 10.0))
    weight_decay: float | None = None
    bootstrap_on_truncation: bool = True
    recompute_advantages: bool = False
    normalize_rewards: bool = False
    replay_tolerance: float | None = _field(1e-3, resume=True)
    target_kl: float | None = _field(None, member=(1e-3, 0.5))
    regularization_weight: float = _field(1.0, member=(0.0, 100.0))
    reward_scale: float = _field(1.0, member=(1e-3, 1e3))
    replay_unroll: int | None = _field(None, resume=True)
    precision: Precision = "default"

    def __post_init__(self):
        if _checks_deferred.get():
            return
        _check_types(self)
        for name in ("n_envs", "rollout_length", "total_steps", "n_epochs", "n_minibatches", "shuffle_blocks"):
            _require_positive_int("PPOConfig", name, getattr(self, name))
        _require_positive_int("PPOConfig", "replay_unroll", self.replay_unroll, allow_none=True)
        if self.precision not in typing.get_args(Precision):
            choices = ", ".join(map(repr, typing.get_args(Precision)))
            raise ValueError(f"PPOConfig.precision must be one of {choices}, got {self.precision!r}")
        if self.n_envs % self.n_minibatches:
            raise ValueError(
                f"PPOConfig: n_envs ({self.n_envs}) must be divisible by n_minibatches "
                f"({self.n_minibatches}); minibatches hold whole env sequences"
            )
        if self.n_envs % (self.n_minibatches * self.shuffle_blocks):
            raise ValueError(
                f"PPOConfig: n_envs ({self.n_envs}) must be divisible by n_minibatches x shuffle_blocks "
                f"({self.n_minibatches} x {self.shuffle_blocks}); every minibatch takes an equal share of every block"
            )
        for name in ("discounting_factor", "gae_lambda", "clip_range", "critic_loss_weight", "value_clip_range",
                     "gradient_clipping", "weight_decay", "replay_tolerance", "target_kl", "regularization_weight",
                     "reward_scale"):
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isfinite(value):
                allowed = " (or None)" if name in _OPTIONAL else ""
                raise ValueError(f"PPOConfig.{name} must be a finite number{allowed}, got {value}")
        if not 0.0 <= self.discounting_factor <= 1.0:
            raise ValueError(f"PPOConfig.discounting_factor must be in [0, 1], got {self.discounting_factor}")
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"PPOConfig.gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.clip_range <= 0:
            raise ValueError(f"PPOConfig.clip_range must be positive, got {self.clip_range}")
        if callable(self.learning_rate):
            if self.learning_rate_decay:
                raise ValueError(
                    "PPOConfig: learning_rate_decay=True with a learning_rate schedule is ambiguous; "
                    "build the decay into the schedule (e.g. optax.linear_schedule) and leave learning_rate_decay off"
                )
        else:
            wanted = ("PPOConfig.learning_rate must be a positive finite number or a schedule (a callable from the "
                      "optimizer update count to the learning rate, e.g. from optax), got ")
            if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, numbers.Real):
                raise ConfigTypeError(f"{wanted}{type(self.learning_rate).__name__} {self.learning_rate!r}")
            if not 0 < self.learning_rate < math.inf:  # also rejects NaN
                raise ValueError(f"{wanted}{self.learning_rate!r}")
        for name in ("critic_loss_weight", "regularization_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"PPOConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not self.reward_scale > 0:
            raise ValueError(f"PPOConfig.reward_scale must be positive, got {self.reward_scale}")
        for name in ("value_clip_range", "gradient_clipping", "replay_tolerance", "target_kl"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"PPOConfig.{name} must be positive or None, got {value}")
        if self.weight_decay is not None and (isinstance(self.weight_decay, bool) or not self.weight_decay >= 0):
            # (The original nnx-ppo read True as optax's default decay, 1e-4; here it would have been 1.0.)
            raise ValueError(f"PPOConfig.weight_decay must be a number >= 0 or None, got {self.weight_decay!r}")

    @property
    def steps_per_iteration(self) -> int:
        """Env steps collected by one iteration: ``n_envs * rollout_length``."""
        return self.n_envs * self.rollout_length

    @property
    def n_iterations(self) -> int:
        """Iterations needed to reach ``total_steps``."""
        return -(-self.total_steps // self.steps_per_iteration)

    @property
    def total_updates(self) -> int:
        """Optimizer updates of the whole run, ``n_iterations * n_epochs *
        n_minibatches``: what ``learning_rate_decay`` decays to 0 over."""
        return self.n_iterations * self.n_epochs * self.n_minibatches

    def scan_unroll(self, backend: str) -> int:
        """``replay_unroll`` for a program compiled for ``backend`` (``"cpu"``,
        ``"gpu"``, ``"tpu"``; ``jax.default_backend()``): None gives
        ``rollout_length`` on an accelerator and 1 on a CPU or under bfloat16."""
        if self.replay_unroll is not None:
            return self.replay_unroll
        return 1 if backend == "cpu" or self.precision == "bfloat16" else self.rollout_length


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Periodic deterministic evaluation.

    Attributes:
      enabled: run evaluations (also once at the end of training).
      every_steps: env steps between evaluations.
      n_envs: episodes per evaluation (one per env).
      max_episode_length: steps an evaluation episode may last.
      deterministic: take the policy's mode/mean (`network.eval()`).
    """

    enabled: bool = _field(True, resume=True)
    every_steps: int = _field(100_000, resume=True)
    n_envs: int = _field(16, resume=True)
    max_episode_length: int = _field(1000, resume=True)
    deterministic: bool = _field(True, resume=True)

    def __post_init__(self):
        if _checks_deferred.get():
            return
        _check_types(self)
        for name in ("every_steps", "n_envs", "max_episode_length"):
            _require_positive_int("EvalConfig", name, getattr(self, name))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything ``train_ppo`` needs besides the env and the network.

    Attributes:
      ppo: PPO hyperparameters.
      eval: evaluation settings.
      seed: seeds the training RNG (env resets, shuffling).
      iterations_per_call: iterations fused into one compiled call; Python
        sees every iteration's metrics either way.
      checkpoint_every_steps: env steps between checkpoints (None: only
        when `checkpoint_dir` is given, at the end).
      keep_checkpoints: how many recent checkpoints to keep.
      n_devices: local devices to shard the env axis over (None: all local
        devices; 1: no sharding). `ppo.n_envs` must be divisible by it.
      shard_seeds: for a seed batch (`train_seeds`) on several devices, split
        the seeds over the devices (each device trains whole seeds; the number
        of seeds must be divisible by the number of devices) instead of every
        seed's envs. Ignored by single-seed training.
      seed_batching: how a seed batch's iteration runs over its seeds:
        `"vmap"` (default) batches every operation over the seeds (best on
        GPUs and TPUs, and with few envs per seed); `"map"` runs the seeds
        one after another inside the compiled program (`jax.lax.map`), each
        at its own size, which on CPUs with hundreds of envs per seed is
        faster, and with `shard_seeds` each device runs its own seeds.
        Both give the same training up to float rounding. Ignored by
        single-seed training.
      compiler_options: XLA compiler options for the run's programs: the
        initial state's and the training program (`jax.jit`'s
        `compiler_options`; not the evaluation's): option name to value, e.g.
        `{"xla_tpu_scoped_vmem_limit_kib": "8192"}` on a TPU, which makes its
        compiler emit smaller kernels and compile sooner (docs/scale.md).
        Another compile may round floats differently (a product tiled
        otherwise sums in another order); the replay guarantee holds, since
        rollout and replay are one program compiled with the same options.
        None: XLA's defaults. An option the backend does not have is an error
        before training starts.
    """

    ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    seed: int = _field(0)
    iterations_per_call: int = _field(1, resume=True)
    checkpoint_every_steps: int | None = _field(None, resume=True)
    keep_checkpoints: int = _field(3, resume=True)
    n_devices: int | None = _field(None, resume=True)
    shard_seeds: bool = _field(False, resume=True)
    seed_batching: SeedBatching = _field("vmap", resume=True)
    compiler_options: dict[str, str] | None = _field(None, resume=True)

    def __post_init__(self):
        if _checks_deferred.get():
            return
        _check_types(self)
        check_compiler_options(self.compiler_options, "TrainConfig.compiler_options")
        check_seed(self.seed, "TrainConfig.seed")
        check_seed_batching(self.seed_batching, "TrainConfig.seed_batching")
        _require_positive_int("TrainConfig", "iterations_per_call", self.iterations_per_call)
        _require_positive_int("TrainConfig", "keep_checkpoints", self.keep_checkpoints)
        _require_positive_int("TrainConfig", "checkpoint_every_steps", self.checkpoint_every_steps, allow_none=True)
        _require_positive_int("TrainConfig", "n_devices", self.n_devices, allow_none=True)


# --------------------------------------------------------------------------- to and from JSON


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
    if cls is PPOConfig and learning_rate is not None:
        data = {**data, "learning_rate": learning_rate}
    if cls is PPOConfig and isinstance(data.get("learning_rate"), str):
        raise ScheduleNotSavedError(
            f"{where}: this config was saved with a learning-rate schedule ({data['learning_rate']}), and a "
            "schedule cannot be saved; pass it again as learning_rate=... (config_from_dict, "
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
            value = config_from_dict(value, hint, where, learning_rate=learning_rate)
        kwargs[key] = value
    return cls(**kwargs)


def per_member_bounds() -> dict[str, tuple[float, float]]:
    """``{PPOConfig field: (low, high)}`` of the fields that may differ
    between the members of one program (declared with ``member=`` on the
    field), in field order; the bounds are the range population-based
    training keeps a perturbed value in."""
    return {f.name: f.metadata["member"] for f in dataclasses.fields(PPOConfig) if f.metadata.get("member")}


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


# The original nnx-ppo 0.3.0's names of this module that moved or were replaced.
sys.modules[__name__].__class__ = _original_paths.ANSWERING[__name__]
