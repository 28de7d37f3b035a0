"""Learning over seeds: nnx-ppo and its peers on the same work.

Usage:
    python bench/learning_curves.py run [--tasks T ...] [--libs L ...] [--seeds S ...]
                                        [--out FILE] [--label NAME] [--set KEY=JSON ...] [--task KEY=JSON ...]
    python bench/learning_curves.py report [--out FILE] [--plots DIR] [--threshold X]
                                           [--together TASK ...]

``run`` trains every (library, task, seed) in its own process, one after
another (so wall times are comparable), and appends one JSON line per run to
``--out`` (default ``bench/results/learning.jsonl``); runs already in the
file (same label, task and seed) are skipped, so an interrupted benchmark
continues where it stopped (the file is read before each run, so a run
another runner has finished is skipped too). ``report`` prints, per task and library, the
final deterministic evaluation return as median and interquartile mean (IQM)
with a bootstrap 95% interval over seeds, the area under the learning curve,
the wall-clock seconds (compile included) until the evaluation return first
reaches the task's threshold, and the stability after that first success;
and it draws one PNG per task (mean curve and 95% band of every library).

Libraries: ``nnx_ppo`` (this package, its defaults plus the task's
hyperparameters), ``original`` (nnx-ppo 0.3.0 from PyPI) and ``brax``
(Brax PPO, the MLP tasks of Pendulum and CheetahRun), the peers run with
``/tmp/peers-venv/bin/python`` (``../shared/peers/setup.sh``). ``--set``
overrides a field of our ``TrainConfig`` (``--set ppo.gradient_clipping=null``)
or passes a keyword to ``make`` for our training env
(``--set train_env.random_reset_steps=500``), and ``--label`` names such a
variant in the results. ``--task`` changes the work itself, for every
library (``--task total=2000000 eval_every=500000``: a shorter run); such
rows record it under ``task_overrides`` (keep them in their own ``--out``).

Tasks (the peers' benchmark work: 4 epochs x 4 minibatches, Adam 3e-4,
gamma 0.99, lambda 0.95, entropy weight 0.01):

- ``pendulum_mlp``: gymnax Pendulum-v1, MLP 64-64, 256 envs x 32 steps, 3M steps, rewards x 0.1.
- ``pendulum_lstm``: the same with Dense(64) -> LSTM(64), 1M steps.
- ``balance``: Playground CartpoleBalance, MLP (4x64 actor, 2x256 critic), 256 x 30, 1M steps.
- ``cheetah_mlp`` / ``cheetah_lstm``: Playground CheetahRun, the same MLP or Dense(64) -> LSTM(64),
  256 x 30, 10M steps, discount 0.995, resets from a pool of 1024 initial states (CheetahRun's reset
  runs 200 physics steps; Brax's auto-reset reuses each env's first state) (Brax:
  ``peers/brax_playground_run.py``, MLP only). Ours runs the CheetahRun presets of
  :mod:`nnx_ppo.presets`, which are this work (checked when it starts).
- ``preset:ENV:NETWORK``: a tuned preset of :mod:`nnx_ppo.presets` (this
  library only), trained as ``nnx-ppo train ENV`` does; its threshold is the
  preset's target.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = os.environ.get("PEERS_PYTHON", "/tmp/peers-venv/bin/python")

TASKS = {
    "pendulum_mlp": dict(env="gymnax:Pendulum-v1", arch="mlp", n_envs=256, rollout=32, total=3_000_000,
                         reward_scale=0.1, eval_every=150_000, eval_envs=64, eval_len=200, threshold=-250.0),
    "pendulum_lstm": dict(env="gymnax:Pendulum-v1", arch="lstm", n_envs=256, rollout=32, total=1_000_000,
                          reward_scale=0.1, eval_every=100_000, eval_envs=64, eval_len=200, threshold=-250.0),
    "balance": dict(env="playground:CartpoleBalance", arch="mlp", n_envs=256, rollout=30, total=1_000_000,
                    reward_scale=1.0, eval_every=100_000, eval_envs=32, eval_len=1000, threshold=900.0),
    # Locomotion (issue 23 point 4): Playground CheetahRun, 256 envs x 30 steps, 10M steps.
    # Ours trains the CheetahRun presets of nnx_ppo.presets, which are this work.
    "cheetah_mlp": dict(env="playground:CheetahRun", arch="mlp", n_envs=256, rollout=30, total=10_000_000,
                        discount=0.995, reward_scale=1.0, eval_every=1_000_000, eval_envs=32, eval_len=1000,
                        threshold=300.0, reset_pool=1024, preset=["playground:CheetahRun", "mlp"]),
    "cheetah_lstm": dict(env="playground:CheetahRun", arch="lstm", n_envs=256, rollout=30, total=10_000_000,
                         discount=0.995, reward_scale=1.0, eval_every=1_000_000, eval_envs=32, eval_len=1000,
                         threshold=300.0, reset_pool=1024, preset=["playground:CheetahRun", "lstm"]),
}
LIBS = ("nnx_ppo", "original", "brax")
BRAX_TASKS = ("pendulum_mlp", "cheetah_mlp")  # Brax PPO has no recurrent policy


def _preset_tasks() -> dict:
    """One task per tuned preset (this library only), named ``preset:ENV:NETWORK``."""
    try:
        from nnx_ppo.presets import PRESETS
    except ImportError:  # an older nnx_ppo on PYTHONPATH (A/B runs against a previous commit)
        return {}

    return {
        f"preset:{p.env}:{p.network}": dict(preset=[p.env, p.network], total=p.config.ppo.total_steps,
                                            threshold=p.target)
        for p in PRESETS
    }


TASKS.update(_preset_tasks())


# ----------------------------------------------------------------------------- one run (our library)


def _parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = json.loads(value)
    return out


def _apply_sets(config, sets: dict):
    import dataclasses

    for key, value in sets.items():
        head, _, field = key.rpartition(".")
        if head:
            sub = getattr(config, head)
            config = dataclasses.replace(config, **{head: dataclasses.replace(sub, **{field: value})})
        else:
            config = dataclasses.replace(config, **{field: value})
    return config


def run_ours(task: dict, seed: int, sets: dict) -> dict:
    """Train this library on ``task`` with ``seed``; evaluations with wall times."""
    if "preset" in task:
        return run_preset(task, seed, sets)
    sys.path.insert(0, str(HERE))
    from bench_ppo import build_network
    from flax import nnx

    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
    from nnx_ppo.envs import make
    from nnx_ppo.envs.wrappers import RewardScale

    env_kwargs = {k.split(".", 1)[1]: v for k, v in sets.items() if k.startswith("train_env.")}
    sets = {k: v for k, v in sets.items() if not k.startswith("train_env.")}
    eval_env = make(task["env"])
    if task["env"].startswith("playground:"):
        # Playground training episodes start at a random step of the time limit at every reset,
        # as the original's episode wrapper does (eval episodes stay full length).
        env_kwargs = {"random_initial_steps": True, "random_reset_steps": task["eval_len"] // 2,
                      **({"reset_pool": task["reset_pool"]} if "reset_pool" in task else {}), **env_kwargs}
    train_env = make(task["env"], **env_kwargs) if env_kwargs else eval_env
    if task["reward_scale"] != 1.0:
        train_env = RewardScale(train_env, task["reward_scale"])
    net = build_network(task["env"], task["arch"], eval_env, nnx.Rngs(seed))
    config = TrainConfig(
        ppo=PPOConfig(n_envs=task["n_envs"], rollout_length=task["rollout"], total_steps=task["total"],
                      learning_rate=3e-4, discounting_factor=task.get("discount", 0.99)),
        eval=EvalConfig(every_steps=task["eval_every"], n_envs=task["eval_envs"], max_episode_length=task["eval_len"]),
        seed=seed,
    )
    return _timed_training(train_env, net, _apply_sets(config, sets), eval_env)


def _timed_training(train_env, network, config, eval_env, final_episodes: int = 0, seed: int = 0) -> dict:
    """``train_ppo`` with every evaluation recorded as ``[env steps, return,
    wall seconds since the start]`` (compilation included). With
    ``final_episodes``, the final policy is then evaluated on that many fresh
    deterministic episodes (``final_return``, ``final_min``; not in ``wall_s``)."""
    from nnx_ppo.algorithms.evaluation import evaluate
    from nnx_ppo.algorithms.trainer import train_ppo

    evals = []
    t0 = time.perf_counter()

    def log_fn(metrics, steps):
        if "eval/episode_return" in metrics:
            evals.append([steps, metrics["eval/episode_return"], time.perf_counter() - t0])

    result = train_ppo(train_env, network, config, log_fn=log_fn, eval_env=eval_env)
    row = {"evals": evals, "wall_s": time.perf_counter() - t0}
    if final_episodes:
        metrics = evaluate(eval_env, result.network, n_envs=final_episodes,
                           max_episode_length=config.eval.max_episode_length, seed=1000 + seed)
        row.update(final_episodes=final_episodes, final_return=round(metrics["eval/episode_return"], 3),
                   final_min=round(metrics["eval/episode_return_min"], 3))
    return row


def run_preset(task: dict, seed: int, sets: dict) -> dict:
    """Train a tuned preset (as ``nnx-ppo train ENV`` does) with ``seed``,
    for the task's ``total`` steps with an evaluation every ``eval_every``
    (where the task gives them). A task that also states the work (envs,
    rollout, discount: a peer runs it too) must be the preset's work."""
    import dataclasses

    from nnx_ppo.presets import get_preset

    preset = get_preset(*task["preset"])
    ppo, evaluation = preset.config.ppo, preset.config.eval
    stated = {"n_envs": ppo.n_envs, "rollout": ppo.rollout_length, "discount": ppo.discounting_factor,
              "eval_len": evaluation.max_episode_length, "eval_envs": evaluation.n_envs,
              "reward_scale": preset.config.ppo.reward_scale, "reset_pool": preset.train_env_kwargs.get("reset_pool")}
    differ = {k: (task[k], v) for k, v in stated.items() if k in task and task[k] != v}
    if differ:
        raise ValueError(f"task {task['preset']} is not its preset's work (task, preset): {differ}")
    train_env, eval_env = preset.make_envs()
    network = preset.build_network(eval_env, seed)
    config = dataclasses.replace(
        preset.config, seed=seed, checkpoint_every_steps=None,
        ppo=dataclasses.replace(ppo, total_steps=task.get("total", ppo.total_steps)),
        eval=dataclasses.replace(evaluation, every_steps=task.get("eval_every", evaluation.every_steps)))
    config = _apply_sets(config, sets)
    # the policy a user gets, on as many episodes as bench/final_policy.py uses
    return _timed_training(train_env, network, config, eval_env, final_episodes=128, seed=seed)


