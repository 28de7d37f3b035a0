"""The learning check on ``rodent_imitation`` (issue 36, point 4): curves of solo runs against two baselines.

Usage:
    nnx-ppo train rodent_imitation --seed S --run-dir runs/rodent/seedS      # S = 0, 1, 2 (the CPU preset)
    python bench/bench_rodent.py --no-env --baselines 128                    # random and zero actions
    python bench/rodent_learning.py runs/rodent/seed0 runs/rodent/seed1 runs/rodent/seed2 \\
        [--out bench/results/rodent_learning.png]
    python bench/rodent_learning.py --rows s12-users-chip s7-side-by-side s8-side-by-side --log-steps \\
        --out bench/results/rodent_users_chip.png     # curves kept as rows of bench/results/rodent.jsonl

Reads each run's ``metrics.jsonl`` (or, with ``--rows``, the curves kept in
the rows of ``bench/results/rodent.jsonl`` with those labels: their
``evals`` and ``train_every_5th_iteration`` lists) and the latest baseline rows of
``bench/results/rodent.jsonl``; draws four panels against env steps (the
training episodes' return and length, as the stochastic policy lives them,
and the deterministic evaluation's), with the baselines as horizontal lines,
and prints a markdown table of each run's first and last values.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
PANELS = (("train/episode_return", "training return"), ("train/episode_length", "training lifespan (steps)"),
          ("eval/episode_return", "evaluation return"), ("eval/episode_length", "evaluation lifespan (steps)"))


def read_curves(run: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(env steps, value), ...]}`` for the metrics of :data:`PANELS`."""
    curves: dict[str, list[tuple[int, float]]] = {metric: [] for metric, _ in PANELS}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for metric in curves:
            if metric in row and "env_steps" in row:
                curves[metric].append((int(row["env_steps"]), float(row[metric])))
    return curves


def read_rows(path: pathlib.Path, labels: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{name: curves}`` (as :func:`read_curves`) for each row of ``path`` labelled one of ``labels``
    that keeps a curve; named ``ours``/``orig``, the device and the seed, or by the label where the row has no seed."""
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        points = row.get("evals", []) + row.get("train_every_5th_iteration", [])
        if row.get("label") not in labels or not points:
            continue
        who = "ours" if row.get("lib", "nnx_ppo") == "nnx_ppo" else "orig"
        device = str(row.get("device", "cpu")).split()[0]  # ("cpu (2 cores, ...)", "tpu-v5e")
        name = f"{who}_{device}_seed{row['seed']}" if "seed" in row else row["label"]
        found[name] = {metric: sorted((int(p["env_steps"]), float(p[metric])) for p in points if metric in p)
                       for metric, _ in PANELS}
    return found


def read_baselines(path: pathlib.Path) -> dict[str, dict]:
    """The latest ``baseline_*`` row of each kind (random and zero actions) in ``path``."""
    found = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("what", "").startswith("baseline_") and not row.get("sets"):
            found[row["what"].removeprefix("baseline_")] = row
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=pathlib.Path)
    parser.add_argument("--rows", nargs="+", default=[], metavar="LABEL",
                        help="also draw the curves kept in the --baselines file's rows with these labels")
    parser.add_argument("--log-steps", action="store_true", help="env steps on a log scale (runs of unlike length)")
    parser.add_argument("--baselines", type=pathlib.Path, default=HERE / "results" / "rodent.jsonl")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "rodent_learning.png")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {run.name: read_curves(run) for run in args.runs} | read_rows(args.baselines, args.rows)
    if not curves:
        parser.error("give run directories or --rows LABEL (none found)")
    baselines = read_baselines(args.baselines)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (metric, title) in zip(axes.flat, PANELS):
        for name, curve in curves.items():
            if curve[metric]:
                steps, values = zip(*curve[metric])
                ax.plot(steps, values, label=name, marker="o" if metric.startswith("eval") else None, ms=3)
        kind = "return" if metric.endswith("return") else "length"
        for which, style in (("random_actions", ":"), ("zero_actions", "--")):
            if which in baselines:
                ax.axhline(baselines[which][f"{kind}_mean"], color="grey", ls=style, label=which.replace("_", " "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("env steps")
        if args.log_steps:
            ax.set_xscale("log", nonpositive="mask")  # an evaluation at step 0 has no place on it
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda x, _: f"{x / 1e6:g}M" if x >= 1e6 else f"{x / 1e3:g}k"))
    for ax in (axes[0, 0], axes[1, 0]):  # runs without training rows (the original's) appear only below
        ax.legend(fontsize=7)
    fig.suptitle("rodent_imitation, intention-network presets, solo runs")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print("| run | env steps | " + " | ".join(f"{title}: first -> last" for _, title in PANELS) + " |")
    print("| --- | --- |" + " --- |" * len(PANELS))
    for name, curve in curves.items():
        steps = max((s for metric, _ in PANELS for s, _ in curve[metric]), default=0)
        cells = [f"{c[0][1]:.1f} -> {c[-1][1]:.1f}" if (c := curve[metric]) else "-" for metric, _ in PANELS]
        print(f"| {name} | {steps:,} | " + " | ".join(cells) + " |")
    for which, row in baselines.items():
        print(f"{which.replace('_', ' ')} ({row['episodes']} episodes): return {row['return_mean']} "
              f"± {row['return_std']}, length {row['length_mean']} ± {row['length_std']}")
    print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
