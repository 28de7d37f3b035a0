"""Population-based training against the fixed grid it starts from, at equal env steps.

Usage: python bench/pbt_vs_grid.py [ENV] [--reps 0 1 2 3 4] [--every N] [--episodes 128] [--out FILE]

For each repetition r, trains the same 8 configs of ENV's preset (default
gymnax:CartPole-v1; learning rate {1e-4, 3e-4, 1e-3, 3e-3} x clip range
{0.1, 0.3}) twice with seed r, each time as one population of 8 members
(``train_population``): once fixed (the grid) and once with PBT every N
iterations (default: a tenth of the run). Both use the same env steps (8
members x the preset's steps). Every member's final policy is then
evaluated on ``--episodes`` deterministic episodes; one JSON line per
repetition (grid median and best member, PBT median and best member, wall
seconds of each) is printed and appended to ``--out`` (default
bench/results/pbt.jsonl), and a summary over the repetitions closes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
from flax import nnx

from nnx_ppo.algorithms.evaluation import evaluate
from nnx_ppo.algorithms.population import PBTConfig, train_population
from nnx_ppo.presets import get_preset

HERE = Path(__file__).resolve().parent
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3)
CLIP_RANGES = (0.1, 0.3)


def finals(eval_env, network_spec, results, episodes: int, max_len: int, seed: int) -> list[float]:
    """Each member's final policy on ``episodes`` deterministic episodes."""
    out = []
    for result in results:
        network = network_spec.build(eval_env)
        nnx.update(network, result.state.params, result.state.rest)
        metrics = evaluate(eval_env, network, n_envs=episodes, max_episode_length=max_len, seed=1000 + seed)
        out.append(round(float(metrics["eval/episode_return"]), 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", nargs="?", default="gymnax:CartPole-v1")
    parser.add_argument("--reps", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--every", type=int, default=None, help="PBT interval in iterations")
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--out", default=str(HERE / "results" / "pbt.jsonl"))
    args = parser.parse_args()
    preset = get_preset(args.env)
    train_env, eval_env = preset.make_envs()
    base = preset.config
    configs = [dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, learning_rate=lr, clip_range=clip))
               for lr in LEARNING_RATES for clip in CLIP_RANGES]
    every = args.every or max(1, base.ppo.n_iterations // 10)
    spec = preset.network_spec()
    rows = []
    for rep in args.reps:
        row = {"env": args.env, "rep": rep, "members": len(configs), "pbt_every": every,
               "steps_per_member": base.ppo.n_iterations * base.ppo.steps_per_iteration, "episodes": args.episodes}
        for name, pbt in (("grid", None), ("pbt", PBTConfig(every_iterations=every, seed=rep))):
            t0 = time.perf_counter()
            results = train_population(train_env, lambda rngs: spec.build(eval_env, rngs), configs, [rep],
                                       pbt=pbt, eval_env=eval_env)
            row[f"{name}_wall_s"] = round(time.perf_counter() - t0, 1)
            values = finals(eval_env, spec, results, args.episodes, base.eval.max_episode_length, rep)
            row[f"{name}_finals"] = values
            row[f"{name}_median"] = float(np.median(values))
            row[f"{name}_best"] = float(np.max(values))
            if pbt is not None:
                row["pbt_final_learning_rates"] = [float(r.state.member.hyperparameters["learning_rate"])
                                                   for r in results]
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    summary = {"env": args.env, "reps": args.reps, "pbt_every": every,
               "pbt_best_beats_grid_median": sum(r["pbt_best"] > r["grid_median"] for r in rows),
               "pbt_median_beats_grid_median": sum(r["pbt_median"] > r["grid_median"] for r in rows),
               "pbt_best_beats_grid_best": sum(r["pbt_best"] > r["grid_best"] for r in rows),
               **{k: float(np.median([r[k] for r in rows])) for k in ("grid_median", "grid_best", "pbt_median",
                                                                       "pbt_best")}}
    print(json.dumps({"summary": summary}))
    with open(args.out, "a") as f:
        f.write(json.dumps({"summary": summary}) + "\n")


if __name__ == "__main__":
    main()
