"""The policy API: load, step (with resets as training does) and export."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.algorithms.ppo import RolloutState, collect_rollout
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput
from nnx_ppo.policy import ExportWarning, Policy, export_info, load_exported
from tests.algorithms.test_replay_consistency import DictActionTarget, everything_network
from tests.xla_flags import optimization_off, run_as_users_compile

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


def test_policy_acts_as_the_training_rollout():
    """Every shipped module (LSTM, GRU, delays, noise with fresh keys on
    reset, bottlenecks, samplers): the policy's actions over episodes with
    resets are the rollout's, bit for bit, sampled ones included, for a
    deterministic and a sampling policy (compiled as users compile: in a
    process at XLA's defaults)."""
    if optimization_off():
        run_as_users_compile(__file__, "test_policy_acts_as_the_training_rollout")
        return
    env = DictActionTarget(obs_size=3, action_size=2, max_steps=5, p_end=0.15)
    net = everything_network()
    for deterministic in (True, False):
        traj = _rollout(env, net, deterministic)
        assert int(np.sum(traj.reset[1:])) > 5  # episodes end inside the rollout
        got = _policy_actions(Policy(net, deterministic), traj)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(traj.actions)):
            np.testing.assert_array_equal(a, np.asarray(b), err_msg=f"deterministic={deterministic}")


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
carry, out = init.call(params, data["done"][0]), {}  # the carry of as many envs as done has
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


class _Leaky(StatefulModule):
    """h <- h / 2 + x: a carry the step and the reset handle for any batch size."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, state, x, rollout_extras=None):
        h = 0.5 * state + x
        return StatefulModuleOutput(next_state=h, output=jnp.tanh(h))

    def initialize_state(self, batch_size):
        return jnp.zeros((batch_size, self.size))

    def reset_state(self, prev_state):
        return jnp.zeros_like(prev_state)


class _NeedsANumber(_Leaky):
    """A reset that needs the batch size as a number (cannot be traced with a symbolic batch)."""

    def reset_state(self, prev_state):
        return jnp.zeros((int(prev_state.shape[0]), self.size))


def _leaky_network(env, core=_Leaky):
    """An actor-critic for ``env`` (cue_memory: a vector observation, discrete actions) around ``core``."""
    from flax import nnx

    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.feedforward import Dense
    from nnx_ppo.networks.sampling_layers import CategoricalSampler

    rngs = nnx.Rngs(0)
    n_obs, n_actions = env.observation_space.shape[0], env.action_space.n
    return Sequential([Dense(n_obs, 8, rngs, activation=jnp.tanh), core(8),
                       PPOAdapter(action=Sequential([Dense(8, n_actions, rngs), CategoricalSampler(rngs)]),
                                  value=Dense(8, 1, rngs))])


def _compare(policy, exported, env, n, steps=6):
    """``steps`` steps of ``n`` envs (an episode of env 0 ends at step 3): the
    exported step's actions are the policy's."""
    obs = jax.vmap(jax.vmap(env.reset))(jax.random.split(jax.random.key(n), (steps, n))).obs
    done = np.zeros((steps, n), bool)
    done[3, 0] = True
    carry, exported_carry = policy.initial_carry(n), exported.initial_carry(n)
    for t in range(steps):
        action, carry = policy(carry, obs[t], done[t])
        exported_action, exported_carry = exported.step(exported_carry, obs[t], done[t])
        np.testing.assert_array_equal(np.asarray(exported_action), np.asarray(action))


@pytest.mark.parametrize("deterministic", [True, False])
def test_export_without_an_example_serves_any_batch_size(deterministic, tmp_path):
    """Issue 34 (5): a policy that knows its env exports without an example
    observation; the one artifact's step, at batch 1 and at batch 5, acts as
    the policy (sampled actions included)."""
    import nnx_ppo

    env = nnx_ppo.make("cue_memory")
    policy = Policy(_leaky_network(env), deterministic, env=env)
    path = policy.export(tmp_path / "policy")
    assert export_info(path)["batch_size"] == "any"
    exported = load_exported(path)
    assert exported.any_batch_size and exported.batch_size == 1
    for n in (1, 5):
        _compare(policy, exported, env, n)


def test_a_network_that_needs_a_number_is_exported_for_one_batch_size(tmp_path):
    """A module that needs the batch size as a number: exported for
    ``batch_size`` envs, with a warning naming the module's method."""
    import nnx_ppo

    env = nnx_ppo.make("cue_memory")
    policy = Policy(_leaky_network(env, _NeedsANumber), env=env)
    with pytest.warns(ExportWarning, match="in reset_state, .*exported for batches of 2 only"):
        path = policy.export(tmp_path / "policy", batch_size=2)
    exported = load_exported(path)
    assert export_info(path)["batch_size"] == 2 and not exported.any_batch_size
    _compare(policy, exported, env, 2)
    with pytest.raises(ValueError, match="exported for batches of 2 envs only, got n=3"):
        exported.initial_carry(3)


def test_export_of_a_policy_without_an_env_asks_for_an_example(tmp_path):
    with pytest.raises(ValueError, match=r"does not know its env's observations .*policy.export\(path, obs\)"):
        Policy(everything_network()).export(tmp_path / "policy")
    assert not (tmp_path / "policy").exists()