# ----------------------------------------------------------------------------- driver


def _command(lib: str, task: dict, seed: int, sets: dict) -> list[str]:
    if lib == "nnx_ppo":
        return [sys.executable, str(Path(__file__).resolve()), "_one", json.dumps(task), str(seed), json.dumps(sets)]
    script = f"{lib}_playground_run.py" if lib == "brax" and task.get("env", "").startswith(
        "playground:") else f"{lib}_run.py"
    return [PEERS_PYTHON, str(HERE / "peers" / script), json.dumps(task), str(seed)]


def _done(out: Path) -> set[tuple[str, str, int]]:
    if not out.exists():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["label"], r["task"], r["seed"]) for r in rows}


def cmd_run(args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sets = _parse_sets(args.set)
    task_overrides = _parse_sets(args.task)
    for task_name in args.tasks:
        for lib in args.libs:
            if (lib == "brax" and task_name not in BRAX_TASKS) or (
                    lib != "nnx_ppo" and task_name.startswith("preset:")):
                continue
            label = args.label if (lib == "nnx_ppo" and args.label) else lib
            for seed in args.seeds:
                if (label, task_name, seed) in _done(out):  # read each time: another runner may have added it
                    continue
                t0 = time.perf_counter()
                env = dict(os.environ)
                if lib != "nnx_ppo":  # the peers' own nnx_ppo, never one put on PYTHONPATH for A/B runs
                    env.pop("PYTHONPATH", None)
                task = {**TASKS[task_name], **task_overrides}
                proc = subprocess.run(_command(lib, task, seed, sets), capture_output=True, text=True, env=env)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    print(f"FAILED {label} {task_name} seed {seed}:\n{proc.stderr[-3000:]}", file=sys.stderr)
                    continue
                row = {"label": label, "lib": lib, "task": task_name, "seed": seed, "sets": sets,
                       **({"task_overrides": task_overrides} if task_overrides else {}),
                       **json.loads(lines[-1]), "process_s": round(time.perf_counter() - t0, 1)}
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                final = row["evals"][-1][1] if row["evals"] else float("nan")
                print(f"{label:>12} {task_name:>14} seed {seed}: final {final:9.2f}  wall {row['wall_s']:.0f} s",
                      flush=True)


# ----------------------------------------------------------------------------- statistics


def area_under_curve(evals, total_steps: int) -> float:
    """Mean evaluation return over training: the trapezoid area under the
    (steps, return) curve divided by the steps it spans."""
    import numpy as np

    steps = np.asarray([e[0] for e in evals], float)
    rets = np.asarray([e[1] for e in evals], float)
    if len(steps) < 2:
        return float(rets[-1])
    return float(np.trapezoid(rets, steps) / (steps[-1] - steps[0]))


def first_success(evals, threshold: float):
    """``(steps, wall seconds)`` of the first evaluation at or above ``threshold``, or ``None``."""
    for steps, ret, wall in evals:
        if ret >= threshold:
            return steps, wall
    return None


def stability(evals, threshold: float):
    """Fraction of evaluations after the first success that stay within 10%
    of the threshold (``>= threshold - 0.1 |threshold|``); ``None`` if never reached."""
    hit = next((i for i, e in enumerate(evals) if e[1] >= threshold), None)
    if hit is None:
        return None
    later = evals[hit:]
    floor = threshold - 0.1 * abs(threshold)
    return sum(e[1] >= floor for e in later) / len(later)


def summarize(rows: list[dict], task: dict) -> dict:
    """Statistics over the seeds of one (task, label)."""
    import numpy as np

    from nnx_ppo._app.plot import bootstrap_interval, interquartile_mean

    finals = [r["evals"][-1][1] for r in rows]
    aucs = [area_under_curve(r["evals"], task["total"]) for r in rows]
    hits = [first_success(r["evals"], task["threshold"]) for r in rows]
    stab = [s for s in (stability(r["evals"], task["threshold"]) for r in rows) if s is not None]
    walls = [h[1] for h in hits if h is not None]
    return {
        "seeds": len(rows),
        "final_median": float(np.median(finals)),
        "final_iqm": interquartile_mean(finals),
        "final_iqm_ci": bootstrap_interval(finals, interquartile_mean),
        "final_min": float(np.min(finals)),
        "auc_median": float(np.median(aucs)),
        "auc_iqm": interquartile_mean(aucs),
        "reached": f"{len(walls)}/{len(rows)}",
        "seconds_to_threshold_median": float(np.median(walls)) if len(walls) * 2 > len(rows) else None,
        "seconds_to_threshold": sorted(walls),
        "stability": float(np.mean(stab)) if stab else None,
        "wall_s_median": float(np.median([r["wall_s"] for r in rows])),
        # the final policy on many fresh episodes (preset runs record it; see _timed_training)
        "final_many": [r["final_return"] for r in rows if "final_return" in r],
    }


def cmd_report(args) -> None:
    import numpy as np

    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    if args.seeds is not None:
        rows = [r for r in rows if r["seed"] in args.seeds]
    plots = Path(args.plots)
    plots.mkdir(parents=True, exist_ok=True)
    print("| task | library | seeds | final median | final IQM [95% CI] | worst | AUC median | reached | "
          "s to threshold: median (each seed that reached it) | stable after | wall s | "
          "final policy, 128 episodes: median (worst) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    together: dict[str, list[dict]] = {}
    for task_name, task in TASKS.items():
        by_label: dict[str, list[dict]] = {}
        for r in rows:
            if r["task"] == task_name:
                by_label.setdefault(r["label"], []).append(r)
        if not by_label:
            continue
        if args.threshold is not None:
            task = {**task, "threshold": args.threshold}
        for label, group in by_label.items():
            s = summarize(group, task)
            lo, hi = s["final_iqm_ci"]
            t = s["seconds_to_threshold_median"]
            times = ", ".join(f"{w:.0f}" for w in s["seconds_to_threshold"])
            st = s["stability"]
            many = s["final_many"]
            print(f"| {task_name} | {label} | {s['seeds']} | {s['final_median']:.1f} | {s['final_iqm']:.1f} "
                  f"[{lo:.1f}, {hi:.1f}] | {s['final_min']:.1f} | {s['auc_median']:.1f} | {s['reached']} | "
                  f"{'-' if t is None else f'{t:.0f}'}{f' ({times})' if times else ''} | "
                  f"{'-' if st is None else f'{100 * st:.0f}%'} | "
                  f"{s['wall_s_median']:.0f} | "
                  f"{f'{np.median(many):.1f} ({min(many):.1f})' if many else '-'} |")
            if task_name in args.together:
                together[f"{label}, {task_name}"] = group
        plot_task(task_name, task, by_label, plots / f"{task_name.replace(':', '_')}.png")
    if together:
        name = "_".join(t.replace(":", "_") for t in args.together)
        plot_task(" + ".join(args.together), TASKS[args.together[0]], together, plots / f"{name}.png")


def plot_task(task_name: str, task: dict, by_label: dict, path: Path) -> None:
    """Mean evaluation return per library with a 95% bootstrap band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from nnx_ppo._app.plot import bootstrap_interval

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, group in by_label.items():
        grid = np.asarray([e[0] for e in group[0]["evals"]], float)
        curves = np.stack([np.interp(grid, [e[0] for e in r["evals"]], [e[1] for e in r["evals"]]) for r in group])
        mean = curves.mean(axis=0)
        band = np.array([bootstrap_interval(curves[:, i], np.mean, 500) for i in range(len(grid))])
        ax.plot(grid, mean, label=f"{label} ({len(group)} seeds)")
        ax.fill_between(grid, band[:, 0], band[:, 1], alpha=0.2)
    ax.axhline(task["threshold"], color="gray", linestyle="--", linewidth=0.8, label="threshold")
    ax.set_xlabel("env steps")
    ax.set_ylabel("deterministic eval return")
    ax.set_title(task_name)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "_one":  # internal: one run of this library, printed as JSON
        print(json.dumps(run_ours(json.loads(argv[1]), int(argv[2]), json.loads(argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    run.add_argument("--libs", nargs="+", default=["nnx_ppo", "original"], choices=LIBS)
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    run.add_argument("--label", default=None)
    run.add_argument("--set", nargs="*", default=[])
    run.add_argument("--task", nargs="*", default=[], help="KEY=JSON: changes a field of the task, for every library")
    report = sub.add_parser("report")
    for p in (run, report):
        p.add_argument("--out", default=str(HERE / "results" / "learning.jsonl"))
    report.add_argument("--plots", default=str(HERE / "results"))
    report.add_argument("--threshold", type=float, default=None, help="replaces every task's threshold")
    report.add_argument("--together", nargs="*", default=[], choices=list(TASKS),
                        help="also draw these tasks' curves in one PNG (same env; the first task's threshold)")
    report.add_argument("--seeds", nargs="+", type=int, default=None,
                        help="only these seeds' rows (e.g. the seeds every library ran)")
    args = parser.parse_args(argv)
    cmd_run(args) if args.command == "run" else cmd_report(args)


if __name__ == "__main__":
    main(sys.argv[1:])
