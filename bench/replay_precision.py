"""Replay exactness under a matmul precision, on the peers' Pendulum networks.

Usage: python bench/replay_precision.py ARCH N_ENVS [PRECISION] [N_MINIBATCHES]

Runs ``nnx_ppo.testing.check_replay_consistency`` (one rollout of ``N_ENVS``
envs x 32 steps, replayed in 4 minibatches) for the MLP or LSTM network of
``bench_ppo.py`` with ``jax_default_matmul_precision`` set to PRECISION
("default", "high" or "highest"; TF32 on recent NVIDIA GPUs under
"default"), or the intention network at the rodent users' size on
``bench_intention.py``'s stand-in env (ARCH ``intention_mlp`` or
``intention_lstm``, 20 steps), or with the library's ``PPOConfig.precision="bfloat16"``
(PRECISION "bfloat16": bfloat16 matrix inputs, float32 sums), and prints
one JSON line with the largest log-likelihood and value differences and
the first module whose carry departs. With ``IN_TIME=1`` every module is
replayed by the reference ``replay_in_time`` (one step at a time, at the
minibatch's size), none by a faster ``replay_sequence``: whether the
replay's other shapes are what the chip's rounding follows. The
trainer stops above ``PPOConfig.replay_tolerance`` (1e-3).
"""

import json
import os
import sys

import jax
from bench_ppo import build_network
from flax import nnx

from nnx_ppo.envs import make
from nnx_ppo.testing import check_replay_consistency


def replay_every_module_in_time():
    """Route every module's replay through ``replay_in_time`` (an experiment, not an option)."""
    from nnx_ppo.networks import containers, recurrent, types

    for module in (containers, recurrent):
        module.has_fast_replay = lambda *args: False
    types.replay_flat = types.replay_in_time


def main(argv):
    in_time = os.environ.get("IN_TIME") == "1"
    if in_time:
        replay_every_module_in_time()
    arch, n_envs = argv[0], int(argv[1])
    precision = argv[2] if len(argv) > 2 else "default"
    if precision not in ("default", "bfloat16"):
        jax.config.update("jax_default_matmul_precision", precision)
    n_minibatches = int(argv[3]) if len(argv) > 3 else 4
    if arch.startswith("intention_"):
        from bench_intention import make_env

        from nnx_ppo.networks.factories import INTENTION_USERS_SIZE, make_intention_network
        env, rollout_length = make_env(), 20
        network = make_intention_network(env, nnx.Rngs(0), decoder=arch.removeprefix("intention_"),
                                         **INTENTION_USERS_SIZE)
    else:
        env, rollout_length = make("gymnax:Pendulum-v1", episode_length=20), 32  # resets inside the rollout
        network = build_network("gymnax:Pendulum-v1", arch, env, nnx.Rngs(0))
    report = check_replay_consistency(network, env, n_envs=n_envs, rollout_length=rollout_length,
                                      n_minibatches=n_minibatches,
                                      tolerance=1e-3, precision="bfloat16" if precision == "bfloat16" else "default")
    print(json.dumps({"arch": arch, "n_envs": n_envs, "precision": precision,
                      "device": jax.devices()[0].device_kind, "max_abs_log_ratio": report.max_abs_log_ratio,
                      "max_value_difference": report.max_value_difference, "passed_1e-3": report.passed,
                      "n_minibatches": n_minibatches, "in_time": in_time, "first_divergence": report.first_divergence}))


if __name__ == "__main__":
    main(sys.argv[1:])
