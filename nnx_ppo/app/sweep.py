"""``nnx-ppo sweep``: a grid of hyperparameters x seeds as one population.

The grid's configs (every combination of ``--grid`` values on top of the
``train`` flags) and ``--seeds`` become the members of
:func:`~nnx_ppo.algorithms.population.train_population`, which writes the run
directory (``config.json`` with the members, ``metrics.jsonl`` rows per
member, ``checkpoints/`` holding every member, one best policy each). After
training, :mod:`nnx_ppo.app.sweep_report` ranks the configs (with PBT: the
members, by their final hyperparameters, with their lineage and failures)
and writes ``sweep.md``, ``sweep.json`` and the plots.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.app.commands import PROG, CliError, SweepCommand, check_distinct_seeds, print_error, shell_command
from nnx_ppo.app.ending import train_into
from nnx_ppo.app.runs import build_network, make_env, network_spec_of, parse_env_kwargs
from nnx_ppo.app.sweep_report import TABLE_FILE, format_table, sweep_summary, write_outputs
from nnx_ppo.presets import find_preset
from nnx_ppo.progress import pretty_path
from nnx_ppo.runner import Run, RunSpec

__all__ = ["run_sweep", "parse_grid", "grid_configs"]


def parse_grid(entries: tuple[str, ...] | list[str]) -> dict[str, list[float]]:
    """``("ppo.learning-rate=1e-3,3e-4", ...)`` as ``{"learning_rate": [1e-3, 3e-4], ...}``
    (PPOConfig field names, in the order given). A CliError names a bad entry
    and what is expected."""
    from nnx_ppo.algorithms.config import PPOConfig
    from nnx_ppo.algorithms.hyperparameters import PER_MEMBER

    known = {f.name for f in dataclasses.fields(PPOConfig)}
    allowed = ", ".join("ppo." + f.replace("_", "-") for f in PER_MEMBER)
    grid: dict[str, list[float]] = {}
    for entry in entries:
        name, sep, values = entry.partition("=")
        field = name.strip().removeprefix("--").removeprefix("ppo.").replace("-", "_")
        if not sep or not values.strip() or not name.strip().removeprefix("--").startswith("ppo."):
            raise CliError(f"--grid: expected FIELD=V1,V2,... such as ppo.learning-rate=1e-3,3e-4, got {entry!r}")
        if field not in known:
            raise CliError(f"--grid: unknown field {name.strip()}{_did_you_mean(field)}; sweepable: {allowed}")
        if field not in PER_MEMBER:
            raise CliError(f"--grid: {name.strip()} cannot differ between the members of one program (it changes "
                           f"array shapes or the program); sweepable: {allowed}")
        if field in grid:
            raise CliError(f"--grid: {name.strip()} given twice")
        try:
            grid[field] = [float(v) for v in values.split(",")]
        except ValueError:
            raise CliError(f"--grid: {name.strip()} needs numbers, got {values!r}") from None
        if len(set(grid[field])) != len(grid[field]):
            raise CliError(f"--grid: {name.strip()} repeats a value: {values}")
    return grid


def _did_you_mean(field: str) -> str:
    """`` (did you mean ppo.learning-rate?)`` for a misspelt PPOConfig field; ``""`` when none is close."""
    import difflib

    from nnx_ppo.algorithms.config import PPOConfig

    close = difflib.get_close_matches(field, [f.name for f in dataclasses.fields(PPOConfig)], n=1, cutoff=0.6)
    return f" (did you mean ppo.{close[0].replace('_', '-')}?)" if close else ""


def grid_configs(base, grid: dict[str, list[float]]) -> tuple[list, list[dict[str, float]]]:
    """Every combination of ``grid``'s values (the last field varying
    fastest) applied to ``base``'s PPOConfig: ``(configs, their grid values)``.
    A value a field refuses raises a CliError naming it."""
    configs, values = [], []
    for combination in itertools.product(*grid.values()):
        chosen = dict(zip(grid, combination))
        try:
            configs.append(dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, **chosen)))
        except ValueError as e:
            raise CliError(f"--grid: {e}") from None
        values.append(chosen)
    return configs or [base], values or [{}]


def _resumed_configs(cmd: SweepCommand, saved: dict[str, Any]) -> list:
    """A resumed sweep's configs: the shared config as parsed (the run's,
    with the changes the flags made) with each config's own numbers."""
    n_seeds = len(saved["population"]["seeds"])
    base = cmd.config
    return [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, **m["hyperparameters"]))
            for m in saved["members"][::n_seeds]]


