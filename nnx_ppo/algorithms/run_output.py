"""``run_dir=`` and ``progress=`` of the trainers: a run directory and a progress bar from Python.

``train_ppo(env, network, config, run_dir="runs/mine", progress=True)``
writes what ``nnx-ppo train`` writes (``config.json``, ``metrics.jsonl``,
TensorBoard events, the learning curve, ``checkpoints/`` with the best
policy) through the same pieces (:mod:`nnx_ppo.run_dir`), so ``nnx-ppo eval``,
``nnx-ppo plot``, ``load_policy`` and ``nnx-ppo resume`` read it.
The CLI can rebuild the run's network and envs when they are named: the env
as a spec string (or built by :func:`nnx_ppo.envs.make`) and the network as a
string (``"mlp"``, ``"lstm"``, ``"gru"``, ``"MODULE:FUNCTION"`` or
``"FILE.py:FUNCTION"``) or a :class:`~nnx_ppo.network_spec.NetworkSpec`. A
network object is recorded by its class; such a run is read from Python with
``load_policy(run, network=...)``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RunOutput", "network_from_description", "NAMED_NETWORK_WIDTH", "PYTHON_NETWORK"]

NAMED_NETWORK_WIDTH = 32
"""The width of a network named ``"mlp"``, ``"lstm"`` or ``"gru"`` (for
another, pass ``NetworkSpec.sized(env, kind, width)``)."""

PYTHON_NETWORK = "python_class"
"""The ``config.json`` key naming a network object's class (a network the CLI cannot rebuild)."""


def network_from_description(network, env, env_spec: str | None, env_kwargs: dict[str, Any], seed: int):
    """``(network_or_factory, spec)``: a string or :class:`NetworkSpec` becomes
    its spec and a factory ``make(rngs)``; a network object is returned as it
    is, with spec None."""
    from nnx_ppo.network_spec import NetworkSpec

    if isinstance(network, str):
        network = NetworkSpec.sized(env_spec or "", network, NAMED_NETWORK_WIDTH, seed=seed, env_kwargs=env_kwargs)
    if not isinstance(network, NetworkSpec):
        return network, None
    spec = network
    if env_spec is not None and not spec.env:
        spec = dataclasses.replace(spec, env=env_spec, env_kwargs=env_kwargs)
    return (lambda rngs: spec.build(env, rngs)), spec


def _env_description(train_env, eval_env) -> dict[str, Any]:
    """What ``config.json`` says about the envs: as the CLI writes it when both
    come from one ``make`` spec (the training env's extra options as
    ``train_env_kwargs``), else the class name, marked as not rebuildable."""
    from nnx_ppo.envs.registry import spec_of

    train, evaluation = spec_of(train_env), spec_of(eval_env)
    # (The command line builds the training env from the evaluation env's kwargs plus train_env_kwargs.)
    if train is None or evaluation is None or train[0] != evaluation[0] or set(evaluation[1]) - set(train[1]):
        return {"env": f"python:{type(train_env).__name__}", "env_kwargs": {}, "train_env_kwargs": {},
                "env_rebuildable": False}
    extra = {k: v for k, v in train[1].items() if evaluation[1].get(k) != v}
    # The command line trains with random_initial_steps=True unless train_env_kwargs says otherwise.
    if extra.get("random_initial_steps", False):
        del extra["random_initial_steps"]
    else:
        extra["random_initial_steps"] = False
    return {"env": train[0], "env_kwargs": evaluation[1], "train_env_kwargs": extra}


def _restart(path: Path) -> None:
    """Clear a run directory that holds no checkpoint (its start failed, or it
    stopped before saving anything), so that running again starts afresh."""
    import warnings

    from nnx_ppo import run_dir as rd

    warnings.warn(f"run_dir {os.fspath(path)!r} holds a run without checkpoints (its start failed, or it ended "
                  "before saving); starting it again from scratch", rd.RunOutputWarning, stacklevel=5)
    rd.clear_run(path)


