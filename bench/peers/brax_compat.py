"""What Brax 0.14.2 needs from a newer jax, for the peers' scripts here.

Brax 0.14.2 calls ``jax.device_put_replicated``, which newer jax removed;
importing this module puts back an equivalent for one host (a stack of
copies along a new leading axis, one per device).
"""
import jax
import jax.numpy as jnp

if not hasattr(jax, "device_put_replicated"):
    jax.device_put_replicated = lambda x, devices: jax.tree.map(
        lambda a: jnp.stack([jnp.asarray(a)] * len(devices)), x)
