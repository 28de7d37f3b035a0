"""A module with a carry that breaks the randomness rule is named, by class
and path in the network, by the trainer and by ``check_replay_consistency``
(as a module without carry already was); one that keeps the rule passes."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.algorithms.functional import ReplayMismatchError
from nnx_ppo.algorithms.trainer import train_ppo
from nnx_ppo.networks import Dense, NormalTanhSampler, PPOAdapter, Sequential
from nnx_ppo.networks.types import StatefulModule, StatefulModuleOutput, split_key_carry
from nnx_ppo.testing import check_replay_consistency
from tests.algorithms.toy_envs import Target

_TINY = TrainConfig(ppo=PPOConfig(n_envs=8, rollout_length=8, n_minibatches=4, total_steps=64),
                    eval=EvalConfig(enabled=False))
_CHECK = dict(n_envs=8, rollout_length=8, n_minibatches=4)


class NoisyCell(StatefulModule):
    """A leaky recurrent cell whose noise comes from a class-level nnx.Rngs
    drawn inside __call__: breaks the rule, and has a carry."""

    def __init__(self, size, rngs):
        self.size = size
        self.rngs = rngs

    def initialize_state(self, batch_size):
        return {"h": jnp.zeros((batch_size, self.size))}

    def __call__(self, state, x, rollout_extras=None):
        h = jnp.tanh(0.5 * state["h"] + x + 0.1 * jax.random.normal(self.rngs.noise(), x.shape))
        return StatefulModuleOutput(next_state={"h": h}, output=h)


class KeyedNoisyCell(NoisyCell):
    """The same cell keeping the rule: one key per env in the carry."""

    def initialize_state(self, batch_size):
        return {"h": jnp.zeros((batch_size, self.size)), "key": jax.random.split(self.rngs.noise(), batch_size)}

    def __call__(self, state, x, rollout_extras=None):
        next_key, key = split_key_carry("KeyedNoisyCell", state["key"], x.shape[0], "state['key']")
        noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(key)
        h = jnp.tanh(0.5 * state["h"] + x + 0.1 * noise)
        return StatefulModuleOutput(next_state={"h": h, "key": next_key}, output=h)


class CoupledKeyCell(KeyedNoisyCell):
    """Keys in the carry, but the next keys are all split from env 0's key:
    the carry couples the envs, so a minibatch replay cannot reproduce it."""

    def __call__(self, state, x, rollout_extras=None):
        out = super().__call__(state, x, rollout_extras)
        coupled = jax.random.split(state["key"][0], x.shape[0])
        return out.replace(next_state={**out.next_state, "key": coupled})


def _net(cell_cls):
    """One ``nnx.Rngs`` passed to every layer (as users do): the cell sits in
    the value branch, after the action sampler that holds the same Rngs."""
    rngs = nnx.Rngs(0)
    return Sequential([
        Dense(3, 8, rngs),
        PPOAdapter(action=Sequential([Dense(8, 4, rngs), NormalTanhSampler(rngs)]),
                   value=Sequential([cell_cls(8, rngs), Dense(8, 1, rngs)])),
    ])


_NAMED = r"module layers/1/components/value/layers/0 \(NoisyCell\) mutates an NNX variable \(rngs/.*docs/custom_modules"


def test_trainer_names_a_rule_breaking_module_with_a_carry():
    with pytest.raises(ReplayMismatchError, match=_NAMED):
        train_ppo(Target(max_steps=5), _net(NoisyCell), _TINY)


def test_replay_check_names_a_rule_breaking_module_with_a_carry():
    with pytest.raises(ReplayMismatchError, match=_NAMED):
        check_replay_consistency(_net(NoisyCell), Target(max_steps=5), **_CHECK)


def test_a_carry_module_that_keeps_the_rule_passes():
    report = check_replay_consistency(_net(KeyedNoisyCell), Target(max_steps=5), **_CHECK)
    assert report.passed and report.n_resets > 0, str(report)


def test_replay_check_names_the_module_whose_carry_departs():
    """No variable is written, so only the replayed carry shows the break:
    the report names the carry leaf and the module that owns it."""
    report = check_replay_consistency(_net(CoupledKeyCell), Target(max_steps=5), **_CHECK)
    assert not report.passed
    assert "carry leaf [1]['value'][0]['key'] of module layers/1/components/value/layers/0 (CoupledKeyCell)" \
        in report.first_divergence, report.first_divergence


def test_trainer_names_the_module_whose_carry_departs():
    """The same break met in training: the trainer's ReplayMismatchError names
    the carry leaf and the module that owns it, not only the mismatch."""
    with pytest.raises(ReplayMismatchError, match=r"First divergence: step \d+, carry leaf \[1\]\['value'\]\[0\]"
                                                  r"\['key'\] of module layers/1/components/value/layers/0 "
                                                  r"\(CoupledKeyCell\)"):
        train_ppo(Target(max_steps=5), _net(CoupledKeyCell), _TINY)
