"""Why vmapping seeds gains little on a CPU: the same products, one seed vs 8 at once.

Usage: python bench/batched_matmul.py [N_SEEDS] [ROWS] [WIDTH]

Times, in one compiled program each, 4 chained ``[ROWS, WIDTH] @ [WIDTH, WIDTH]``
products (with and without a tanh after each, as in the Pendulum MLP's
minibatch of 2048 rows x 64 units) for one seed, and for N_SEEDS seeds
vmapped (batched products), unrolled (N_SEEDS separate products in one
program) and under ``lax.map``. Prints one JSON line with the rate of each
layout relative to N_SEEDS times the one-seed program (1.0: no gain).
"""

import json
import sys
import time

import jax
import jax.numpy as jnp


def seconds_per_call(fn, *args, calls=50):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


def chain(activation):
    def f(x, w):
        for _ in range(4):
            x = activation(x @ w)
        return x
    return f


def main(argv):
    seeds = int(argv[0]) if argv else 8
    rows = int(argv[1]) if len(argv) > 1 else 2048
    width = int(argv[2]) if len(argv) > 2 else 64
    kx, kw = jax.random.split(jax.random.key(0))
    x, w = jax.random.normal(kx, (rows, width)), jax.random.normal(kw, (width, width)) / width ** 0.5
    xs, ws = jnp.stack([x] * seeds), jnp.stack([w] * seeds)
    result = {"seeds": seeds, "rows": rows, "width": width}
    for name, activation in (("matmul", lambda y: y), ("tanh_mlp", jnp.tanh)):
        f = chain(activation)
        one_by_one = seeds * seconds_per_call(f, x, w)
        layouts = {
            "vmap": jax.vmap(f),
            "unrolled": lambda a, b, f=f: jnp.stack([f(a[i], b[i]) for i in range(seeds)]),
            "lax_map": lambda a, b, f=f: jax.lax.map(lambda ab: f(*ab), (a, b)),
        }
        for layout, g in layouts.items():
            result[f"{name}_{layout}_vs_one_by_one"] = round(one_by_one / seconds_per_call(g, xs, ws), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
