"""How fast an LSTM layer's recurrence can run on this device, alone: a floor under the LSTM decoder's iteration.

Usage: python bench/recurrence_bound.py [--n-envs 1024 4096] [--iteration-gflop G G] [--stacked]

The intention network's LSTM decoder (``bench_intention.py --lstm-decoder``) has
``--layers`` LSTM layers of ``--hidden`` units. In each the product ``h W_h`` waits
for the step before it, so it runs as ``--rollout`` products of ``[M, H] @ [H, 4 H]``
one after another, never as one large product. This times that recurrence
alone (the product, the gates and the new carry, a ``lax.scan`` unrolled over
the rollout as the library's replay is on an accelerator; the inputs' part of
the gates given): forward and backward (gradients of the weights and of the
inputs' part) at the replay's minibatch of ``M = n_envs / minibatches`` envs,
``epochs x minibatches`` times one after the other in one program as in an
iteration, and forward alone at the rollout's ``n_envs`` (``--repeats``
times), each with float32 weights and with weights rounded to bfloat16
beforehand; and a large bfloat16 matrix product, the device's matrix rate.

With ``--stacked``, also the ``--layers`` layers stacked as in the decoder
(each layer's input product inside the step), float32 weights: whether the
stack runs its products faster than one layer alone, as the library's replay
suggests (bench/README.md, "Ninth sitting").

One JSON line per ``--n-envs``: the rates, the iteration's recurrent GFLOP
(the replay's forward and backward over ``epochs x minibatches`` steps, the
rollout's forward) and the time they take at the measured rates. With
``--iteration-gflop`` (the iteration's GFLOP, ``iteration_gflop`` of
``bench_intention.py``'s row, one per ``--n-envs``), also ``floor_ms``: the
recurrent work at one layer's rate plus the rest at the large product's
rate, with no time at all for anything else (data movement, the optimizer,
the env), and the env-steps/s it allows. It is a floor only if the layers'
recurrences cannot run any faster together than one runs alone. On a TPU
v5e they do: the library's replay did its work in less time than this sum
(bench/README.md, "Ninth sitting"), likely because layer l's step t
overlaps layer l-1's step t+1. So read the sum as what a strictly
sequential recurrence would cost, not as a bound.
"""

import argparse
import json

import jax
import jax.numpy as jnp
from batched_matmul import seconds_per_call  # (this folder: the script's own)

CALLS = 20  # timed calls of each program, after its compiling call


def recurrence(weight_dtype, hidden: int, rollout: int, repeats: int, layers: int = 1):
    """``(forward, forward_backward)`` (to be jitted): the LSTM recurrence over ``zx`` ``[T, M, 4 H]``
    (the first layer's inputs' part of the gates) with weights ``w`` ``[2 layers - 1, H, 4 H]``
    (each layer's recurrent weights, then the input weights of layers 2 on),
    ``repeats`` times in one program, each from the carry the last one left
    (so that launching the program is not timed with it, and no repeat can be
    hoisted out of the loop); ``forward_backward`` also takes the gradient of
    each repeat's output sum with respect to ``w`` and ``zx``, one repeat after
    the other as the replay's minibatch steps do, and sums them. With
    ``layers > 1`` the layers are stacked as in the LSTM decoder: at each
    step a layer's input is the output of the layer below at the same step,
    so layer l's step t does not wait for layer l-1's step t+1."""

    def one(w, zx, carry):
        """``(output sum, carry)`` of one rollout of the recurrence from ``carry``."""
        def step(carry, z_in):
            new, below = [], None
            for layer, (h, c) in enumerate(carry):
                z = z_in if layer == 0 else (below.astype(weight_dtype) @ w[layers + layer - 1]).astype(jnp.float32)
                z = z + (h.astype(weight_dtype) @ w[layer]).astype(jnp.float32)
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                below = jax.nn.sigmoid(o) * jnp.tanh(c)
                new.append((below, c))
            return tuple(new), below

        carry, hs = jax.lax.scan(step, carry, zx, unroll=rollout)
        return hs.sum(), carry

    def start(zx):
        zeros = jnp.zeros((zx.shape[1], hidden), jnp.float32)
        return tuple((zeros, zeros) for _ in range(layers))

    def forward(w, zx):
        def once(carry, _):
            total, carry = one(w, zx, carry)
            return carry, total

        return jax.lax.scan(once, start(zx), None, length=repeats)[1].sum()

    def forward_backward(w, zx):
        def once(state, _):
            carry, grads = state
            (_, carry), new = jax.value_and_grad(one, argnums=(0, 1), has_aux=True)(w, zx, carry)
            return (jax.lax.stop_gradient(carry), jax.tree.map(jnp.add, grads, new)), None

        grads = (jnp.zeros(w.shape, jnp.float32), jnp.zeros_like(zx))
        return jax.lax.scan(once, (start(zx), grads), None, length=repeats)[0][1]

    return forward, forward_backward


