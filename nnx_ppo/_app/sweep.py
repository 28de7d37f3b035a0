"""``nnx-ppo sweep``: a grid of hyperparameters x seeds as one population.

The grid's configs (every combination of ``--grid`` values on top of the
``train`` flags) and ``--seeds`` become the members of
:func:`~nnx_ppo.algorithms.population.train_population`, which writes the run
directory (``config.json`` with the members, ``metrics.jsonl`` rows per
member, ``checkpoints/`` holding every member, one best policy each). After
training, the report (the second half of this module, read only from
``config.json`` and ``metrics.jsonl``) ranks the configs (:func:`sweep_summary`;
with PBT: the members, by their final hyperparameters, with their lineage and
failures) and writes ``sweep.md`` and ``sweep.json`` (:func:`write_outputs`)
and the plots (``sweep_<field>.png``: final return against each swept value;
``pbt_<field>.png`` with PBT: each member's value over training).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from nnx_ppo import runner as rd
from nnx_ppo._app.commands import (
    PROG,
    CliError,
    SweepCommand,
    shell_command,
)
from nnx_ppo._app.plot import (
    bootstrap_interval,
    elapsed_seconds,
    format_value,
    interquartile_mean,
    mean,
    threshold_cells,
    threshold_reached,
)
from nnx_ppo._app.runs import (
    build_network,
    check_distinct_seeds,
    make_envs,
    network_spec_of,
    prepared,
    print_error,
    run_directory,
    train_into,
    usage_errors,
)
from nnx_ppo.algorithms.config import PPOConfig
from nnx_ppo.network_spec import NetworkSpec
from nnx_ppo.presets import find_preset
from nnx_ppo.runner import Run, RunSpec, pretty_path

__all__ = ["run_sweep", "parse_grid", "grid_configs", "sweep_summary", "format_table", "write_outputs",
           "member_lineage", "lineage_text", "failure_text", "SUMMARY_FILE", "TABLE_FILE"]


def parse_grid(entries: tuple[str, ...] | list[str]) -> dict[str, list[float]]:
    """``("ppo.learning-rate=1e-3,3e-4", ...)`` as ``{"learning_rate": [1e-3, 3e-4], ...}``
    (PPOConfig field names, in the order given). A CliError names a bad entry
    and what is expected."""
    from nnx_ppo.algorithms._hyperparameters import PER_MEMBER

    known = {f.name for f in dataclasses.fields(PPOConfig)}
    allowed = ", ".join("ppo." + f.replace("_", "-") for f in PER_MEMBER)
    grid: dict[str, list[float]] = {}
    for entry in entries:
        name, sep, values = entry.partition("=")
        field = name.strip().removeprefix("--").removeprefix("ppo.").replace("-", "_")
        if not sep or not values.strip() or not name.strip().removeprefix("--").startswith("ppo."):
            raise CliError(f"--grid: expected FIELD=V1,V2,... such as ppo.learning-rate=1e-3,3e-4, got {entry!r}")
        if field not in known:
            close = difflib.get_close_matches(field, known, n=1, cutoff=0.6)
            hint = f" (did you mean ppo.{close[0].replace('_', '-')}?)" if close else ""
            raise CliError(f"--grid: unknown field {name.strip()}{hint}; sweepable: {allowed}")
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
    values = [dict(zip(grid, combination)) for combination in itertools.product(*grid.values())]
    with usage_errors(ValueError, prefix="--grid: "):
        configs = [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, **chosen)) for chosen in values]
    return configs, values


def run_sweep(cmd: SweepCommand, argv: list[str], saved: dict[str, Any] | None = None) -> int:
    """``nnx-ppo sweep`` (and ``resume`` of a sweep, with the run's ``saved``
    config.json): returns the exit code (0 done or stopped, 1 failed, 2 bad
    usage, 130 aborted). The run directory is locked throughout."""
    if cmd.run.video_every:
        raise CliError("--video-every is not available with sweep")
    if cmd.processes.coordinator_address is not None:
        raise CliError("sweep runs in one process (its members can share several devices: --shard-seeds)")
    if cmd.sweep.pbt_every < 0:
        raise CliError(f"--pbt-every must be >= 0, got {cmd.sweep.pbt_every}")
    if cmd.run.resume is not None and cmd.sweep.grid:
        raise CliError("--grid is the sweep's own: not with --resume (the run's members are resumed)")
    if cmd.run.resume is None and not cmd.sweep.grid:
        raise CliError("give --grid FIELD=V1,V2 ... (e.g. --grid ppo.learning-rate=1e-3,3e-4)")
    cmd, env_kwargs, train_env_kwargs = prepared(cmd, saved)
    if cmd.run.resume is not None:
        # the configs: the shared config as parsed (the run's, with the flags' changes) with each one's own numbers
        seeds = list(saved["population"]["seeds"])
        configs = [dataclasses.replace(cmd.config, ppo=dataclasses.replace(cmd.config.ppo, **m["hyperparameters"]))
                   for m in saved["members"][::len(seeds)]]
    else:
        seeds = check_distinct_seeds(list(cmd.seeds) or [cmd.config.seed])
        configs, _ = grid_configs(cmd.config, parse_grid(cmd.sweep.grid))
    with run_directory(cmd, saved, "sweep") as run_dir:
        return _sweep(cmd, argv, run_dir, configs, seeds, env_kwargs, train_env_kwargs, saved)


def _sweep(cmd: SweepCommand, argv: list[str], run_dir: Path, configs: list, seeds: list[int], env_kwargs: dict,
           train_env_kwargs: dict, saved: dict[str, Any] | None) -> int:
    """Train the population, then write and print the ranked table."""
    from nnx_ppo.algorithms._hyperparameters import PopulationConfigError
    from nnx_ppo.algorithms.population import PBTConfig, train_population

    resuming = cmd.run.resume is not None
    train_env, env = make_envs(cmd.env, env_kwargs, train_env_kwargs)
    if resuming:
        spec = NetworkSpec.from_dict(saved["network"], where=f"{run_dir / rd.CONFIG_FILE}")
    else:
        spec = network_spec_of(cmd, env_kwargs, seeds[0])
    build_network(spec, env, cmd)  # a network that cannot be built is named before anything else
    pbt = PBTConfig(every_iterations=cmd.sweep.pbt_every, seed=seeds[0]) if cmd.sweep.pbt_every else None
    preset = find_preset(cmd.env, cmd.setup.network)
    threshold = cmd.sweep.threshold if cmd.sweep.threshold is not None else (preset.target if preset else None)
    n = len(configs) * len(seeds)
    print(f"{'resuming' if resuming else 'sweeping'} {len(configs)} configs x {len(seeds)} seeds = {n} members "
          f"of {cmd.setup.network} on {cmd.env}{f', PBT every {cmd.sweep.pbt_every} iterations' if pbt else ''}; "
          f"run directory: {pretty_path(run_dir)}", flush=True)
    run = Run.open(run_dir, RunSpec(env=cmd.env, network=spec.to_dict(), config=configs[0], env_kwargs=env_kwargs,
                                    train_env_kwargs=train_env_kwargs, seeds=tuple(range(n)), command=(PROG, *argv)),
                   resuming=resuming, progress=True, quiet=cmd.run.quiet)
    t0 = time.perf_counter()

    def train(stop):
        with usage_errors(PopulationConfigError):
            return train_population(train_env, spec, configs, seeds, pbt=pbt, eval_env=env, run=run,
                                    resume_from=run_dir if resuming else None, should_stop=stop)

    code, results, stopped = train_into(run, train)
    failed = [i for i, r in enumerate(results or []) if r.failure is not None]
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


# ----------------------------------------------------------------------------- the report


SUMMARY_FILE = "sweep.json"
TABLE_FILE = "sweep.md"
_METRIC = "eval/episode_return"


def member_lineage(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Per member, the states it took over under PBT, in order, from the
    ``population/took_over`` of its iteration rows: ``[{"iteration": 2,
    "from": 3, "revived": False}, ...]``. ``revived``: the first takeover at
    or after the member's failure (see :func:`~nnx_ppo.runner.failure_rows`),
    which copied a healthy state over the failed one."""
    failures = rd.failure_rows(rows)
    lineage: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        source = r.get("population/took_over")
        if r.get("eval") or "seed" not in r or not isinstance(source, (int, float)) or source < 0:
            continue
        events = lineage.setdefault(int(r["seed"]), [])
        failure = failures.get(r["seed"])
        revived = (failure is not None and int(r["iteration"]) >= int(failure["iteration"])
                   and not any(e["revived"] for e in events))
        events.append({"iteration": int(r["iteration"]), "from": int(source), "revived": revived})
    return lineage


