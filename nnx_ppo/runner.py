"""What a run is (:class:`RunSpec`) and the one object that writes its run directory (:class:`Run`).

Every entry that writes a run directory goes through here: ``nnx-ppo
train`` (also ``--seeds``), ``sweep``, ``distill`` and ``resume`` build a
RunSpec and open a :class:`Run`, which they hand to the trainer
(``run=``); ``train_ppo``, ``train_seeds``, ``train_population`` and
``train_distillation`` with ``run_dir=`` describe their arguments as a
RunSpec (:func:`open_output`) and open the same Run. The Run:

- locks the directory (:class:`~nnx_ppo.run_dir.RunLock`: a second run
  is refused naming the holder's pid);
- writes ``config.json`` (the RunSpec's :meth:`~RunSpec.to_dict`) once,
  atomically, when training begins, or for a resume appends the changes
  :func:`~nnx_ppo.algorithms.config.resume_changes` allows to its
  ``resumed`` list (and refuses the others in one line);
- logs every row (:class:`~nnx_ppo.run_dir.RunLogger`: ``metrics.jsonl``,
  TensorBoard, the learning curve; config.json written again if it
  vanished), records failures, saves checkpoints and best policies into
  ``checkpoints/`` (through the trainer's hooks), and shows progress.

Its layer sits above ``algorithms/``: the trainers see a Run only as their
:class:`~nnx_ppo.algorithms.outputs.RunOutput`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import sys
from pathlib import Path
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.algorithms.config import TrainConfig, resume_changes
from nnx_ppo.envs.registry import spec_of

__all__ = ["RunSpec", "Run", "open_output", "named_network", "checkpoints_of", "NAMED_NETWORK_WIDTH",
           "PYTHON_NETWORK"]

NAMED_NETWORK_WIDTH = 32
"""The width of a network named ``"mlp"``, ``"lstm"`` or ``"gru"`` in Python
(for another, pass ``NetworkSpec.sized(env, kind, width)``)."""

PYTHON_NETWORK = "python_class"
"""The ``config.json`` key naming a network object's class (a network the command line cannot rebuild)."""


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What a run is; ``config.json`` is its serialization (:meth:`to_dict`, :meth:`load`).

    Attributes:
      env: the env spec of :func:`nnx_ppo.envs.make` (``"python:CLASS"`` for
        an env object, which the command line cannot rebuild).
      network: how to rebuild the network (``NetworkSpec.to_dict()``), or
        ``{"python_class": ...}`` for a network object.
      config: the whole training configuration (a population's shared one).
      env_kwargs: the env's keyword arguments (the evaluation env gets them alone).
      train_env_kwargs: what only the training env adds
        (:func:`~nnx_ppo.run_dir.training_env_kwargs` is the rule).
      seeds: the seeds of a seed batch (empty: one run).
      extra: what the algorithm and the entry record besides: a
        population's ``members`` and ``population``, a distillation's
        ``distillation``, the CLI's ``preset`` and ``wandb_id``.
      command: the command line that started the run.
      env_rebuildable: False for an env object.
    """

    env: str
    network: dict[str, Any]
    config: TrainConfig
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: tuple[int, ...] = ()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] = ()
    env_rebuildable: bool = True

    def to_dict(self) -> dict[str, Any]:
        """``config.json``'s content, with the schema version, the time it was
        created and an empty ``resumed`` list."""
        content: dict[str, Any] = {
            "schema": rd.SCHEMA_VERSION, "env": self.env, "env_kwargs": dict(self.env_kwargs),
            "train_env_kwargs": dict(self.train_env_kwargs), "network": dict(self.network),
            "config": rd.train_config_to_dict(self.config),
            "created": _dt.datetime.now().isoformat(timespec="seconds"), "command": list(self.command),
            "resumed": [],
        }
        if not self.env_rebuildable:
            content["env_rebuildable"] = False
        if self.seeds:
            content["seeds"] = [int(s) for s in self.seeds]
        return {**content, **self.extra}

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "RunSpec":
        """The spec of the run in ``run_dir``, as it trains now (its resumes' changes applied)."""
        saved = rd.read_run_config(run_dir)
        own = {"schema", "env", "env_kwargs", "train_env_kwargs", "network", "config", "created", "command",
               "resumed", "seeds", "env_rebuildable", "source"}
        return cls(env=saved["env"], network=saved["network"], config=rd.train_config_from_dict(saved["config"]),
                   env_kwargs=saved.get("env_kwargs", {}), train_env_kwargs=saved.get("train_env_kwargs", {}),
                   seeds=tuple(saved.get("seeds", ())), extra={k: v for k, v in saved.items() if k not in own},
                   command=tuple(saved.get("command", ())), env_rebuildable=saved.get("env_rebuildable", True))

    @classmethod
    def of_python(cls, *, train_env, eval_env, network_spec, network, config: TrainConfig, seeds) -> "RunSpec":
        """The spec of a Python call: the envs as the command line would
        rebuild them when both come from one :func:`~nnx_ppo.envs.make`
        spec (else by class, not rebuildable), the network by its spec (else by class)."""

        if network_spec is not None:
            described = network_spec.to_dict()
        else:
            described = {PYTHON_NETWORK: f"{type(network).__module__}.{type(network).__qualname__}"}
        train, evaluation = spec_of(train_env), spec_of(eval_env)
        command = (os.path.basename(sys.executable), *sys.argv)
        if train is None or evaluation is None or train[0] != evaluation[0] or set(evaluation[1]) - set(train[1]):
            return cls(env=f"python:{type(train_env).__name__}", network=described, config=config,
                       seeds=tuple(seeds or ()), command=command, env_rebuildable=False)
        added = {k: v for k, v in train[1].items() if evaluation[1].get(k) != v}
        # The inverse of rd.training_env_kwargs: random_initial_steps is on unless said otherwise.
        if not added.pop("random_initial_steps", False):
            added["random_initial_steps"] = False
        return cls(env=train[0], network=described, config=config, env_kwargs=evaluation[1], train_env_kwargs=added,
                   seeds=tuple(seeds or ()), command=command)

    @property
    def n_entries(self) -> int:
        """How many seeds or members train together (1 for one run)."""
        return max(len(self.seeds), len(self.extra.get("members", ())), 1)

    @property
    def title(self) -> str:
        """``lstm on cue_memory``: the learning curve's title."""
        return f"{self.network.get('kind', self.network.get(PYTHON_NETWORK))} on {self.env}"


class Run:
    """The one writer of a run directory (or, with ``path`` None, only a progress bar).

    Open it with :meth:`open` (the directory is locked from then on), hand
    it to a trainer (``run=``), which calls :meth:`begin` (config.json) and
    then logs through it; :meth:`close` releases everything.
    """

    def __init__(self, path: Path | None, spec: RunSpec, *, resuming: bool, bar, lock, wandb_run=None,
                 writes: bool = True):
        self.path = path
        self.spec = spec
        self.resuming = resuming
        self.bar = bar
        self.logger: rd.RunLogger | None = None
        self.checkpoint_dir = None if path is None else str((path / rd.CHECKPOINT_DIR).resolve())
        self.checkpoint_metadata: dict[str, Any] = {} if path is None else {"run_dir": str(path.resolve())}
        if path is not None and PYTHON_NETWORK not in spec.network:
            self.checkpoint_metadata["network"] = dict(spec.network)
        self._lock = lock
        self._wandb_run = wandb_run
        self._writes = writes
        self._shown_step: int | None = None
        self._pending: tuple[int, list[dict]] | None = None  # a batch's evaluations at one step, shown as their mean

    @classmethod
    def open(cls, path: str | os.PathLike | None, spec: RunSpec, *, resuming: bool, progress: bool,
             quiet: bool = False, wandb_run=None, primary: bool = True) -> "Run":
        """Lock ``path`` (checked writable first) and start the progress bar
        (``quiet``: evaluations only). In a run of several processes only
        the ``primary`` one writes; the others only save their part of the checkpoints."""
        from nnx_ppo.progress import Progress

        ppo = spec.config.ppo
        total = ppo.n_iterations * ppo.steps_per_iteration * spec.n_entries
        bar = Progress(total, quiet) if progress and primary else None
        if path is None:
            return cls(None, spec, resuming=resuming, bar=bar, lock=None)
        path = Path(path)
        if not primary:
            return cls(path, spec, resuming=resuming, bar=None, lock=None, writes=False)
        rd.check_writable(path)
        lock = rd.RunLock(path).acquire()
        held = [] if resuming else rd.run_data(path)
        if held:
            lock.release()
            from nnx_ppo.algorithms.trainer import check_fresh_checkpoint_dir

            check_fresh_checkpoint_dir(str(path / rd.CHECKPOINT_DIR))  # (checkpoints: its own error, naming them)
            raise rd.RunDirInUseError(f"run_dir {os.fspath(path)!r} already holds a run's data ({', '.join(held)}); a "
                                      "fresh run never replaces it: resume it (resume_from=), delete it yourself, "
                                      "or give another run_dir")
        return cls(path, spec, resuming=resuming, bar=bar, lock=lock, wandb_run=wandb_run)

    def begin(self, record: dict[str, Any]) -> None:
        """Write ``config.json`` (a fresh run; ``record``: what the algorithm
        adds, e.g. the members; the spec's own entries win) or record the
        resume in it; open the logger and start the bar."""
        if self.path is not None and self._writes:
            spec = dataclasses.replace(self.spec, extra={**record, **self.spec.extra})
            if self.resuming and (self.path / rd.CONFIG_FILE).exists():
                rd.read_metrics(self.path, strict=True)  # a bad row stops the resume here, before it is recorded
                changes = resume_changes(rd.read_run_config(self.path)["config"], spec.config)
                content = rd.append_resumed(self.path, changes, list(spec.command))
            else:
                content = spec.to_dict()
                self.path.mkdir(parents=True, exist_ok=True)
                sources = _snapshot_own_code(spec, self.path)
                if sources:
                    content["source"] = sources
                rd.write_run_config(self.path, content)
            self.spec = spec
            self.logger = rd.RunLogger(self.path, steps_per_iteration=spec.config.ppo.steps_per_iteration,
                                       title=spec.title, resumed=self.resuming, config=content,
                                       wandb_run=self._wandb_run)
        if self.bar is not None:
            self.bar.start()

    def write(self, message: str) -> None:
        """A line above the progress bar (or printed, without one)."""
        if self.bar is not None:
            self.bar.write(message)
        elif self._writes:
            print(message, flush=True)

    def log(self, metrics: dict[str, Any], env_steps: int, seed: int | None = None) -> None:
        """One row into the run directory; the bar moved once per step, and a
        batch's evaluations at one step shown as their mean."""
        if self.logger is not None:
            self.logger(metrics, env_steps, seed)
        if self.bar is None:
            return
        if rd.RunLogger.is_eval(metrics):
            if seed is None:
                self.bar.evaluation(metrics, env_steps)
                return
            if self._pending is not None and self._pending[0] != env_steps:
                self._show_evaluations()
            self._pending = (env_steps, [*(self._pending or (0, []))[1], metrics])
            if len(self._pending[1]) >= self.spec.n_entries:  # (a failed seed's shows at the next step)
                self._show_evaluations()
            return
        self._show_evaluations()
        if self._shown_step != env_steps:
            self._shown_step = env_steps
            self.bar.iteration(metrics, env_steps * self.spec.n_entries)

    def _show_evaluations(self) -> None:
        if self._pending is not None:
            steps, rows = self._pending
            self._pending = None
            mean = {k: sum(float(r[k]) for r in rows) / len(rows) for k in rows[0] if all(k in r for r in rows)}
            self.bar.evaluation(mean, steps * self.spec.n_entries)

    def record_failure(self, row: dict[str, str], env_steps: int, seed: int) -> None:
        """A failure row of batch entry ``seed`` (it stays failed on resume)."""
        if self.logger is not None:
            self.logger(row, env_steps, seed)

    def earlier_failures(self) -> dict[int, dict[str, Any]]:
        """The failure rows of the run so far (seed -> row), for a resume."""
        if self.path is None or not self.resuming:
            return {}
        return rd.failure_rows(rd.read_metrics(self.path))

    def close(self) -> None:
        """Close the bar and the logger, then release the directory."""
        try:
            if self.bar is not None:
                self._show_evaluations()
                self.bar.close()
            if self.logger is not None:
                self.logger.close()
        finally:
            self.bar = self.logger = None  # (closing twice does nothing)
            if self._lock is not None:
                self._lock.release()
                self._lock = None


def _snapshot_own_code(spec: RunSpec, run_dir: Path) -> dict[str, Any]:
    """Copy the files of the user's env and network (``FILE.py:NAME`` or
    ``MODULE:NAME`` references) into ``run_dir/source/``; what
    :func:`nnx_ppo.user_code.snapshot` returns, for ``config.json``."""
    from nnx_ppo import user_code
    from nnx_ppo.envs.registry import is_own_code
    from nnx_ppo.network_spec import is_factory_reference

    refs = [spec.env] if spec.env_rebuildable and is_own_code(spec.env) else []
    kind = spec.network.get("kind")
    if isinstance(kind, str) and is_factory_reference(kind):
        refs.append(kind)
    return user_code.snapshot(refs, run_dir) if refs else {}


def open_output(run_dir, *, progress: bool, train_env, eval_env, network_spec, network, config: TrainConfig,
                seeds, resuming: bool) -> Run:
    """The Run of a trainer's ``run_dir=`` / ``progress=`` (the run layer's
    part of :class:`~nnx_ppo.algorithms.outputs.RunLayer`)."""
    from nnx_ppo.algorithms.distributed import is_primary

    spec = RunSpec.of_python(train_env=train_env, eval_env=eval_env, network_spec=network_spec, network=network,
                             config=config, seeds=seeds)
    return Run.open(run_dir, spec, resuming=resuming, progress=progress, primary=is_primary())


def named_network(named, env, eval_env, seed: int):
    """``(factory(rngs), spec)`` of a network named by a string (``"mlp"``,
    ``"lstm"``, ``"gru"``, ``"MODULE:FUNCTION"``, ``"FILE.py:FUNCTION"``) or a
    :class:`~nnx_ppo.network_spec.NetworkSpec`, for ``env`` (the env spec
    recorded from ``eval_env``'s, or ``env``'s, :func:`~nnx_ppo.envs.make`
    call); None for a network object or factory function."""
    from nnx_ppo.network_spec import NetworkSpec

    if not isinstance(named, (str, NetworkSpec)):
        return None
    env_spec, env_kwargs = spec_of(eval_env) or spec_of(env) or (None, {})
    spec = named
    if isinstance(named, str):
        spec = NetworkSpec.sized(env_spec or "", named, NAMED_NETWORK_WIDTH, seed=seed, env_kwargs=env_kwargs)
    if env_spec is not None and not spec.env:
        spec = dataclasses.replace(spec, env=env_spec, env_kwargs=env_kwargs)
    return (lambda rngs: spec.build(env, rngs)), spec


def checkpoints_of(resume_from) -> str:
    """``resume_from``, or the checkpoint directory of the run directory it names."""
    path = Path(resume_from)
    if (path / rd.CONFIG_FILE).is_file() and (path / rd.CHECKPOINT_DIR).is_dir():
        return str(path / rd.CHECKPOINT_DIR)
    return resume_from
