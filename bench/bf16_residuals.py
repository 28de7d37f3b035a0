"""Experiment for the chip: each Dense layer keeps the input of its weight gradient in bfloat16.

Issue 51, the MLP decoder at 4096 envs (and the LSTM decoder's cells): the replay's products of ``[20480,
512]`` float32 activations with ``[512, 512]`` weights read 4 bytes per
activation, so on a TPU v5e they are bound by main memory rather than by the
matrix units (about 128 FLOPs per byte read against the chip's 227). At
JAX's default matmul precision a TPU rounds a float32 product's inputs to
bfloat16, so the weight gradient ``x^T g`` comes out the same from ``x``
kept in bfloat16 as from ``x`` in float32, reading half the bytes.

:func:`patch` makes every ``Dense`` layer's and recurrent cell's product (at
``PPOConfig.precision="default"``) a product with its own gradient that keeps
``bfloat16(x)`` for the weight gradient instead of ``x``; the forward pass and
the input gradient ``g W^T`` are computed as before. On a CPU, whose float32
products are exact, the weight gradients change: this is an experiment for
the chip, not an option of the library.

Usage (on the chip; device_check.sh part 14):
  python bench/bf16_residuals.py [--rows 20480] [--width 512] [--layers 4]
      the weight gradients of a swish MLP with and without the patch (their largest difference: 0 means the same
      bits, which is what would make the patch safe to adopt) and the time of one forward and backward pass each
  BF16_RESIDUALS=1 python bench/bench_intention.py ...   (the users' network trained with the patch)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp


@jax.custom_vjp
def matmul_keeping_bf16(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` (``[M, K] @ [K, N]``) whose weight gradient reads ``bfloat16(x)``."""
    return x @ w


def _forward(x, w):
    return x @ w, (x.astype(jnp.bfloat16), w)


def _backward(residuals, g):
    x16, w = residuals
    return g @ w.T, x16.astype(g.dtype).T @ g


matmul_keeping_bf16.defvjp(_forward, _backward)


def patch() -> None:
    """Route every ``Dense`` layer's and recurrent cell's default-precision
    product through :func:`matmul_keeping_bf16` (a cell's ``h W_h`` and
    ``x W_x``: its weight gradients then read ``bfloat16(h)`` and ``bfloat16(x)``)."""
    from nnx_ppo.networks import feedforward, recurrent
    from nnx_ppo.networks.types import StatefulModuleOutput

    plain, plain_matmul = feedforward.Dense.__call__, recurrent.matmul
    recurrent.matmul = lambda x, w: (matmul_keeping_bf16(x, w) if feedforward.current_precision() == "default"
                                     else plain_matmul(x, w))

    def call(self, state, x, rollout_extras=None):
        if feedforward.current_precision() != "default":
            return plain(self, state, x, rollout_extras)
        feedforward.check_features("Dense", x, self.in_features)
        y = matmul_keeping_bf16(x, self.linear.kernel[...])
        y = y if self.linear.bias is None else y + self.linear.bias[...][None, :]
        return StatefulModuleOutput(next_state=(), output=y if self.activation is None else self.activation(y))

    feedforward.Dense.__call__ = call


def _mlp(params, x, matmul):
    for w, b in params:
        x = jax.nn.swish(matmul(x, w) + b)
    return x


def _best_time(fn, *args, repeats: int = 10) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def main(argv) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20480, help="rows per product (the replay's minibatch x rollout)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)
    keys = jax.random.split(jax.random.key(0), args.layers + 1)
    params = [(jax.random.normal(k, (args.width, args.width)) / args.width**0.5, jnp.zeros(args.width))
              for k in keys[1:]]
    x = jax.random.normal(keys[0], (args.rows, args.width))
    grads = {name: jax.jit(jax.grad(lambda p, x, m=matmul: jnp.sum(jnp.square(_mlp(p, x, m)))))
             for name, matmul in (("float32", jnp.matmul), ("bf16_residuals", matmul_keeping_bf16))}
    out = {name: fn(params, x) for name, fn in grads.items()}
    diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), out["float32"], out["bf16_residuals"])
    flops = 3 * 2 * args.rows * args.width * args.width * args.layers
    row = {"device": jax.devices()[0].device_kind, "rows": args.rows, "width": args.width, "layers": args.layers,
           "max_weight_gradient_difference": max(d for d, _ in diffs),
           "max_bias_gradient_difference": max(d for _, d in diffs)}
    for name, fn in grads.items():
        seconds = _best_time(fn, params, x)
        row[f"{name}_ms"] = round(seconds * 1e3, 3)
        row[f"{name}_tflops"] = round(flops / seconds / 1e12, 1)
    print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
