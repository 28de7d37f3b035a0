"""The policy API: load, step (with resets as training does) and export."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.rollout import RolloutState, collect_rollout
from nnx_ppo.policy import Policy, load_exported
from tests.algorithms.test_replay_consistency import DictActionTarget, everything_network

N, T = 8, 30


def _rollout(env, net, deterministic, seed=0):
    """A training rollout of ``T`` steps of ``N`` envs (episodes end inside it),
    compiled as training compiles it (so ``net`` is left as it is)."""

    def run(view, key):
        carry, view = view.initialize(N)
        env_state = jax.vmap(env.reset)(jax.random.split(key, N))
        state = RolloutState(env_state=env_state, carry=carry, episode_return=jnp.zeros((N,)),
                             episode_length=jnp.zeros((N,), jnp.int32), fresh=jnp.ones((N,), bool))
        return collect_rollout(env, view, state, jax.random.fold_in(key, 1), T, True).trajectory

    return jax.jit(run)(NetworkFn.of(net, deterministic), jax.random.key(seed))


def _policy_actions(policy, traj):
    """Step ``policy`` on the rollout's observations, ``done`` where the
    rollout reset the carry (nothing at the first step)."""
    carry, actions = policy.initial_carry(N), []
    for t in range(T):
        action, carry = policy(carry, traj.obs[t], None if t == 0 else traj.reset[t])
        actions.append(action)
    return jax.tree.map(lambda *xs: np.stack(xs), *actions)


def _at_default_optimization(test_id: str) -> None:
    """Run one test of this file in a fresh process whose CPU code is
    generated at XLA's default level (the suite's conftest lowers it for
    speed; bit-for-bit claims are about what users compile)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_backend_optimization_level" not in f]
    env = {**os.environ, "XLA_FLAGS": " ".join([*flags, "--xla_backend_optimization_level=2"])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{test_id}"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("deterministic", [True, False])
def test_policy_acts_as_the_training_rollout(deterministic):
    """Every shipped module (LSTM, GRU, delays, noise with fresh keys on
    reset, bottlenecks, samplers): the policy's actions over episodes with
    resets are the rollout's, bit for bit, sampled ones included (compiled
    as users compile: in a process at XLA's default optimization level)."""
    if "xla_backend_optimization_level=0" in os.environ.get("XLA_FLAGS", ""):
        _at_default_optimization(f"test_policy_acts_as_the_training_rollout[{deterministic}]")
        return
    env = DictActionTarget(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    net = everything_network()
    traj = _rollout(env, net, deterministic)
    assert int(np.sum(traj.reset[1:])) > 5  # episodes end inside the rollout
    got = _policy_actions(Policy(net, deterministic), traj)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(traj.actions)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_without_resets_the_carry_runs_on():
    """Not resetting where an episode ended gives other actions: the reset is
    what makes the policy equal the rollout (the test above can fail)."""
    env = DictActionTarget(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    net = everything_network()
    traj = _rollout(env, net, True)
    policy, carry, diff = Policy(net), None, 0.0
    carry = policy.initial_carry(N)
    for t in range(T):
        action, carry = policy(carry, traj.obs[t])
        diff = max(diff, float(jnp.max(jnp.abs(action["plain"] - traj.actions["plain"][t]))))
    assert diff > 1e-3


def test_initial_carry_checks_n():
    with pytest.raises(ValueError, match="n must be a positive int"):
        Policy(everything_network()).initial_carry(0)


_NO_NNX_PPO = """
import sys
sys.modules["nnx_ppo"] = None  # importing it fails here
sys.modules["flax"] = None
import numpy as np
from jax import export
path, data = sys.argv[1], np.load(sys.argv[2])
step = export.deserialize(open(path + "/step.jax", "rb").read())
init = export.deserialize(open(path + "/initial_carry.jax", "rb").read())
stored = np.load(path + "/params.npz")
params = [stored[f"arr_{i}"] for i in range(len(stored.files))]
carry, out = init.call(params), {}
for t in range(data["obs"].shape[0]):
    action, carry = step.call(params, carry, data["obs"][t], data["done"][t])
    for k, v in action.items():
        out.setdefault(k, []).append(np.asarray(v))
np.savez(sys.argv[3], **{k: np.stack(v) for k, v in out.items()})
"""


def test_exported_policy_runs_without_nnx_ppo(tmp_path):
    """The exported step, loaded in a process where nnx_ppo and flax cannot
    be imported, gives the policy's actions over episodes with resets."""
    env = DictActionTarget(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    net = everything_network()
    traj = _rollout(env, net, True)
    policy = Policy(net)
    path = policy.export(tmp_path / "policy", traj.obs[0])
    want = _policy_actions(policy, traj)
    done = np.asarray(traj.reset).copy()
    done[0] = False
    np.savez(tmp_path / "in.npz", obs=np.asarray(traj.obs), done=done)
    env_vars = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", _NO_NNX_PPO, str(path), str(tmp_path / "in.npz"),
                    str(tmp_path / "out.npz")], check=True, cwd=tmp_path, env=env_vars, timeout=300)
    got = np.load(tmp_path / "out.npz")
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    loaded = load_exported(path)  # the same through nnx_ppo's reader
    action, _ = loaded.step(loaded.initial_carry(), traj.obs[0], done[0])
    np.testing.assert_array_equal(np.asarray(action["plain"]), want["plain"][0])
