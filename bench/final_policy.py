"""The policy a user gets: final and best evaluated policies of a preset over seeds.

Usage: python bench/final_policy.py ENV [NETWORK] [--seeds 0 1 ...] [--episodes 128] [--set KEY=JSON ...]
                                    [--env-kwargs JSON] [--hidden-size H] [--network-kwargs JSON] [--target T]
                                    [--label NAME] [--out FILE]

Trains ENV's preset the way users run it: one ``nnx-ppo train ENV --seed S``
process per seed (the preset's envs, network and config), then evaluates
every seed's final policy and the best evaluated policy training kept, each
on ``--episodes`` deterministic episodes with fresh reset keys. With
``--batched``, all seeds train in one program instead (``train_seeds``, as
``nnx-ppo train ENV --seeds ...`` does): a batch follows other float paths
than solo runs, so its figures are labelled as such (``"batched": true``). Prints one JSON line per seed and a summary
(how many seeds reach the preset's target, final and best); appends each
seed's row to ``--out`` (default bench/results/final_policy.jsonl) as soon
as it is evaluated, with the commit and the command, then the summary. ``--set`` overrides a
TrainConfig field (``--set ppo.learning_rate_decay=true``), ``--env-kwargs`` the preset's env
keyword arguments (``'{"n_cues": 4, "delay": 40}'``); ``--label`` names
such a variant. ``--trained-in DIR`` evaluates seeds trained elsewhere with that
same command (``DIR/seed_S``, e.g. run on an accelerator and copied back);
their ``wall_s`` is the run's training time as its metrics record it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nnx_ppo.algorithms.config import config_from_dict, config_to_dict
from nnx_ppo.algorithms.evaluation import evaluate
from nnx_ppo.algorithms.population import train_seeds
from nnx_ppo.network_spec import load_network
from nnx_ppo.presets import find_preset

HERE = Path(__file__).resolve().parent


def with_overrides(config, overrides: list[str]):
    """``config`` with ``section.field=JSON`` overrides applied."""
    data = config_to_dict(config)
    for item in overrides:
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node[part]
        node[last] = json.loads(value)
    return config_from_dict(data)


def cli_flags(overrides: list[str]) -> list[str]:
    """``--set section.field=JSON`` overrides as ``nnx-ppo train`` flags
    (``ppo.learning_rate_decay=true`` -> ``--ppo.learning-rate-decay``)."""
    flags = []
    for item in overrides:
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        value = json.loads(value)
        name = ".".join([*path, last]).replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{'.'.join([*path, ('' if value else 'no-') + last.replace('_', '-')])}")
        else:
            flags += [f"--{name}", "None" if value is None else str(value)]
    return flags


def solo_command(args, preset, seed: int, run: Path) -> list[str]:
    """The ``nnx-ppo train`` command that trains seed ``seed`` of ``preset`` into ``run``."""
    command = [str(Path(sys.executable).parent / "nnx-ppo"), "train", preset.env, "--network", preset.network,
               "--seed", str(seed), "--run-dir", str(run), "--quiet", *cli_flags(args.overrides)]
    if args.env_kwargs is not None:
        command += ["--env-kwargs", args.env_kwargs]
    if args.hidden_size is not None:
        command += ["--hidden-size", str(args.hidden_size)]
    if args.network_kwargs is not None:
        command += ["--network-kwargs", args.network_kwargs]
    return command


def read_evals(run: Path) -> tuple[list[dict], list[float]]:
    """``run``'s metric rows and its training evaluations' returns."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, [r["eval/episode_return"] for r in rows if r.get("eval")]


def train_solo(args, preset, seed: int, run: Path) -> tuple[float, list[float], list[str]]:
    """Seed ``seed`` as a user runs it: its own ``nnx-ppo train`` process
    into ``run``. Returns its wall time, its training evaluations and the command."""
    command = solo_command(args, preset, seed, run)
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    return wall, read_evals(run)[1], command


