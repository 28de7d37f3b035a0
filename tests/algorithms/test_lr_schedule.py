"""A learning-rate schedule in PPOConfig: it reaches optax with the update
count, is validated, and survives checkpoints as a description. (Also the
optimizer settings the original nnx-ppo read differently.)"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from nnx_ppo.algorithms import checkpointing
from nnx_ppo.algorithms.config import (
    EvalConfig,
    PPOConfig,
    ScheduleNotSavedError,
    TrainConfig,
    config_from_dict,
    config_to_dict,
)
from nnx_ppo.algorithms.ppo import make_optimizer, new_training_state
from nnx_ppo.algorithms.trainer import resume_state, train_ppo
from nnx_ppo.networks.factories import make_mlp_actor_critic
from tests.algorithms.toy_envs import Target


def _updates(config, n):
    """Parameter changes of ``n`` eager updates with gradient 1."""
    optimizer = make_optimizer(config)
    params = {"w": jnp.zeros(3)}
    state = optimizer.init(params)
    changes = []
    for _ in range(n):
        updates, state = optimizer.update({"w": jnp.ones(3)}, state, params)
        changes.append(np.asarray(updates["w"]))
        params = optax.apply_updates(params, updates)
    return changes


def test_schedule_is_called_with_the_update_count():
    counts = []

    def schedule(count):
        counts.append(int(count))
        return jnp.where(count == 0, 1e-2, 0.0)

    base = dict(gradient_clipping=None, n_envs=4, n_minibatches=2)
    changes = _updates(PPOConfig(learning_rate=schedule, **base), 3)
    assert counts == [0, 1, 2]
    assert np.all(changes[0] != 0) and np.all(changes[1] == 0) and np.all(changes[2] == 0)
    constant = _updates(PPOConfig(learning_rate=lambda count: 1e-2, **base), 2)
    plain = _updates(PPOConfig(learning_rate=1e-2, **base), 2)
    np.testing.assert_array_equal(constant, plain)


def test_schedule_reaches_training_and_counts_minibatch_updates():
    env = Target()
    net = make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.state(net, nnx.Param))
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=32, n_epochs=2, n_minibatches=2,
                                       learning_rate=lambda count: 0.0 * count),
                         eval=EvalConfig(enabled=False))
    result = train_ppo(env, net, config)
    after = jax.tree.map(np.asarray, nnx.state(net, nnx.Param))
    jax.tree.map(np.testing.assert_array_equal, before, after)
    counts = [int(leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(result.state.opt_state)[0]
              if "count" in jax.tree_util.keystr(path)]
    assert counts and all(c == 2 * 2 * 2 for c in counts), counts  # iterations x epochs x minibatches


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf"), True, "3e-4", None])
def test_learning_rate_must_be_a_positive_number_or_a_schedule(bad):
    with pytest.raises(ValueError, match="PPOConfig.learning_rate must be a positive finite number or a schedule"):
        PPOConfig(learning_rate=bad)


def test_weight_decay_true_is_refused():
    """The original nnx-ppo read ``weight_decay=True`` as optax's default; as a number it would be 1.0."""
    with pytest.raises(ValueError, match="PPOConfig.weight_decay must be a number"):
        PPOConfig(weight_decay=True)


def test_decay_with_a_schedule_is_refused():
    with pytest.raises(ValueError, match="learning_rate_decay=True with a learning_rate schedule is ambiguous"):
        PPOConfig(learning_rate=optax.linear_schedule(1e-3, 0.0, 100), learning_rate_decay=True)


def test_config_with_a_schedule_saves_a_description_and_needs_the_schedule_to_load(tmp_path):
    schedule = optax.linear_schedule(1e-3, 0.0, 100)
    config = TrainConfig(ppo=PPOConfig(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=2,
                                       learning_rate=schedule),
                         eval=EvalConfig(enabled=False))
    data = json.loads(json.dumps(config_to_dict(config)))
    assert data["ppo"]["learning_rate"].startswith("<schedule optax.") and "0x" not in data["ppo"]["learning_rate"]
    with pytest.raises(ScheduleNotSavedError, match="pass it again as learning_rate="):
        config_from_dict(data)
    assert config_from_dict(data, learning_rate=schedule) == config

    state = new_training_state(Target(), make_mlp_actor_critic(3, 2, (8,), (8,), nnx.Rngs(0)), config)
    checkpointing.save_training_state(tmp_path, state, config, step=0)
    with pytest.raises(ScheduleNotSavedError):
        checkpointing.load_config(tmp_path)
    assert checkpointing.load_config(tmp_path, learning_rate=schedule) == config
    assert checkpointing.load_config(tmp_path, learning_rate=1e-3).ppo.learning_rate == 1e-3
    # Resuming (which reads the saved sizes) works with the schedule or with a plain rate.
    resume_state(str(tmp_path), None, state, config.ppo)
    resume_state(str(tmp_path), None, state, PPOConfig(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=2))
