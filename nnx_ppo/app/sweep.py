"""``nnx-ppo sweep``: a grid of hyperparameters x seeds as one population.

The grid's configs (every combination of ``--grid`` values on top of the
``train`` flags) and ``--seeds`` become the members of
:func:`~nnx_ppo.algorithms.population.train_population`, which writes the run
directory (``config.json`` with the members, ``metrics.jsonl`` rows per
member, ``checkpoints/`` holding every member, one best policy each). After
training, :func:`sweep_summary` ranks the configs from ``metrics.jsonl`` and
this module writes ``sweep.md``, ``sweep.json`` and ``sweep_<field>.png``
(final return against each swept value), plus ``pbt_<field>.png`` (each
member's value over training) with ``--pbt-every``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

from nnx_ppo import run_dir as rd
from nnx_ppo.app.commands import (
    PROG,
    CliError,
    SweepCommand,
    build_network,
    fresh_run_dir,
    make_env,
    network_spec_of,
    parse_env_kwargs,
    print_error,
)
from nnx_ppo.app.plot import _fmt, interquartile_mean
from nnx_ppo.presets import find_preset
from nnx_ppo.progress import StopFlag, pretty_path

__all__ = ["run_sweep", "parse_grid", "grid_configs", "sweep_summary", "SUMMARY_FILE", "TABLE_FILE"]

SUMMARY_FILE = "sweep.json"
TABLE_FILE = "sweep.md"
_METRIC = "eval/episode_return"


def parse_grid(entries: tuple[str, ...] | list[str]) -> dict[str, list[float]]:
    """``("ppo.learning-rate=1e-3,3e-4", ...)`` as ``{"learning_rate": [1e-3, 3e-4], ...}``
    (PPOConfig field names, in the order given). A CliError names a bad entry
    and what is expected."""
    from nnx_ppo.algorithms.hyperparameters import PER_MEMBER

    allowed = ", ".join("ppo." + f.replace("_", "-") for f in PER_MEMBER)
    grid: dict[str, list[float]] = {}
    for entry in entries:
        name, sep, values = entry.partition("=")
        field = name.strip().removeprefix("--").removeprefix("ppo.").replace("-", "_")
        if not sep or not values.strip() or not name.strip().removeprefix("--").startswith("ppo."):
            raise CliError(f"--grid: expected FIELD=V1,V2,... such as ppo.learning-rate=1e-3,3e-4, got {entry!r}")
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


def _bootstrap_interval(values: list[float], n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the interquartile mean of ``values``."""
    import numpy as np

    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    samples = rng.choice(np.asarray(values), size=(n_resamples, len(values)), replace=True)
    iqms = [interquartile_mean(list(s)) for s in samples]
    return float(np.percentile(iqms, 2.5)), float(np.percentile(iqms, 97.5))