class RunOutput:
    """What a trainer writes besides its result: a run directory (its
    ``config.json``, a :class:`~nnx_ppo.run_dir.RunLogger` and
    ``checkpoints/``) and/or a progress bar. Its :meth:`log` is (part of)
    the ``log_fn``; :meth:`close` ends both."""

    def __init__(self, path: Path | None, logger, bar, n_seeds: int, unit: str = "seed"):
        self.path = path
        self._unit = unit  # what a batch entry is called in the progress lines: a seed, or a member of a sweep
        self._logger = logger
        self._bar = bar
        self._n_seeds = n_seeds
        self._shown_step = None

    @classmethod
    def open(cls, path: str | os.PathLike | None, *, progress: bool, train_env, eval_env, network_spec, network,
             config, seeds: Sequence[int] | None, resuming: bool, record: dict[str, Any] | None) -> "RunOutput":
        """Start the outputs: for ``path``, write ``config.json`` (a resumed
        run keeps its history; a fresh one clears a directory whose run saved
        no checkpoint) and open the logger; with ``progress``, show the bar."""
        from nnx_ppo import run_dir as rd

        ppo = config.ppo
        n_seeds = len(seeds) if seeds else 1
        logger = None
        lock = None
        if path is not None:
            path = Path(path)
            rd.check_writable(path)
            lock = rd.RunLock(path).acquire()
            try:
                content, described = cls._config(path, resuming, train_env, eval_env, network_spec, network, config,
                                                 seeds, record)
            except BaseException:
                lock.release()
                raise
            title = f"{described.get('kind', described.get(PYTHON_NETWORK))} on {content['env']}"
            logger = rd.RunLogger(path, steps_per_iteration=ppo.steps_per_iteration, title=title, resumed=resuming,
                                  config=content)
        bar = None
        if progress:
            from nnx_ppo.progress import Progress

            bar = Progress(ppo.n_iterations * ppo.steps_per_iteration * n_seeds, ppo.steps_per_iteration * n_seeds,
                           quiet=False)
            bar.start()
        output = cls(path, logger, bar, n_seeds, "member" if (record or {}).get("members") else "seed")
        output._lock = lock
        return output

    @staticmethod
    def _config(path: Path, resuming: bool, train_env, eval_env, network_spec, network, config, seeds,
                record) -> tuple[dict[str, Any], dict[str, Any]]:
        """Write ``config.json`` (a fresh run; a directory whose run saved no
        checkpoint is cleared first) or record the resume in it (the changes
        :func:`~nnx_ppo.algorithms.config.resume_changes` allows, refusing
        the others). Returns its content and the network's description."""
        from nnx_ppo import run_dir as rd
        from nnx_ppo.algorithms.config import resume_changes

        command = [os.path.basename(sys.executable), *sys.argv]
        if network_spec is not None:
            described = network_spec.to_dict()
        else:
            kind = type(network)
            described = {PYTHON_NETWORK: f"{kind.__module__}.{kind.__qualname__}"}
        if resuming and (path / rd.CONFIG_FILE).exists():
            changes = resume_changes(rd.read_run_config(path)["config"], config)
            return rd.append_resumed(path, changes, command), described
        if (path / rd.CONFIG_FILE).exists():  # (the trainer refused a directory with checkpoints before)
            _restart(path)
        content = rd.run_content(**_env_description(train_env, eval_env), network=described, config=config,
                                 seeds=seeds or (), command=command)
        content.update(record or {})
        path.mkdir(parents=True, exist_ok=True)
        rd.write_run_config(path, content)
        return content, described

    def metadata(self, network_spec) -> dict[str, Any]:
        """What each checkpoint records, as the CLI writes it."""
        content = {"run_dir": str(self.path.resolve())}
        if network_spec is not None:
            content["network"] = network_spec.to_dict()
        return content

    def log(self, metrics: dict[str, float], env_steps: int, seed: int | None = None) -> None:
        """One row to the run directory, and the bar moved (once per step: a
        seed batch logs one row per seed, and the bar counts all seeds' steps)."""
        if self._logger is not None:
            self._logger(metrics, env_steps, seed)
        if self._bar is None:
            return
        from nnx_ppo.run_dir import RunLogger

        if RunLogger.is_eval(metrics):
            if seed is None:
                self._bar.evaluation(metrics, env_steps)
            else:
                self._bar.write(f"[{env_steps:,} env steps] {self._unit} {seed}: eval return "
                                f"{metrics.get('eval/episode_return', float('nan')):.3f}")
        elif self._shown_step != env_steps:
            self._shown_step = env_steps
            self._bar.iteration(metrics, env_steps * self._n_seeds)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        try:
            if self._logger is not None:
                self._logger.close()
        finally:
            if getattr(self, "_lock", None) is not None:
                self._lock.release()
