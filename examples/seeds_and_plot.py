"""CartPole with two learning rates, three seeds each, compared: each setting is one seed
batch trained in one compiled program into its own run directory, then
``nnx-ppo plot`` draws both (mean and min-max band over seeds) and prints a
table (final, best, IQM over seeds, steps and seconds to a threshold).

    python examples/seeds_and_plot.py              # about 5 minutes on a laptop CPU
"""

import dataclasses
import sys

from nnx_ppo import cli
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.population import train_seeds

TINY = "--tiny" in sys.argv
STEPS = 512 if TINY else 200_000

base = TrainConfig(
    ppo=PPOConfig(n_envs=8, rollout_length=16 if TINY else 128, n_minibatches=2, total_steps=STEPS,
                  learning_rate_decay=True),
    eval=EvalConfig(every_steps=STEPS // 4, n_envs=16, max_episode_length=50 if TINY else 500),
)
for learning_rate in (1e-3, 3e-3):
    config = dataclasses.replace(base, ppo=dataclasses.replace(base.ppo, learning_rate=learning_rate))
    # The env by its spec and the network by name: the command line can read, evaluate and resume the run.
    results = train_seeds("gymnax:CartPole-v1", "mlp", config, seeds=[0, 1, 2], run_dir=f"runs/lr_{learning_rate:g}")
    print(learning_rate, [round(r.eval_history[-1][1]["eval/episode_return"], 3) for r in results])

# nnx-ppo plot runs/lr_0.001 runs/lr_0.003 --out compare.png --threshold 475
assert cli.main(["plot", "runs/lr_0.001", "runs/lr_0.003", "--out", "compare.png", "--threshold", "475"]) == 0