def run_sweep(cmd: SweepCommand, argv: list[str], saved: dict[str, Any] | None = None) -> int:
    """``nnx-ppo sweep`` (and ``resume`` of a sweep, with the run's ``saved``
    config.json): returns the exit code (0 done or stopped, 1 failed, 2 bad
    usage, 130 aborted). The run directory is locked throughout."""
    if cmd.video_every:
        raise CliError("--video-every is not available with sweep")
    if cmd.coordinator_address is not None:
        raise CliError("sweep runs in one process (its members can share several devices: --shard-seeds)")
    if cmd.pbt_every < 0:
        raise CliError(f"--pbt-every must be >= 0, got {cmd.pbt_every}")
    from nnx_ppo.user_code import normalized, short_name

    cmd = dataclasses.replace(cmd, env=normalized(cmd.env))  # a FILE.py:NAME env recorded by its absolute path
    env_kwargs = parse_env_kwargs(cmd.env_kwargs, cmd.env)
    train_env_kwargs = parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs")
    if cmd.resume is not None:
        from nnx_ppo.app.train import resume_changes

        if cmd.grid:
            raise CliError("--grid is the sweep's own: not with --resume (the run's members are resumed)")
        resume_changes(cmd, saved, env_kwargs, train_env_kwargs)
        configs, seeds = _resumed_configs(cmd, saved), list(saved["population"]["seeds"])
    else:
        if not cmd.grid:
            raise CliError("give --grid FIELD=V1,V2 ... (e.g. --grid ppo.learning-rate=1e-3,3e-4)")
        seeds = check_distinct_seeds(list(cmd.seeds) or [cmd.config.seed])
        configs, _ = grid_configs(cmd.config, parse_grid(cmd.grid))
    from nnx_ppo.app.train import _run_directory

    if cmd.resume is None and not cmd.run_dir:
        cmd = dataclasses.replace(cmd, run_dir=str(rd.default_run_dir(f"{short_name(cmd.env)}-sweep")))
    run_dir = _run_directory(cmd, saved, "sweep")
    try:
        return _sweep(cmd, argv, run_dir, configs, seeds, env_kwargs, train_env_kwargs, saved)
    finally:
        rd.RunLock(run_dir).release()


def _sweep(cmd: SweepCommand, argv: list[str], run_dir: Path, configs: list, seeds: list[int], env_kwargs: dict,
           train_env_kwargs: dict, saved: dict[str, Any] | None) -> int:
    """Train the population, then write and print the ranked table."""
    from nnx_ppo.algorithms.hyperparameters import PopulationConfigError
    from nnx_ppo.algorithms.pbt import PBTConfig
    from nnx_ppo.algorithms.population import train_population

    resuming = cmd.resume is not None
    env = make_env(cmd.env, env_kwargs)
    train_env = make_env(cmd.env, rd.training_env_kwargs(env_kwargs, train_env_kwargs))
    if resuming:
        from nnx_ppo.network_spec import NetworkSpec

        spec = NetworkSpec.from_dict(saved["network"], where=f"{run_dir / rd.CONFIG_FILE}")
    else:
        spec = network_spec_of(cmd, env_kwargs, seeds[0])
    build_network(spec, env, cmd)  # a network that cannot be built is named before anything else
    pbt = PBTConfig(every_iterations=cmd.pbt_every, seed=seeds[0]) if cmd.pbt_every else None
    preset = find_preset(cmd.env, cmd.network)
    threshold = cmd.threshold if cmd.threshold is not None else (preset.target if preset else None)
    n = len(configs) * len(seeds)
    print(f"{'resuming' if resuming else 'sweeping'} {len(configs)} configs x {len(seeds)} seeds = {n} members "
          f"of {cmd.network} on {cmd.env}{f', PBT every {cmd.pbt_every} iterations' if pbt else ''}; run directory: "
          f"{pretty_path(run_dir)}", flush=True)
    run = Run.open(run_dir, RunSpec(env=cmd.env, network=spec.to_dict(), config=configs[0], env_kwargs=env_kwargs,
                                    train_env_kwargs=train_env_kwargs, seeds=tuple(range(n)), command=(PROG, *argv)),
                   resuming=resuming, progress=True, quiet=cmd.quiet)
    t0 = time.perf_counter()

    def train(stop):
        try:
            return train_population(train_env, spec, configs, seeds, pbt=pbt, eval_env=env, run=run,
                                    resume_from=run_dir if resuming else None, should_stop=stop)
        except PopulationConfigError as e:
            raise CliError(str(e)) from None

    code, results, stopped = train_into(run, train)
    if results is not None:
        failed = [i for i, r in enumerate(results) if r.failure is not None]
        if failed:
            print_error(f"members {failed} failed (the others trained on): " + "; ".join(
                f"{i}: {results[i].failure.error}" for i in failed[:3]))
            code = 1
    if (run_dir / rd.METRICS_FILE).exists():
        summary = sweep_summary(run_dir, threshold)
        plots = write_outputs(run_dir, summary)
        print(format_table(summary))
        shown = f"; plots: {', '.join(p.name for p in plots)}" if plots else ""
        print(f"{time.perf_counter() - t0:.0f} s; table: {pretty_path(run_dir / TABLE_FILE)}{shown}")
    if stopped:
        print(f"stopped early; continue with: {shell_command(PROG, 'resume', pretty_path(run_dir))}")
    print(f"run directory: {pretty_path(run_dir)}", flush=True)
    return code