def git_commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes to tracked files)."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "-uno") else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env")
    parser.add_argument("network", nargs="?", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--env-kwargs", default=None, help="JSON: replaces the preset's env keyword arguments")
    parser.add_argument("--hidden-size", type=int, default=None, help="replaces the preset's network width")
    parser.add_argument("--network-kwargs", default=None, help="JSON: extra keyword arguments of the network factory")
    parser.add_argument("--label", default="preset")
    parser.add_argument("--target", type=float, default=None, help="the bar (default: the preset's target)")
    parser.add_argument("--out", default=str(HERE / "results" / "final_policy.jsonl"))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--batched", action="store_true", help="all seeds in one program (not as users run)")
    mode.add_argument("--trained-in", default=None,
                        help="evaluate runs already trained elsewhere (DIR/seed_S, e.g. on an accelerator) "
                             "instead of training them")
    args = parser.parse_args()
    preset = find_preset(args.env, args.network)
    if preset is None:
        raise SystemExit(f"no preset for {args.env} {args.network or ''}")
    if args.env_kwargs is not None:
        preset = dataclasses.replace(preset, env_kwargs=json.loads(args.env_kwargs))
    if args.hidden_size is not None:
        preset = dataclasses.replace(preset, hidden_size=args.hidden_size)
    config = with_overrides(preset.config, args.overrides)
    target = preset.target if args.target is None else args.target
    train_env, eval_env = preset.make_envs()
    spec = preset.network_spec()
    if args.network_kwargs is not None:
        spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **json.loads(args.network_kwargs)})
    max_len = config.eval.max_episode_length
    rows = []
    commit = git_commit()

    def record(seed, checkpoints, which_seed, wall, evals, failed, command) -> None:
        """Evaluate seed ``seed``'s final and best policies; print and append its row."""
        row = {"env": preset.env, "env_kwargs": preset.env_kwargs, "network": preset.network,
               "label": args.label, "seed": seed, "batched": args.batched,
               "target": target, "episodes": args.episodes, "wall_s": round(wall, 1),
               "hidden_size": preset.hidden_size, "network_kwargs": args.network_kwargs,
               "overrides": args.overrides, "failed": failed, "commit": commit, "command": command}
        for which in (None, "best"):
            net = load_network(checkpoints, spec.build(eval_env), seed=which_seed, step=which)
            metrics = evaluate(eval_env, net, n_envs=args.episodes, max_episode_length=max_len, seed=1000 + seed)
            name = which or "final"
            row[f"{name}_return"] = round(metrics["eval/episode_return"], 3)
            row[f"{name}_min"] = round(metrics["eval/episode_return_min"], 3)
        row["train_evals"] = [round(e, 2) for e in evals]
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(args.out, "a") as f:  # each seed as it is done: an interruption keeps the seeds so far
            f.write(json.dumps(row) + "\n")

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as directory:
        if args.batched:
            t0 = time.perf_counter()
            results = train_seeds(train_env, lambda rngs: spec.build(eval_env, rngs), config,
                                  args.seeds, eval_env=eval_env, checkpoint_dir=directory)
            wall = time.perf_counter() - t0
            for s, r in zip(args.seeds, results):
                record(s, directory, s, wall, [m["eval/episode_return"] for _, m in r.eval_history],
                       r.failure is not None, None)
        elif args.trained_in is not None:
            for s in args.seeds:
                run = Path(args.trained_in) / f"seed_{s}"
                metrics, evals = read_evals(run)
                wall = max(r.get("time/elapsed_seconds", 0.0) for r in metrics)  # training time, not start-up
                record(s, str(run / "checkpoints"), None, wall, evals, False,
                       " ".join(solo_command(args, preset, s, Path(f"seed_{s}"))[1:]))
        else:
            for s in args.seeds:
                wall, evals, command = train_solo(args, preset, s, Path(directory) / f"seed_{s}")
                record(s, str(Path(directory) / f"seed_{s}" / "checkpoints"), None, wall, evals, False,
                       " ".join(command[1:]))
    finals = np.array([r["final_return"] for r in rows])
    bests = np.array([r["best_return"] for r in rows])
    summary = {"env": preset.env, "env_kwargs": preset.env_kwargs, "network": preset.network,
               "label": args.label, "seeds": args.seeds, "batched": args.batched,
               "target": target,
               "final_reached": None if target is None else int(np.sum(finals >= target)),
               "best_reached": None if target is None else int(np.sum(bests >= target)),
               "final_median": float(np.median(finals)),
               "final_min": float(finals.min()), "best_min": float(bests.min()),
               "wall_s": sum(r["wall_s"] for r in rows) if not args.batched else rows[0]["wall_s"]}
    print(json.dumps(summary))
    with open(args.out, "a") as f:
        f.write(json.dumps({"summary": {**summary, "commit": commit}}) + "\n")


if __name__ == "__main__":
    main()