def lineage_text(events: list[dict[str, Any]], only_revival: bool = False) -> str:
    """``revived from member 2 at iteration 2, took over member 3 at iteration 6``
    (``only_revival``: the revival alone); empty without events."""
    return ", ".join(f"revived from member {e['from']} at iteration {e['iteration']}" if e["revived"]
                     else f"took over member {e['from']} at iteration {e['iteration']}"
                     for e in events if e["revived"] or not only_revival)


def failure_text(failure: dict[str, Any]) -> str:
    """``FAILED at iteration 1 (env steps 128): non-finite values ...`` of a
    failure row (:data:`~nnx_ppo.runner.FAILURE_KEY`) or a summary's ``failure``."""
    reason = failure.get(rd.FAILURE_KEY, failure.get("reason", ""))
    return f"FAILED at iteration {failure['iteration']} (env steps {failure['env_steps']}): {reason}"


def _final_hyperparameters(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per member, its hyperparameters at the end: the ``hyperparameters/<field>``
    of its last iteration row that has them (a failed member's: before it failed)."""
    final: dict[int, dict[str, float]] = {}
    prefix = "hyperparameters/"
    for r in rows:
        values = {k.removeprefix(prefix): v for k, v in r.items() if k.startswith(prefix) and isinstance(v, float)}
        if values and "seed" in r and not r.get("eval"):
            final[int(r["seed"])] = values
    return final


def _curve_stats(steps: list[int], ys: list[float], elapsed: dict[int, float],
                 threshold: float | None) -> dict[str, Any]:
    """Of an evaluation curve (``steps``, ``ys``): its AUC (area under the
    curve / its env steps) and the first env step and seconds of training at
    which it reached ``threshold``."""
    auc = ys[0] if len(steps) == 1 else math.nan
    if len(steps) > 1:
        area = sum((b - a) * (ya + yb) / 2 for a, b, ya, yb in zip(steps, steps[1:], ys, ys[1:]))
        auc = area / (steps[-1] - steps[0])
    return {"auc": auc, **threshold_reached(steps, ys, elapsed, threshold)}


def _member_entries(members: list[dict[str, Any]], fields: list[str], rows: list[dict[str, Any]], curves: dict,
                    elapsed: dict[int, float], threshold: float | None) -> list[dict[str, Any]]:
    """Every member's entry of the summary: seed, starting values of
    ``fields``, final and best return, AUC and threshold, its failure
    (``{"iteration", "env_steps", "reason", "type"}`` or None; a failed
    member has no final return and no AUC), its PBT ``lineage`` and its
    final ``hyperparameters`` (as logged). ``curves``: member index ->
    (steps, returns) of ``rows``; ``elapsed``: their :func:`elapsed_seconds`."""
    failures, lineage = rd.failure_rows(rows), member_lineage(rows)
    final_values = _final_hyperparameters(rows)
    entries = []
    for i, m in enumerate(members):
        steps, ys = curves.get(i, ([], []))
        failure = failures.get(i)
        entry = {"member": i, "seed": m["seed"], **{f: m["hyperparameters"][f] for f in fields},
                 "final": ys[-1] if ys and failure is None else math.nan, "best": max(ys) if ys else math.nan,
                 **_curve_stats(steps, ys, elapsed, threshold),
                 "failure": None if failure is None else {
                     "iteration": failure["iteration"], "env_steps": failure["env_steps"],
                     "reason": failure[rd.FAILURE_KEY], "type": failure.get("failure_type")},
                 "lineage": lineage.get(i, []), "hyperparameters": final_values.get(i, {})}
        if failure is not None:
            entry["auc"] = math.nan
        entries.append(entry)
    return entries


def sweep_summary(run_dir: Path, threshold: float | None = None) -> dict[str, Any]:
    """The sweep's configs ranked, from the run's ``config.json`` and
    ``metrics.jsonl``: per config (over its seeds' evaluations; a failed
    member counts for none of them, and the config lists it under
    ``failed``) the final and best return (means over seeds), the
    interquartile mean of the final returns with a 95% bootstrap interval,
    the AUC (area under the mean curve / its steps), and the first env step
    and seconds of training at which the mean over seeds reached
    ``threshold``; ranked by whether a member failed (configs without
    failures first), then IQM final, then AUC. Also every member's entry
    (see :func:`_member_entries`) and, with PBT, ``member_ranking``: the
    members' indices ranked by their own final return (failed ones last),
    then AUC; under PBT the members leave their configs' values, so the
    members are what ``sweep.md`` ranks."""
    saved = rd.read_run_config(run_dir)
    members = saved["members"]
    seeds = saved["population"]["seeds"]
    pbt = saved["population"].get("pbt")
    fields = [f for f in members[0]["hyperparameters"]
              if len({m["hyperparameters"][f] for m in members}) > 1]
    rows = rd.read_metrics(run_dir)
    curves = rd.seed_curves(rows, _METRIC)
    elapsed = elapsed_seconds(rows)
    per_member = _member_entries(members, fields, rows, curves, elapsed, threshold)
    configs = []
    for c in range(len(members) // len(seeds)):
        indices = list(range(c * len(seeds), (c + 1) * len(seeds)))
        failed = [i for i in indices if per_member[i]["failure"] is not None]
        member_curves = [curves[i] for i in indices if i in curves and curves[i][1] and i not in failed]
        finals = [ys[-1] for _, ys in member_curves]
        common = sorted(set.intersection(*(set(s) for s, _ in member_curves))) if member_curves else []
        mean_curve = [mean([ys[list(s).index(x)] for s, ys in member_curves]) for x in common]
        configs.append({"config": c, "members": indices, "failed": failed,
                        **{f: members[indices[0]]["hyperparameters"][f] for f in fields},
                        "final": mean(finals), "best": mean([max(ys) for _, ys in member_curves]),
                        "iqm_final": interquartile_mean(finals), "iqm_interval": bootstrap_interval(finals),
                        **_curve_stats(common, mean_curve, elapsed, threshold)})
    key = lambda e: (not e["failed"], _nan_low(e["iqm_final"]), _nan_low(e["auc"]))  # noqa: E731
    ranked = sorted(configs, key=key, reverse=True)
    member_key = lambda m: (m["failure"] is None, _nan_low(m["final"]), _nan_low(m["auc"]))  # noqa: E731
    member_ranking = [m["member"] for m in sorted(per_member, key=member_key, reverse=True)] if pbt else None
    return {"fields": fields, "seeds": seeds, "threshold": threshold, "configs": ranked, "members": per_member,
            "pbt": pbt, "member_ranking": member_ranking}


def _nan_low(x: float) -> float:
    return -math.inf if x is None or math.isnan(x) else x


def _markdown(header: list[str], lines: list[list[str]]) -> str:
    """A Markdown table."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(cells) + " |" for cells in lines)])


def format_table(summary: dict[str, Any]) -> str:
    """The ranking as a Markdown table (what ``sweep.md`` holds first and
    the command prints): the configs, or with PBT the members
    (:func:`_ranked_member_table`)."""
    if summary.get("member_ranking") is not None:
        return _ranked_member_table(summary)
    fields, threshold = summary["fields"], summary["threshold"]
    header = ["rank", "config", *fields, "final", "best", "IQM final [95% CI]", "AUC", *threshold_cells(threshold),
              "failed members"]
    lines = []
    for rank, c in enumerate(summary["configs"], start=1):
        lo, hi = c["iqm_interval"]
        iqm = f"{format_value(c['iqm_final'])} [{format_value(lo)}, {format_value(hi)}]"
        lines.append([str(rank), str(c["config"]), *(f"{c[f]:g}" for f in fields), format_value(c["final"]),
                      format_value(c["best"]), iqm, format_value(c["auc"]),
                      *threshold_cells(threshold, c), ", ".join(map(str, c.get("failed", []))) or "-"])
    return _markdown(header, lines)


def _pbt_fields(summary: dict[str, Any]) -> list[str]:
    """The hyperparameters a PBT table shows: the swept ones, and those
    whose final values differ between the members."""
    finals = [m["hyperparameters"] for m in summary["members"]]
    changed = [f for f in (finals[0] if finals else {}) if len({v.get(f) for v in finals}) > 1]
    return [*summary["fields"], *(f for f in changed if f not in summary["fields"])]


def _value_cell(member: dict[str, Any], field: str) -> str:
    """A member's final value of ``field``, after its starting value when they differ (``0.001 → 0.00125``)."""
    final = member["hyperparameters"].get(field)
    start = member.get(field)
    if start is None or final is None:
        return format_value(final if final is not None else start, "g")
    return f"{final:g}" if f"{final:g}" == f"{start:g}" else f"{start:g} → {final:g}"


def _ranked_member_table(summary: dict[str, Any]) -> str:
    """With PBT: the members ranked by their final return (failed members
    last), each with its final hyperparameters, its lineage and its failure."""
    fields, threshold = _pbt_fields(summary), summary["threshold"]
    header = ["rank", "member", "seed", *fields, "final", "best", "AUC", *threshold_cells(threshold), "lineage",
              "failure"]
    lines = []
    for rank, index in enumerate(summary["member_ranking"], start=1):
        m = summary["members"][index]
        lines.append([str(rank), str(index), str(m["seed"]), *(_value_cell(m, f) for f in fields),
                      format_value(m["final"]), format_value(m["best"]), format_value(m["auc"]),
                      *threshold_cells(threshold, m), lineage_text(m["lineage"]) or "-",
                      failure_text(m["failure"]) if m["failure"] else "-"])
    return _markdown(header, lines)


def _member_table(summary: dict[str, Any]) -> str:
    """Every member (without PBT): its seed, values, final and best return, and its failure."""
    fields = summary["fields"]
    header = ["member", "seed", *fields, "final", "best", "failure"]
    return _markdown(header, [[str(m["member"]), str(m["seed"]), *(f"{m[f]:g}" for f in fields),
                               format_value(m["final"]), format_value(m["best"]),
                               failure_text(m["failure"]) if m["failure"] else "-"]
                              for m in summary["members"]])


def write_outputs(run_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """``sweep.json``, ``sweep.md`` and the plots; returns the plots written."""
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    pbt = summary.get("pbt")
    failed = [m["member"] for m in summary["members"] if m["failure"]]
    note = "" if not failed else (f"\nMembers {failed} failed: a failed member has no final return, counts for "
                                  "none of its config's statistics, and ranks last.\n")
    usage = f"`{shell_command(PROG, 'eval', run_dir.name)} --member K`, `load_policy(run, member=K)`."
    if pbt:
        intro = (f"Population-based training every {pbt['every_iterations']} iterations: members take over the "
                 "states of better ones and perturb their hyperparameters, so they are ranked one by one, by "
                 "their final evaluation return (then AUC: area under the evaluation curve / its env steps), "
                 "with their hyperparameters at the end (`start → final` where PBT changed them) and their "
                 "lineage (the members whose states they took over, at which iterations; *revived*: copied "
                 "over a failed member). The configs, by starting values, are in sweep.json.\n")
        body = f"{format_table(summary)}\n\n{usage}\n"
    else:
        intro = (f"Configs ranked by the interquartile mean (IQM) of their seeds' final evaluation returns (seeds "
                 f"{summary['seeds']}; 95% percentile-bootstrap interval over seeds), configs with failed members "
                 "last; AUC: area under the mean evaluation curve / its env steps.\n")
        body = f"{format_table(summary)}\n\n## Members\n\n{usage}\n\n{_member_table(summary)}\n"
    (run_dir / TABLE_FILE).write_text(f"# Sweep: {run_dir.name}\n\n{intro}{note}\n{body}")
    return _plots(run_dir, summary)


def _plots(run_dir: Path, summary: dict[str, Any]) -> list[Path]:
    """``sweep_<field>.png``: every member's final return (dots) and each
    value's median over its members (line) against the swept value (with
    PBT: the member's final value); with PBT, ``pbt_<field>.png``: each
    member's value over training. Failed members have no final return."""
    written = []
    pbt = bool(summary.get("pbt"))
    for field in summary["fields"]:
        fig, ax = rd.new_figure((6, 4))
        points = [(m["hyperparameters"].get(field, m[field]) if pbt else m[field], m["final"])
                  for m in summary["members"] if not math.isnan(m["final"])]
        xs = sorted({x for x, _ in points})
        ax.plot([x for x, _ in points], [y for _, y in points], "o", alpha=0.5, label="member (final)")
        medians = [statistics.median(y for x2, y in points if x2 == x) for x in xs]
        ax.plot(xs, medians, "-", color="C1", label="median")
        if xs and min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(f"{'final ' if pbt else ''}ppo.{field.replace('_', '-')}")
        ax.set_ylabel(f"final {_METRIC}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        written.append(run_dir / f"sweep_{field}.png")
        rd.save_figure(fig, written[-1])
    if pbt:
        rows = [r for r in rd.read_metrics(run_dir) if not r.get("eval") and "seed" in r]
        for field in summary["fields"] or ["learning_rate"]:
            key = f"hyperparameters/{field}"
            fig, ax = rd.new_figure((7, 4))
            for m in summary["members"]:
                mine = [(r["env_steps"], r[key]) for r in rows if r["seed"] == m["member"] and key in r]
                ax.plot([s for s, _ in mine], [v for _, v in mine], "-", linewidth=1, label=f"member {m['member']}")
            ax.set_xlabel("env steps (per member)")
            ax.set_ylabel(f"ppo.{field.replace('_', '-')}")
            ax.set_yscale("log" if field in ("learning_rate", "reward_scale") else "linear")
            ax.grid(True, alpha=0.3)
            if len(summary["members"]) <= 12:
                ax.legend(fontsize="x-small", ncol=2)
            written.append(run_dir / f"pbt_{field}.png")
            rd.save_figure(fig, written[-1])
    return written