def _elapsed(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Seconds of training at each iteration's env step (the population's: every member at once)."""
    out: dict[int, float] = {}
    for r in rows:
        t = r.get("time/elapsed_seconds")
        if not r.get("eval") and isinstance(t, (int, float)):
            out[r["env_steps"]] = max(out.get(r["env_steps"], 0.0), float(t))
    return out


def sweep_summary(run_dir: Path, threshold: float | None = None) -> dict[str, Any]:
    """The sweep's configs ranked, from the run's ``config.json`` and
    ``metrics.jsonl``: per config (over its seeds' evaluations) the final and
    best return (means over seeds), the interquartile mean of the final
    returns with a 95% bootstrap interval, the AUC (area under the mean
    curve / its steps), and the first env step and seconds of training at
    which the mean over seeds reached ``threshold``; ranked by IQM final,
    then AUC. Also every member's final and best."""
    saved = rd.read_run_config(run_dir)
    members = saved["members"]
    seeds = saved["population"]["seeds"]
    fields = [f for f in members[0]["hyperparameters"]
              if len({m["hyperparameters"][f] for m in members}) > 1]
    rows = rd.read_metrics(run_dir)
    curves = rd.seed_curves(rows, _METRIC)  # member index -> (steps, returns)
    elapsed = _elapsed(rows)
    per_member = []
    for i, m in enumerate(members):
        steps, ys = curves.get(i, ([], []))
        per_member.append({"member": i, "seed": m["seed"], **{f: m["hyperparameters"][f] for f in fields},
                           "final": ys[-1] if ys else math.nan, "best": max(ys) if ys else math.nan})
    configs = []
    for c in range(len(members) // len(seeds)):
        indices = list(range(c * len(seeds), (c + 1) * len(seeds)))
        member_curves = [curves[i] for i in indices if i in curves and curves[i][1]]
        finals = [ys[-1] for _, ys in member_curves]
        entry: dict[str, Any] = {"config": c, "members": indices,
                                 **{f: members[indices[0]]["hyperparameters"][f] for f in fields},
                                 "final": _mean(finals), "best": _mean([max(ys) for _, ys in member_curves]),
                                 "iqm_final": interquartile_mean(finals), "iqm_interval": _bootstrap_interval(finals),
                                 "auc": math.nan, "steps_to_threshold": None, "seconds_to_threshold": None}
        if member_curves:
            common = sorted(set.intersection(*(set(s) for s, _ in member_curves)))
            mean = [_mean([ys[list(s).index(x)] for s, ys in member_curves]) for x in common]
            if len(common) > 1:
                area = sum((b - a) * (ya + yb) / 2 for a, b, ya, yb in zip(common, common[1:], mean, mean[1:]))
                entry["auc"] = area / (common[-1] - common[0])
            elif common:
                entry["auc"] = mean[0]
            if threshold is not None:
                reached = [x for x, y in zip(common, mean) if y >= threshold]
                if reached:
                    entry["steps_to_threshold"] = reached[0]
                    entry["seconds_to_threshold"] = elapsed.get(reached[0])
        configs.append(entry)
    key = lambda e: (_nan_low(e["iqm_final"]), _nan_low(e["auc"]))  # noqa: E731
    ranked = sorted(configs, key=key, reverse=True)
    return {"fields": fields, "seeds": seeds, "threshold": threshold, "configs": ranked, "members": per_member,
            "pbt": saved["population"].get("pbt")}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _nan_low(x: float) -> float:
    return -math.inf if x is None or math.isnan(x) else x


def format_table(summary: dict[str, Any]) -> str:
    """The ranked configs as a Markdown table (what ``sweep.md`` holds and the command prints)."""
    fields, threshold = summary["fields"], summary["threshold"]
    header = ["rank", "config", *fields, "final", "best", "IQM final [95% CI]", "AUC"]
    if threshold is not None:
        header += [f"steps to {threshold:g}", f"s to {threshold:g}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, c in enumerate(summary["configs"], start=1):
        lo, hi = c["iqm_interval"]
        cells = [str(rank), str(c["config"]), *(f"{c[f]:g}" for f in fields), _fmt(c["final"]), _fmt(c["best"]),
                 f"{_fmt(c['iqm_final'])} [{_fmt(lo)}, {_fmt(hi)}]", _fmt(c["auc"])]
        if threshold is not None:
            cells += [_fmt(c["steps_to_threshold"], ","), _fmt(c["seconds_to_threshold"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _member_table(summary: dict[str, Any]) -> str:
    fields = summary["fields"]
    header = ["member", "seed", *fields, "final", "best"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in summary["members"]:
        lines.append("| " + " | ".join([str(m["member"]), str(m["seed"]), *(f"{m[f]:g}" for f in fields),
                                        _fmt(m["final"]), _fmt(m["best"])]) + " |")
    return "\n".join(lines)


def write_outputs(run_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """``sweep.json``, ``sweep.md`` and the plots; returns the plots written."""
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    pbt = summary.get("pbt")
    note = ("" if not pbt else f"\nPopulation-based training every {pbt['every_iterations']} iterations: a config's "
            "members start from its values and may change them; the member table gives the values at the start.\n")
    (run_dir / TABLE_FILE).write_text(
        f"# Sweep: {run_dir.name}\n\nConfigs ranked by the interquartile mean (IQM) of their seeds' final "
        f"evaluation returns (seeds {summary['seeds']}; 95% percentile-bootstrap interval over seeds); AUC: "
        f"area under the mean evaluation curve / its env steps.\n{note}\n{format_table(summary)}\n\n"
        f"## Members\n\n`nnx-ppo eval {run_dir.name} --member K`, `load_policy(run, member=K)`.\n\n"
        f"{_member_table(summary)}\n")
    return _plots(run_dir, summary)


def _plots(run_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """``sweep_<field>.png``: every member's final return (dots) and each
    value's median over its members (line) against the swept value; with
    PBT, ``pbt_<field>.png``: each member's value over training."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    written = []
    for field in summary["fields"]:
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        points = [(m[field], m["final"]) for m in summary["members"] if not math.isnan(m["final"])]
        xs = sorted({x for x, _ in points})
        ax.plot([x for x, _ in points], [y for _, y in points], "o", alpha=0.5, label="member (final)")
        medians = [sorted(y for x2, y in points if x2 == x) for x in xs]
        ax.plot(xs, [ys[len(ys) // 2] if len(ys) % 2 else (ys[len(ys) // 2 - 1] + ys[len(ys) // 2]) / 2
                     for ys in medians], "-", color="C1", label="median")
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(f"ppo.{field.replace('_', '-')}")
        ax.set_ylabel(f"final {_METRIC}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        path = run_dir / f"sweep_{field}.png"
        rd.save_figure(fig, path)
        written.append(path)
    if summary.get("pbt"):
        rows = [r for r in rd.read_metrics(run_dir) if not r.get("eval") and "seed" in r]
        for field in summary["fields"] or ["learning_rate"]:
            key = f"hyperparameters/{field}"
            fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
            for m in summary["members"]:
                mine = [(r["env_steps"], r[key]) for r in rows if r["seed"] == m["member"] and key in r]
                ax.plot([s for s, _ in mine], [v for _, v in mine], "-", linewidth=1, label=f"member {m['member']}")
            ax.set_xlabel("env steps (per member)")
            ax.set_ylabel(f"ppo.{field.replace('_', '-')}")
            ax.set_yscale("log" if field in ("learning_rate", "reward_scale") else "linear")
            ax.grid(True, alpha=0.3)
            if len(summary["members"]) <= 12:
                ax.legend(fontsize="x-small", ncol=2)
            fig.tight_layout()
            path = run_dir / f"pbt_{field}.png"
            rd.save_figure(fig, path)
            written.append(path)
    return written


def _resumed_command(run_dir: str, quiet: bool) -> tuple[SweepCommand, dict[str, Any], list, list[int]]:
    """A sweep's command, configs and seeds rebuilt from its ``config.json`` (``--resume``)."""
    from nnx_ppo.app.commands import read_run
    from nnx_ppo.app.train import resume_defaults

    saved = read_run(Path(run_dir), rebuild="resume it")
    if "members" not in saved:
        raise CliError(f"{run_dir} is not a sweep (no members in its {rd.CONFIG_FILE}); resume it with "
                       f"`{PROG} train --resume {run_dir}`")
    train_cmd, _ = resume_defaults(run_dir)  # (its network width is read again below, from the spec)
    population = saved["population"]
    fields = {f.name: getattr(train_cmd, f.name) for f in dataclasses.fields(train_cmd)}
    pbt = population.get("pbt") or {}
    cmd = SweepCommand(**{**fields, "seeds": tuple(population["seeds"]), "quiet": quiet},
                       pbt_every=int(pbt.get("every_iterations", 0)))
    n_seeds = len(population["seeds"])
    base = train_cmd.config
    configs = [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, **m["hyperparameters"]))
               for m in saved["members"][::n_seeds]]
    return cmd, saved, configs, list(population["seeds"])


def run_sweep(cmd: SweepCommand, argv: list[str]) -> int:
    """``nnx-ppo sweep``: returns the exit code (0 done or stopped, 1 failed, 130 aborted)."""
    from nnx_ppo.algorithms.hyperparameters import PopulationConfigError
    from nnx_ppo.algorithms.pbt import PBTConfig
    from nnx_ppo.algorithms.population import train_population

    if cmd.video_every:
        raise CliError("--video-every is not available with sweep")
    if cmd.coordinator_address is not None:
        raise CliError("sweep runs in one process (its members can share several devices: --shard-seeds)")
    if cmd.pbt_every < 0:
        raise CliError(f"--pbt-every must be >= 0, got {cmd.pbt_every}")
    resuming = cmd.resume is not None
    if resuming:
        cmd, saved, configs, seeds = _resumed_command(cmd.resume, cmd.quiet)
        run_dir = Path(cmd.resume)
        env_kwargs, train_env_kwargs = saved.get("env_kwargs", {}), saved.get("train_env_kwargs", {})
    else:
        if not cmd.grid:
            raise CliError("give --grid FIELD=V1,V2 ... (e.g. --grid ppo.learning-rate=1e-3,3e-4)")
        seeds = list(cmd.seeds) or [cmd.config.seed]
        if len(set(seeds)) != len(seeds):
            raise CliError(f"--seeds: give distinct seeds, got {seeds}")
        env_kwargs = parse_env_kwargs(cmd.env_kwargs, cmd.env)
        train_env_kwargs = parse_env_kwargs(cmd.train_env_kwargs, cmd.env, "--train-env-kwargs")
        grid = parse_grid(cmd.grid)
        if not cmd.reward_scale > 0:
            raise CliError(f"--reward-scale must be positive, got {cmd.reward_scale}")
        base = cmd.config
        if cmd.reward_scale != 1.0:  # in the config, so that the env stays rebuildable and --grid can sweep it
            base = dataclasses.replace(base, ppo=dataclasses.replace(
                base.ppo, reward_scale=base.ppo.reward_scale * cmd.reward_scale))
        configs, _ = grid_configs(base, grid)
        run_dir = Path(cmd.run_dir) if cmd.run_dir else rd.default_run_dir(f"{cmd.env}-sweep")
        fresh_run_dir(run_dir, "sweep")
    env = make_env(cmd.env, env_kwargs)
    train_env = make_env(cmd.env, {"random_initial_steps": True, **env_kwargs, **train_env_kwargs})
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
    code, results = 0, None
    stop = StopFlag(print)
    t0 = time.perf_counter()
    try:
        with stop:
            results = train_population(train_env, spec, configs, seeds, pbt=pbt, eval_env=env, run_dir=run_dir,
                                       resume_from=run_dir if resuming else None, progress=not cmd.quiet,
                                       should_stop=stop)
    except PopulationConfigError as e:
        raise CliError(str(e)) from None
    except KeyboardInterrupt:
        print_error(f"aborted; the last saved checkpoint (if any) is in {pretty_path(run_dir / rd.CHECKPOINT_DIR)}")
        code = 130
    except (ValueError, OSError, RuntimeError) as e:
        print_error(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        code = 1
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
        print(f"{time.perf_counter() - t0:.0f} s; table: {pretty_path(run_dir / TABLE_FILE)}; plots: "
              + ", ".join(p.name for p in plots))
    print(f"run directory: {pretty_path(run_dir)}", flush=True)
    return code
