"""``replay_sequence`` (stateless stretches flat, stateful modules scanned,
recurrent input projections hoisted) equals the step-by-step replay, in value
and in gradient."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from nnx_ppo.algorithms.functional import NetworkFn
from nnx_ppo.networks import (
    GRU,
    LSTM,
    Concat,
    Dense,
    GaussianNoise,
    Normalizer,
    NormalTanhSampler,
    Parallel,
    PPOAdapter,
    Sequential,
)
from nnx_ppo.networks.types import replay_in_time, select_where

T, B = 6, 4


def network():
    rngs = nnx.Rngs(0)
    return Sequential([
        Normalizer(3),
        Parallel(a=Sequential([Dense(3, 5, rngs, activation=jnp.tanh), LSTM(5, 6, rngs, trainable_initial_state=True)]),
                 b=Sequential([GRU(3, 4, rngs), GaussianNoise(0.1, rngs, fresh_keys_on_reset=True)])),
        Concat(a=Dense(6, 4, rngs), b=Dense(4, 4, rngs)),
        PPOAdapter(action=Sequential([Dense(8, 2, rngs), NormalTanhSampler(rngs)]), value=Dense(8, 1, rngs)),
    ])


def rollout(net, xs, reset):
    """Step the network like the trainer: record carries (post-reset), extras
    and outputs, each stacked to ``[T, B, ...]``. The carries are what the
    trainer hands the replay (``Trajectory.stored_carry()``): a leaf whose
    reset value depends on the parameters only holds that value wherever the
    carry was not reset after step 0, so a replay that reads it elsewhere
    fails here as in training."""
    carry = net.initialize_state(B)
    carries, extras, outputs = [], [], []
    for t in range(T):
        if t > 0:
            carry = select_where(reset[t], net.reset_state(carry), carry)
        carries.append(carry)
        out = net(carry, xs[t])
        extras.append(out.rollout_extras)
        outputs.append(out.output)
        carry = out.next_state
    stack = lambda trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)
    view = NetworkFn.of(net)
    fresh = jax.tree.leaves(view.reset(carries[0])[0])
    read = reset.at[0].set(True)  # where the replay reads the stored carry
    leaves, treedef = jax.tree.flatten(stack(carries))
    leaves = [jax.vmap(select_where, in_axes=(0, 0, None))(read, x, f) if fixed else x
              for x, f, fixed in zip(leaves, fresh, view.fixed_resets(carries[0]))]
    return jax.tree.unflatten(treedef, leaves), stack(extras), stack(outputs)


def test_replay_sequence_equals_step_by_step_replay():
    net = network()
    xs = jax.random.normal(jax.random.key(1), (T, B, 3))
    reset = jnp.zeros((T, B), bool).at[2, 1].set(True).at[4, 0].set(True).at[4, 3].set(True)
    stored, extras, _ = rollout(net, xs, reset)
    start = jax.tree.map(lambda x: x[0], stored)
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)

    def loss(params, fast):
        m = nnx.merge(graphdef, params, rest)
        replay = m.replay_sequence if fast else (lambda *a: replay_in_time(m, *a))
        result = replay(start, xs, extras, reset, stored)
        out = result.output
        value = jnp.sum(out.loglikelihoods) + jnp.sum(out.value_estimates ** 2) + result.regularization_loss
        return value, out

    # compiled, as training runs it (op-by-op dispatch of this network took most of the test's time)
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (v_fast, out_fast), g_fast = value_and_grad(params, True)
    (v_slow, out_slow), g_slow = value_and_grad(params, False)
    np.testing.assert_allclose(np.asarray(out_fast.loglikelihoods), np.asarray(out_slow.loglikelihoods), atol=1e-5)
    np.testing.assert_allclose(np.asarray(out_fast.value_estimates), np.asarray(out_slow.value_estimates), atol=1e-5)
    np.testing.assert_allclose(float(v_fast), float(v_slow), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_slow)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # The trainable initial state of the LSTM gets a gradient through the resets.
    lstm_grads = [
        g for path, g in jax.tree_util.tree_leaves_with_path(g_fast) if "initial_h" in jax.tree_util.keystr(path)
    ]
    assert lstm_grads and float(jnp.max(jnp.abs(lstm_grads[0]))) > 0


def test_a_key_chain_replays_all_steps_at_once_as_step_by_step():
    """The stochastic layers and the bottleneck scan only their key chain and
    draw for all steps at once: the same draws, outputs, losses, metrics and
    gradients as the step-by-step replay, with resets (fresh keys or the kept
    chain) inside the stretch."""
    from nnx_ppo.networks import BernoulliGate, DropoutMask, VariationalBottleneck

    rngs = nnx.Rngs(3)
    modules = [GaussianNoise(0.3, rngs), GaussianNoise(0.3, rngs, fresh_keys_on_reset=True), DropoutMask(0.4, rngs),
               BernoulliGate(rngs, estimator="gumbel_straight_through", fresh_keys_on_reset=True),
               VariationalBottleneck(2, rngs, kl_weight=0.5), VariationalBottleneck(2, rngs, fresh_keys_on_reset=True)]
    reset = jnp.zeros((T, B), bool).at[2, 1].set(True).at[4, 0].set(True).at[4, 3].set(True)
    for module in modules:
        xs = jax.random.normal(jax.random.key(4), (T, B, 4))
        stored, extras, outputs = rollout(module, xs, reset)
        start = jax.tree.map(lambda x: x[0], stored)

        def loss(xs, fast, module=module, stored=stored, start=start):
            replay = module.replay_sequence if fast else (lambda *a: replay_in_time(module, *a))
            result = replay(start, xs, None, reset, stored)
            return jnp.sum(jnp.sin(result.output)) + result.regularization_loss, result

        (v_fast, fast), g_fast = jax.value_and_grad(loss, has_aux=True)(xs, True)
        (v_slow, slow), g_slow = jax.value_and_grad(loss, has_aux=True)(xs, False)
        name = type(module).__name__
        # (last-bit differences: the scan of the reference may fuse ``x + s * eps`` differently)
        np.testing.assert_allclose(np.asarray(fast.output), np.asarray(outputs), rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(np.asarray(fast.output), np.asarray(slow.output), rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_array_equal(jax.random.key_data(fast.carry), jax.random.key_data(slow.carry), err_msg=name)
        np.testing.assert_allclose(float(v_fast), float(v_slow), rtol=1e-6, err_msg=name)
        assert fast.metrics.keys() == slow.metrics.keys()
        for key in fast.metrics:
            np.testing.assert_allclose(float(fast.metrics[key]), float(slow.metrics[key]), rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(np.asarray(g_fast), np.asarray(g_slow), rtol=1e-6, atol=1e-7, err_msg=name)
        # Only the key chain loops over time: no scan carries the draws.
        scans = [eqn for eqn in jax.make_jaxpr(lambda xs: loss(xs, True)[0])(xs).jaxpr.eqns
                 if eqn.primitive.name == "scan"]
        assert len(scans) == 1 and not any(jnp.issubdtype(v.aval.dtype, jnp.floating) for v in scans[0].outvars)


def test_subclass_that_changes_call_falls_back_to_step_by_step():
    """A subclass overriding __call__ must not inherit a fast replay that
    skips its forward pass."""
    from nnx_ppo.networks.types import StatefulModuleOutput

    class Doubled(LSTM):
        def __call__(self, state, x, rollout_extras=None):
            out = super().__call__(state, x, rollout_extras)
            return StatefulModuleOutput(next_state=out.next_state, output=2.0 * out.output)

    class Shifted(Sequential):
        def __call__(self, state, x, rollout_extras=None):
            out = super().__call__(state, x, rollout_extras)
            return StatefulModuleOutput(next_state=out.next_state, output=out.output + 1.0,
                                        rollout_extras=out.rollout_extras)

    rngs = nnx.Rngs(0)
    for module in (Doubled(3, 4, rngs), Shifted([Dense(3, 4, rngs), LSTM(4, 4, rngs)])):
        xs = jax.random.normal(jax.random.key(2), (T, B, 3))
        reset = jnp.zeros((T, B), bool).at[3, 1].set(True)
        stored, extras, outputs = rollout(module, xs, reset)
        result = module.replay_sequence(jax.tree.map(lambda x: x[0], stored), xs, extras, reset, stored)
        np.testing.assert_allclose(np.asarray(result.output), np.asarray(outputs), atol=1e-6)


def test_unrolled_replay_equals_the_rolled_one_and_reaches_every_scan():
    """``PPOConfig.replay_unroll`` (through ``unrolled``) changes how the scans
    over time are compiled, not what they compute."""
    from nnx_ppo.networks.types import unrolled

    net = network()
    xs = jax.random.normal(jax.random.key(1), (T, B, 3))
    reset = jnp.zeros((T, B), bool).at[2, 1].set(True).at[4, 0].set(True)
    stored, extras, _ = rollout(net, xs, reset)
    start = jax.tree.map(lambda x: x[0], stored)
    graphdef, params, rest = nnx.split(net, nnx.Param, ...)

    def loss(params, unroll):
        with unrolled(unroll):
            out = nnx.merge(graphdef, params, rest).replay_sequence(start, xs, extras, reset, stored).output
        return jnp.sum(out.loglikelihoods) + jnp.sum(out.value_estimates ** 2)

    scans = [eqn.params["unroll"] for eqn in jax.make_jaxpr(lambda p: loss(p, T))(params).jaxpr.eqns
             if eqn.primitive.name == "scan"]
    # The LSTM's and the GRU's unroll; the noise module's key chain (splits only) stays a loop.
    assert sorted(scans) == [1, T, T]
    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    (v1, g1), (vt, gt) = value_and_grad(params, 1), value_and_grad(params, T)
    np.testing.assert_allclose(float(vt), float(v1), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(gt), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
