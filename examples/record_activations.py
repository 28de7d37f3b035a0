"""Record what a trained LSTM does: the hidden and cell state of every env
at every step, with the episode boundaries, saved as plain NumPy arrays.

    python examples/record_activations.py          # about a minute on a laptop CPU
"""

import sys

import numpy as np

import nnx_ppo
from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.evaluation import Recording, module_paths, record_activations
from nnx_ppo.algorithms.trainer import train_ppo

TINY = "--tiny" in sys.argv
STEPS = 512 if TINY else 100_000

env = nnx_ppo.make("cue_memory", n_cues=4, delay=8)
config = TrainConfig(ppo=PPOConfig(n_envs=8 if TINY else 64, rollout_length=24, n_minibatches=2, total_steps=STEPS),
                     eval=EvalConfig(every_steps=STEPS // 2, n_envs=16, max_episode_length=20))
network = train_ppo(env, "lstm", config, run_dir="runs/memory").network      # the trained LSTM

print("\n".join(module_paths(network)))             # the paths of its modules
lstm = "layers/1/components/action/layers/1"
rec = record_activations(env, network, [lstm], n_envs=8, n_steps=60)
print(rec.activations[lstm].shape, rec.carries[lstm][1].shape)   # [T, B, units] each

# Mean hidden state at each step of an episode (0 = the cue is shown).
step_in_episode = np.zeros_like(rec.done, dtype=int)
for t in range(1, rec.done.shape[0]):
    step_in_episode[t] = np.where(rec.episode_start[t], 0, step_in_episode[t - 1] + 1)
profile = np.stack([rec.activations[lstm][step_in_episode == s].mean(axis=0) for s in range(5)])
print("mean |h| by step of the episode:", np.abs(profile).mean(axis=1).round(3))

rec.save("memory_lstm.npz")                          # np.load("memory_lstm.npz")["activations/" + lstm]
assert np.array_equal(Recording.load("memory_lstm.npz").activations[lstm], rec.activations[lstm])
# The same from the command line: nnx-ppo eval runs/memory --record-activations LAYER --out FILE.npz
