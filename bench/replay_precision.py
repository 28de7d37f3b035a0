"""Replay exactness under a matmul precision, on the peers' Pendulum networks.

Usage: python bench/replay_precision.py ARCH N_ENVS [PRECISION]

Runs ``nnx_ppo.testing.check_replay_consistency`` (one rollout of ``N_ENVS``
envs x 32 steps, replayed in 4 minibatches) for the MLP or LSTM network of
``bench_ppo.py`` with ``jax_default_matmul_precision`` set to PRECISION
("default", "high" or "highest"; TF32 on recent NVIDIA GPUs under
"default"), or with the library's ``PPOConfig.precision="bfloat16"``
(PRECISION "bfloat16": bfloat16 matrix inputs, float32 sums), and prints
one JSON line with the largest log-likelihood and value differences. The
trainer stops above ``PPOConfig.replay_tolerance`` (1e-3).
"""

import json
import sys

import jax
from bench_ppo import build_network
from flax import nnx

from nnx_ppo.envs import make
from nnx_ppo.testing import check_replay_consistency


def main(argv):
    arch, n_envs = argv[0], int(argv[1])
    precision = argv[2] if len(argv) > 2 else "default"
    if precision not in ("default", "bfloat16"):
        jax.config.update("jax_default_matmul_precision", precision)
    env = make("gymnax:Pendulum-v1", episode_length=20)  # resets inside the rollout
    network = build_network("gymnax:Pendulum-v1", arch, env, nnx.Rngs(0))
    report = check_replay_consistency(network, env, n_envs=n_envs, rollout_length=32, n_minibatches=4,
                                      tolerance=1e-3, precision="bfloat16" if precision == "bfloat16" else "default")
    print(json.dumps({"arch": arch, "n_envs": n_envs, "precision": precision,
                      "device": jax.devices()[0].device_kind, "max_abs_log_ratio": report.max_abs_log_ratio,
                      "max_value_difference": report.max_value_difference, "passed_1e-3": report.passed}))


if __name__ == "__main__":
    main(sys.argv[1:])
