"""Your own stateful module through the command line: check its replay,
train it on a memory task, evaluate the best policy, continue the run.

    python examples/custom_module_cli.py           # about 2 minutes on a laptop CPU

Each ``cli.main([...])`` is the shell command ``nnx-ppo ...`` with the same
arguments; ``--tiny`` (the test suite) trains a few iterations only.
"""

import sys
from pathlib import Path

from flax import nnx

import nnx_ppo
from nnx_ppo import cli
from nnx_ppo.network_spec import resolve_factory_reference

TINY = "--tiny" in sys.argv
NETWORK = f"{Path(__file__).resolve().parent / 'leaky_net.py'}:make_net"
STEPS = 512 if TINY else 150_000
SIZE = ["--ppo.n-envs", "8", "--ppo.n-minibatches", "2", "--eval.n-envs", "8"] if TINY else []

# 1. Before training: the replay guarantee (log-likelihoods and values of a
#    rollout with episode resets come back exactly when replayed in minibatches).
make_net = resolve_factory_reference(NETWORK)
env = nnx_ppo.make("cue_memory", n_cues=4, delay=8)
report = nnx_ppo.check_replay_consistency(make_net(env, nnx.Rngs(0)), env, n_envs=8, rollout_length=24)
print(report)
assert report.passed

# 2. Train (nnx-ppo train cue_memory --network examples/leaky_net.py:make_net ...),
#    evaluate the best policy kept, then continue the run for longer.
run = "runs/leaky"
assert cli.main(["train", "cue_memory", "--network", NETWORK, "--ppo.total-steps", str(STEPS), *SIZE,
                 "--eval.every-steps", str(STEPS // 4), "--run-dir", run, "--quiet"]) == 0
assert cli.main(["eval", run, "--best", "--episodes", "16" if TINY else "256"]) == 0
assert cli.main(["eval", run, "--list-modules"]) == 0       # the paths --record-activations takes
assert cli.main(["train", "--resume", run, "--ppo.total-steps", str(2 * STEPS), "--quiet"]) == 0
