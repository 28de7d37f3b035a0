"""How many evaluation episodes it takes to rank policies.

Usage: python bench/eval_spread.py [ENV] [SEED] [KEYS]   (default gymnax:CartPole-v1 0 20)

Trains ENV's preset for one seed, then evaluates the final policy with 16,
64, 128 and 256 episodes, KEYS times each with other reset keys. Prints one
JSON line per episode count: the mean return over the KEYS evaluations, the
spread of the evaluation's mean (its standard deviation across keys) and the
standard error the evaluation itself reports (episode std / sqrt(n)). Two
policies whose returns differ by less than about twice the spread cannot be
ranked by one evaluation of that size.
"""

import dataclasses
import json
import sys
import time

import numpy as np

from nnx_ppo.algorithms.evaluation import evaluate
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.presets import get_preset


def main(argv):
    name = argv[0] if argv else "gymnax:CartPole-v1"
    seed = int(argv[1]) if len(argv) > 1 else 0
    keys = int(argv[2]) if len(argv) > 2 else 20
    preset = get_preset(name)
    train_env, eval_env = preset.make_envs()
    network = preset.build_network(eval_env, seed=seed)
    config = preset.config
    t0 = time.perf_counter()
    result = train_ppo(train_env, network, dataclasses.replace(config, seed=seed), eval_env=eval_env)
    print(json.dumps({"env": name, "seed": seed, "train_s": round(time.perf_counter() - t0, 1),
                      "final_eval": result.eval_history[-1][1]["eval/episode_return"],
                      "eval_n_envs": config.eval.n_envs}))
    for n in (16, 64, 128, 256):
        runs = [evaluate(eval_env, network, n_envs=n, max_episode_length=config.eval.max_episode_length, seed=k)
                for k in range(keys)]
        means = np.array([r["eval/episode_return"] for r in runs])
        reported = np.array([r["eval/episode_return_std"] for r in runs]) / np.sqrt(n)
        print(json.dumps({"episodes": n, "mean": round(float(means.mean()), 2),
                          "spread_of_mean": round(float(means.std()), 2),
                          "reported_standard_error": round(float(reported.mean()), 2),
                          "min_mean": round(float(means.min()), 2), "max_mean": round(float(means.max()), 2)}))


if __name__ == "__main__":
    main(sys.argv[1:])