def rates(batch: int, hidden: int, rollout: int, repeats: int, backward: bool, layers: int = 1,
          dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> dict:
    """TFLOP/s of the recurrence's products at ``batch`` rows (``layers``
    stacked: ``2 layers - 1`` products a step): forward, and with
    ``backward`` forward + backward (3 times the forward's products); with
    weights of each of ``dtypes``."""
    flop = repeats * rollout * batch * (2 * layers - 1) * hidden * 4 * hidden * 2
    out = {}
    for name in dtypes:
        dtype = jnp.dtype(name)
        w = jax.random.normal(jax.random.key(0), (2 * layers - 1, hidden, 4 * hidden), jnp.float32).astype(dtype)
        zx = jax.random.normal(jax.random.key(1), (rollout, batch, 4 * hidden), jnp.float32)
        forward, forward_backward = recurrence(dtype, hidden, rollout, repeats, layers)
        out[name] = {"forward_tflops": flop / seconds_per_call(forward, w, zx, calls=CALLS) / 1e12}
        if backward:
            seconds = seconds_per_call(forward_backward, w, zx, calls=CALLS)
            out[name]["forward_backward_tflops"] = 3 * flop / seconds / 1e12
    return out


def matmul_tflops(size: int = 8192) -> float:
    """TFLOP/s of one ``[size, size] @ [size, size]`` bfloat16 product."""
    x = jnp.ones((size, size), jnp.bfloat16)
    return 2 * size ** 3 / seconds_per_call(lambda a: a @ a, x, calls=CALLS) / 1e12


def _rounded(rates_by_dtype: dict) -> dict:
    return {name: {key: round(value, 3) for key, value in r.items()} for name, r in rates_by_dtype.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-envs", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--iteration-gflop", type=float, nargs="+", default=None,
                        help="the iteration's GFLOP for each --n-envs (bench_intention.py's iteration_gflop)")
    parser.add_argument("--rollout", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=16,
                        help="rollouts timed in one program at n_envs (the replay's: epochs x minibatches)")
    parser.add_argument("--matmul-size", type=int, default=8192, help="size of the large bfloat16 product")
    parser.add_argument("--stacked", action="store_true",
                        help="also time the --layers layers stacked as in the decoder (float32 weights)")
    args = parser.parse_args(argv)
    if args.iteration_gflop is not None and len(args.iteration_gflop) != len(args.n_envs):
        parser.error(f"--iteration-gflop needs one value per --n-envs ({len(args.n_envs)}), "
                     f"got {len(args.iteration_gflop)}")
    large = matmul_tflops(args.matmul_size)
    for k, n_envs in enumerate(args.n_envs):
        if n_envs % args.minibatches:
            parser.error(f"--n-envs {n_envs} is not divisible by --minibatches {args.minibatches}")
        m = n_envs // args.minibatches
        replay = rates(m, args.hidden, args.rollout, args.epochs * args.minibatches, backward=True)
        rollout = rates(n_envs, args.hidden, args.rollout, args.repeats, backward=False)
        step_gflop = args.layers * args.rollout * args.hidden * 4 * args.hidden * 2 / 1e9  # per env
        replay_gflop = 3 * args.epochs * args.minibatches * m * step_gflop  # forward and backward
        rollout_gflop = n_envs * step_gflop
        recurrent_ms = (replay_gflop / replay["float32"]["forward_backward_tflops"]
                        + rollout_gflop / rollout["float32"]["forward_tflops"])  # GFLOP / TFLOP/s = ms
        recurrent_gflop = replay_gflop + rollout_gflop
        row = {"device": jax.devices()[0].device_kind, "n_envs": n_envs, "minibatch_envs": m,
               "rollout": args.rollout, "hidden": args.hidden, "layers": args.layers,
               "large_matmul_tflops": round(large, 3), "matmul_size": args.matmul_size,
               "replay_recurrence": _rounded(replay), "rollout_recurrence": _rounded(rollout),
               "recurrent_gflop": round(recurrent_gflop, 1), "recurrent_ms": round(recurrent_ms, 3)}
        if args.stacked:  # does the stack run faster than one layer? (bench/README.md, "Ninth sitting")
            stacked = {"replay": rates(m, args.hidden, args.rollout, args.epochs * args.minibatches, True,
                                       args.layers, ("float32",))["float32"],
                       "rollout": rates(n_envs, args.hidden, args.rollout, args.repeats, False,
                                        args.layers, ("float32",))["float32"]}
            row["stacked_recurrence"] = _rounded(stacked)
        if args.iteration_gflop is not None:
            floor_ms = recurrent_ms + (args.iteration_gflop[k] - recurrent_gflop) / large
            row.update(iteration_gflop=args.iteration_gflop[k], floor_ms=round(floor_ms, 3),
                       floor_sps=round(n_envs * args.rollout / floor_ms * 1e3))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
