"""Peers on the suite (issue 35, point 4): the original nnx-ppo 0.3.0, rejax and Brax PPO on bench/suite.py's tasks.

Usage (in the peers' venv, /tmp/peers-venv: ../shared/peers/setup.sh, then
``pip install rejax xminigrid==0.9.3``):

    /tmp/peers-venv/bin/python bench/peers/suite_peers.py list
    /tmp/peers-venv/bin/python bench/peers/suite_peers.py run [--peers original rejax brax] [--tasks T ...]
        [--seeds 0 1 2 3 4] [--budget N] [--out bench/results/suite_peers.jsonl] [--timeout 7200]
    /tmp/peers-venv/bin/python bench/peers/suite_peers.py report [--out ...] [--suite-out bench/results/suite.jsonl]
        [--labels "old defaults=defaults" "adopted defaults=lstm_long,mlp_tanh_ent,gru_long_ub"] [--no-readme]

The tasks are bench/suite.py's ``TASKS`` (name, env spec, env kwargs such as
``memory_length`` and ``hide_obs``, budget, threshold, random and best
scores), read by loading that file as a module: it imports only the standard
library at import time, and nothing of this repository's ``nnx_ppo``. Every
peer gets the suite's env through ``suite_peer_envs.SuiteEnv``, built as
``nnx_ppo.envs.make`` builds it (the same env params, time limits,
``hide_obs`` applied to the observation's last axis as ``ObservationMask``
does), and the task's env-step budget.

Peers (``list`` prints which runs what, and what cannot run):

* ``original``: nnx-ppo 0.3.0 from PyPI, its PPOConfig defaults; its LSTM
  (Dense(64) -> LSTM(64)) on memory tasks, its README's MLP on control
  tasks. It has only a tanh-Gaussian action sampler: discrete actions get a
  categorical sampler written in ``suite_peer_agents.py`` on its
  ``ActionSampler`` interface.
* ``rejax``: rejax 0.1.3's PPO, an MLP everywhere (rejax has no recurrent
  PPO, so on memory tasks it runs without memory); the tuned config of
  rejax's repository for CartPole, Acrobot, Pendulum and
  MountainCarContinuous, its PPO defaults elsewhere.
* ``brax``: Brax 0.14.2 PPO, an MLP (no recurrent policy), the settings of
  ``brax_run.py`` (``brax_playground_run.py`` on Playground); only tasks
  with continuous actions (Brax's PPO has no discrete action distribution).

``run`` trains each (peer, task, seed) in its own process, one at a time
(solo runs, like the suite; seeds outermost), evaluates the final policy on
128 fresh deterministic episodes (the mode of the policy: the tanh-Gaussian's
mean, the categorical's most likely action; the same episodes for every
peer: env resets from ``PRNGKey(1000)``) and appends one JSON row to
``--out``: peer and version, task, seed, budget, env steps trained, wall
seconds, the evaluation's mean/std/min/max, solved (mean >= threshold),
normalized score ``(return - random) / (best - random)``, time to threshold
(wall seconds from the start of training, compilation included, and env
steps at the first periodic evaluation, every ``max(10000, budget // 10)``
steps on 16 deterministic episodes as ``nnx-ppo train`` evaluates, whose mean
reached the threshold; null if none did), the periodic evaluations and the
configuration. Rows already in ``--out`` are skipped (an interrupted run
resumes; Ctrl-C or ``kill`` loses only the run in progress). The runs' output
goes to ``<out>_runs.log``.

``report`` puts them side by side with this library's rows of
bench/results/suite.jsonl and rewrites the part of
bench/README.md between ``<!-- suite-peers:begin -->`` and
``<!-- suite-peers:end -->``. Each of ``--labels`` is one version of this
library's defaults, ``NAME=LABELS``: labels of bench/suite.py joined by
commas whose rows together cover the networks (by default the old defaults,
label ``defaults``, and the adopted ones: ``lstm_long``, ``mlp_tanh_ent``,
``gru_long_ub``). Its time to
threshold comes from each row's curve (or its run directory's metrics.jsonl).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
SUITE_PY = BENCH / "suite.py"
OUT = BENCH / "results" / "suite_peers.jsonl"
SUITE_OUT = BENCH / "results" / "suite.jsonl"
README = BENCH / "README.md"
BEGIN, END = "<!-- suite-peers:begin -->", "<!-- suite-peers:end -->"
SUITE_END = "<!-- suite:end -->"
PEERS = ("original", "rejax", "brax")
PACKAGES = {"original": "nnx-ppo", "rejax": "rejax", "brax": "brax"}
EPISODES = 128  # fresh episodes of the final evaluation, as the suite's
EVAL_SEED = 1000  # the final evaluation's env resets: PRNGKey(EVAL_SEED), the same episodes for every peer
RESULT = "SUITE_PEERS_RESULT "


def load_suite():
    """bench/suite.py as a module (it imports only the standard library at import time)."""
    name = "nnx_ppo_bench_suite"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SUITE_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- what runs where


def continuous_actions(spec: str) -> bool:
    """Whether the env of ``spec`` takes continuous actions (gymnax: its action
    space; every Playground env does; XLand-MiniGrid's do not)."""
    prefix, _, name = spec.partition(":")
    if prefix == "playground":
        return True
    if prefix == "gymnax":
        import gymnax
        from gymnax.environments import spaces

        env, params = gymnax.make(name)
        return not isinstance(env.action_space(params), spaces.Discrete)
    return False


def plan(peer: str, task) -> tuple[str | None, str]:
    """``(network, note)`` of ``peer`` on ``task``; network None: it cannot run the task (the note says why)."""
    import suite_peer_agents as agents

    continuous = continuous_actions(task.env)
    memory = task.kind == "memory"
    if peer == "original":
        network = "lstm" if memory else "mlp"
        note = "LSTM" if memory else "MLP (README's)"
        if not continuous:
            note += "; categorical head written here (0.3.0 has only a tanh-Gaussian sampler)"
        return network, note
    if peer == "rejax":
        source, _ = agents.rejax_config(task.env)
        note = "MLP" + (" (no memory: rejax has no recurrent PPO)" if memory else "")
        note += ("; tuned config " + source.split(":", 1)[1] if source.startswith(agents.REJAX_REPO)
                 else "; its PPO defaults (no tuned config for this env)")
        if task.env.startswith("playground:"):
            note += "; Playground through SuiteEnv (rejax has no Playground adapter)"
        return "mlp", note
    if peer == "brax":
        if not continuous:
            return None, "cannot: discrete actions (Brax 0.14.2 PPO has only (tanh-)Gaussian action distributions)"
        note = "MLP" + (" (no memory: Brax PPO has no recurrent policy)" if memory else "")
        return "mlp", note + "; " + agents.brax_config(task.env)["source"].rsplit("/", 1)[1] + " settings"
    raise ValueError(peer)


def cmd_list(args) -> int:
    suite = load_suite()
    for task in suite.TASKS:
        kwargs = f" {json.dumps(task.env_kwargs)}" if task.env_kwargs else ""
        print(f"{task.name} ({task.kind}, {task.env}{kwargs}, budget {task.budget:,}, threshold {task.threshold:g})")
        for peer in PEERS:
            network, note = plan(peer, task)
            print(f"    {peer:<9} {network or '-':<5} {note}")
    print("\nFinal evaluation: 128 fresh deterministic episodes (policy mode) per run; periodic: 16, every "
          "max(10000, budget // 10) env steps.")
    return 0


# ----------------------------------------------------------------------------- one run (a child process)


def cmd_one(args) -> int:
    """Train and evaluate one (peer, task, seed); print its result as one JSON line."""
    suite = load_suite()
    task = suite.TASK_BY_NAME[args.task]
    budget = args.budget or task.budget
    if args.peer == "original":
        import nnx_ppo

        location = Path(nnx_ppo.__file__).resolve()
        if location.is_relative_to(ROOT):
            raise SystemExit(f"the original must be the peers' venv's nnx_ppo 0.3.0, not {location}")
    import jax
    import suite_peer_agents as agents
    from suite_peer_envs import SuiteEnv, evaluator

    env = SuiteEnv(task.env, task.env_kwargs)
    trained = agents.TRAIN[args.peer](env, task.kind, args.seed, budget, suite.eval_every_steps(budget))
    t0 = time.perf_counter()
    final = evaluator(env, trained.act, EPISODES)(trained.policy_params, trained.carry(EPISODES),
                                                 jax.random.PRNGKey(EVAL_SEED))
    eval_wall = time.perf_counter() - t0
    reached = next((e for e in trained.evals if e[1] >= task.threshold), None)
    from importlib.metadata import version

    result = {
        "peer_version": version(PACKAGES[args.peer]), "jax_version": jax.__version__, "network": trained.network,
        "config": trained.config, "notes": trained.notes, "env_steps": trained.env_steps,
        "wall_s": round(trained.wall_s, 1), "eval_wall_s": round(eval_wall, 1), "episodes": EPISODES,
        "eval_deterministic": trained.deterministic, "eval_seed": EVAL_SEED,
        "eval_mean": final["mean"], "eval_std": final["std"], "eval_min": final["min"], "eval_max": final["max"],
        "eval_length": final["length"], "solved": final["mean"] >= task.threshold,
        "normalized": round(task.normalize(final["mean"]), 4),
        "time_to_threshold_s": reached[2] if reached else None, "steps_to_threshold": reached[0] if reached else None,
        "evals": trained.evals,
    }
    print(RESULT + json.dumps(_finite(result), allow_nan=False), flush=True)
    return 0


def _finite(value):
    """``value`` with every non-finite float written as a string (``"inf"``), so rows stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ----------------------------------------------------------------------------- run


def _key(row: dict) -> tuple[str, str, int]:
    return row["peer"], row["task"], int(row["seed"])


class Interrupted(Exception):
    """A run was stopped by Ctrl-C or SIGTERM: nothing is recorded for it."""


def _child_env() -> dict:
    """The environment of a run: no PYTHONPATH (the peers' own nnx_ppo, never this repository's)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def run_one(peer: str, task, seed: int, budget: int, log, timeout: float) -> dict:
    command = [sys.executable, str(HERE / "suite_peers.py"), "one", peer, task.name, str(seed), "--budget",
               str(budget)]
    row = {"peer": peer, "task": task.name, "seed": seed, "kind": task.kind, "env": task.env,
           "env_kwargs": task.env_kwargs, "budget": budget, "threshold": task.threshold, "random": task.random,
           "best": task.best, "command": shlex.join(command),
           "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_child_env(), start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
        failed = None if proc.returncode == 0 else f"exited {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate()
        failed = f"timed out after {timeout:.0f} s"
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, _ = proc.communicate(timeout=60)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
        log.write((stdout or "") + "(interrupted)\n")
        log.flush()
        raise Interrupted() from None
    log.write(stdout or "")
    log.flush()
    row["process_wall_s"] = round(time.perf_counter() - t0, 1)
    results = [line[len(RESULT):] for line in (stdout or "").splitlines() if line.startswith(RESULT)]
    if failed is None and results:
        row.update(json.loads(results[-1]))
        return row
    lines = [line for line in (stdout or "").strip().splitlines() if line.strip()]
    reason = failed or "no result line"
    return {**row, "failed": f"{reason}: {lines[-1] if lines else ''}"[:500], "solved": False}


def cmd_run(args) -> int:
    suite = load_suite()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = [suite.TASK_BY_NAME[name] for name in args.tasks]
    plans = {(peer, task.name): plan(peer, task) for task in tasks for peer in args.peers}
    for (peer, name), (network, note) in plans.items():
        if network is None:
            print(f"not run: {peer} on {name}: {note}")
    runs = [(peer, task, seed) for seed in args.seeds for task in tasks for peer in args.peers
            if plans[(peer, task.name)][0] is not None]

    def stop(signum, frame):  # `kill PID` stops like Ctrl-C: the run in progress ends, unrecorded
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    log_path = out.with_name(out.stem + "_runs.log")
    done_before = {_key(r) for r in suite.read_rows(out)}
    todo = sum((p, t.name, s) not in done_before for p, t, s in runs)
    print(f"{len(runs)} runs, {todo} to do; results: {suite._rel(out)}; their output: {suite._rel(log_path)}",
          flush=True)
    with log_path.open("a") as log:
        for i, (peer, task, seed) in enumerate(runs, 1):
            budget = args.budget or task.budget
            done = {_key(r): r for r in suite.read_rows(out)}  # read each time: another runner may have added rows
            if (peer, task.name, seed) in done:
                if done[(peer, task.name, seed)].get("budget") != budget:
                    print(f"warning: {(peer, task.name, seed)} is in {out} with another budget; skipped", flush=True)
                continue
            print(f"[{i}/{len(runs)}] {peer} {task.name} seed {seed} ({budget:,} steps) ...", end=" ", flush=True)
            try:
                row = run_one(peer, task, seed, budget, log, args.timeout)
            except (Interrupted, KeyboardInterrupt):
                print("interrupted: not recorded", flush=True)
                return 130
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if "failed" in row:
                print(f"FAILED ({row['failed']})", flush=True)
            else:
                ttt = (f"threshold at {row['time_to_threshold_s']:.0f} s / {row['steps_to_threshold']:,} steps"
                       if row["time_to_threshold_s"] is not None else "threshold not reached")
                print(f"return {row['eval_mean']:.3f} ± {row['eval_std']:.3f}  "
                      f"{'solved' if row['solved'] else 'not solved'}  {ttt}  {row['wall_s']:.0f} s", flush=True)
    return 0


# ----------------------------------------------------------------------------- report


def ours_time_to_threshold(row: dict) -> tuple[float | None, int | None] | None:
    """This library's (wall seconds, env steps) at its first periodic evaluation
    reaching the threshold, from the row's ``evals`` (or its run directory's metrics.jsonl): the
    training clock (``time/elapsed_seconds``, compilation included) at the
    iteration the evaluation followed. (None, None) if none reached it;
    None if the row has no curve and its run directory is gone."""
    if row.get("evals") is not None:  # [env_steps, return, training seconds] (bench/suite.py)
        for steps, value, seconds in row["evals"]:
            if value >= row["threshold"]:
                return seconds, steps
        return None, None
    path = ROOT / row.get("run_dir", "") / "metrics.jsonl"
    if not row.get("run_dir") or not path.exists():
        return None
    elapsed: dict[int, float] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        steps = int(r.get("env_steps", 0))
        if r.get("eval"):
            value = r.get("eval/episode_return")
            if isinstance(value, (int, float)) and value >= row["threshold"]:
                before = [t for s, t in elapsed.items() if s <= steps]
                return (round(max(before), 2) if before else None), steps
        elif isinstance(r.get("time/elapsed_seconds"), (int, float)):
            elapsed[steps] = float(r["time/elapsed_seconds"])
    return None, None


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def _steps(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _cell(group: list[dict]) -> tuple[str, bool | None]:
    """``solved / runs; median time (reached / known)`` and whether a majority of seeds solved it."""
    if not group:
        return "-", None
    solved = sum(bool(r.get("solved")) for r in group)
    failed = sum("failed" in r for r in group)
    curves = [r for r in group if r.get("time_to_threshold_s", "unknown") != "unknown" and "failed" not in r]
    times = [(r["time_to_threshold_s"], r["steps_to_threshold"]) for r in curves
             if r["time_to_threshold_s"] is not None and r["steps_to_threshold"] is not None]
    known = len(curves)
    text = f"{solved}/{len(group)}"
    if times:
        text += (f"; {_median([t for t, _ in times]):.0f} s, {_steps(_median([s for _, s in times]))} "
                 f"({len(times)}/{known})")
    elif known:
        text += f"; never reached (0/{known})"
    if known < len(group) - failed:
        text += f"; {len(group) - failed - known} without curve"
    if failed:
        text += f"; {failed} failed"
    return text, 2 * solved > len(group)


def report_markdown(peer_rows: list[dict], ours: dict[str, list[dict]]) -> str:
    """The side-by-side table: for each group of this library's labels (``ours``:
    its name -> its rows), a column for lstm / mlp and one for gru; one per peer."""
    suite = load_suite()
    columns = []
    for name, our_rows in ours.items():
        for r in our_rows:
            ttt = ours_time_to_threshold(r)
            r["time_to_threshold_s"], r["steps_to_threshold"] = ("unknown", None) if ttt is None else ttt
        columns += [(f"nnx-ppo, {name}: lstm / mlp", lambda r: r.get("network") in ("lstm", "mlp"), our_rows),
                    (f"nnx-ppo, {name}: gru", lambda r: r.get("network") == "gru", our_rows)]
    first_peer = len(columns)
    columns += [(f"{peer} {_versions(peer_rows, peer)}", (lambda p: lambda r: r["peer"] == p)(peer), peer_rows)
                for peer in PEERS]
    lines = ["| task | kind | threshold | " + " | ".join(c[0] for c in columns) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in columns) + " |"]
    totals = [[0, 0] for _ in columns]
    for task in suite.TASKS:
        cells = []
        for j, (_, match, rows) in enumerate(columns):
            group = [r for r in rows if r["task"] == task.name and match(r)]
            text, majority = _cell(group)
            if not group and j >= first_peer:
                network, note = plan(PEERS[j - first_peer], task)
                text = "cannot (discrete actions)" if network is None else "-"
            if majority is not None:
                totals[j][0] += majority
                totals[j][1] += 1
            cells.append(text)
        lines.append(f"| {task.name} | {task.kind} | {task.threshold:g} | " + " | ".join(cells) + " |")
    lines.append("| **tasks solved** (a majority of seeds) | | | "
                 + " | ".join(f"**{s} / {n}**" if n else "-" for s, n in totals) + " |")
    return "\n".join(lines)


def _versions(rows: list[dict], peer: str) -> str:
    versions = sorted({r.get("peer_version") for r in rows if r["peer"] == peer and r.get("peer_version")})
    return ", ".join(versions) if versions else {"original": "0.3.0", "rejax": "0.1.3", "brax": "0.14.2"}[peer]


NOTES = """\
Each cell: final evaluations solved (128 fresh deterministic episodes, mean >= threshold) / runs; then the median
over the runs whose periodic evaluation reached the threshold of the wall seconds (from the start of training,
compilation included) and env steps at the first such evaluation, with how many of the runs reached it (periodic
evaluations: 16 deterministic episodes every max(10k, budget / 10) env steps, for every library); "-": no runs yet;
"without curve": this library's run directory (its metrics.jsonl) is gone. Same tasks, env kwargs, hidden
observations and env-step budgets for all; each (library, task, seed) a solo process on this project's 2-core CPU,
most of them with one other run beside them (one per core), which slowed a run by up to about 2x: wall seconds vary
with the load, env steps do not. Networks: nnx-ppo its defaults (`--no-preset`; lstm and gru on memory tasks, mlp on
control tasks): the old ones (label `defaults`) and the adopted ones (labels `lstm_long`, `mlp_tanh_ent`,
`gru_long_ub`: their settings given as flags, which the library's defaults now are, bench/README's suite section);
the original nnx-ppo 0.3.0 its PPOConfig defaults with Dense(64) -> LSTM(64) on memory tasks and its README's MLP on
control tasks (it has no discrete action sampler: a categorical one written on its `ActionSampler` interface,
`bench/peers/suite_peer_agents.py`); rejax 0.1.3 PPO, an MLP everywhere (no recurrent PPO: on memory tasks it runs
without memory), the tuned configs of rejax's repository for CartPole, Acrobot, Pendulum and MountainCarContinuous
and its defaults elsewhere; Brax 0.14.2 PPO, an MLP (no recurrent policy) with `bench/peers/brax_run.py`'s settings
(`brax_playground_run.py`'s on Playground), continuous actions only."""


def rewrite_readme(section: str, readme: Path = README) -> None:
    """Put ``section`` between the suite-peers markers of bench/README.md; where
    they are absent, add them right after the suite section's end marker."""
    text = readme.read_text()
    block = f"{BEGIN}\n{section}\n{END}"
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + block + text[end:]
    elif SUITE_END in text:
        at = text.index(SUITE_END) + len(SUITE_END)
        text = text[:at] + "\n\n" + block + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)


def cmd_report(args) -> int:
    suite = load_suite()
    budgets = {t.name: t.budget for t in suite.TASKS}
    all_peer = [r for r in suite.read_rows(Path(args.out)) if r.get("task") in budgets]
    peer_rows = [r for r in all_peer if r.get("budget") == budgets[r["task"]]]
    suite_rows = [r for r in suite.read_rows(Path(args.suite_out))
                  if r.get("task") in budgets and r.get("budget") == budgets[r["task"]]]
    groups = dict(g.split("=", 1) if "=" in g else (g, g) for g in args.labels)
    ours = {name: [r for r in suite_rows if r.get("label") in labels.split(",")] for name, labels in groups.items()}
    if not peer_rows and not any(ours.values()):
        print(f"no rows in {args.out} or {args.suite_out}")
        return 1
    dates = sorted(r["started"][:10] for r in peer_rows)
    left_out = len(all_peer) - len(peer_rows)
    header = (f"Rows: {len(peer_rows)} peer runs in `{suite._rel(Path(args.out))}`"
              + (f" ({dates[0]} to {dates[-1]})" if dates else " (none yet)")
              + (f", {left_out} rows of other budgets left out" if left_out else "")
              + ", and " + ", ".join(f"{len(ours[n])} runs of {n} (`{labels}`)" for n, labels in groups.items())
              + f" in `{suite._rel(Path(args.suite_out))}`. "
              "`python bench/peers/suite_peers.py report` rewrote this part.\n")
    section = header + "\n" + report_markdown(peer_rows, ours) + "\n\n" + NOTES
    print(section)
    if not args.no_readme:
        rewrite_readme(section)
        print(f"\nwrote the section of {README}")
    return 0


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))  # suite_peer_envs, suite_peer_agents, brax_compat
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="which peer runs which task, and what cannot run")
    task_names = [t.name for t in load_suite().TASKS]
    p_run = sub.add_parser("run", help="train and evaluate the runs not yet in --out")
    p_run.add_argument("--peers", nargs="+", default=list(PEERS), choices=PEERS)
    p_run.add_argument("--tasks", nargs="+", default=task_names, choices=task_names)
    p_run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p_run.add_argument("--budget", type=int, default=None,
                       help="env steps for every task instead of its budget (smoke tests: give them their own --out)")
    p_run.add_argument("--out", default=str(OUT))
    p_run.add_argument("--timeout", type=float, default=7200.0,
                       help="seconds a run may take before it is stopped and recorded as failed")
    p_one = sub.add_parser("one", help="(internal) one run in this process; prints its result")
    p_one.add_argument("peer", choices=PEERS)
    p_one.add_argument("task", choices=task_names)
    p_one.add_argument("seed", type=int)
    p_one.add_argument("--budget", type=int, default=None)
    p_report = sub.add_parser("report", help="the side-by-side table, and the README section")
    p_report.add_argument("--out", default=str(OUT))
    p_report.add_argument("--suite-out", default=str(SUITE_OUT))
    p_report.add_argument("--labels", nargs="+",
                          default=["old defaults=defaults", "adopted defaults=lstm_long,mlp_tanh_ent,gru_long_ub"],
                          help="this library's defaults, one version each: NAME=LABELS, labels of --suite-out "
                               "joined by commas (default: the old defaults, then the adopted ones)")
    p_report.add_argument("--no-readme", action="store_true", help="print only")
    args = parser.parse_args(argv)
    return {"list": cmd_list, "run": cmd_run, "one": cmd_one, "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
