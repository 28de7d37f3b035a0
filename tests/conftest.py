"""Strict JAX settings for the whole suite: silent broadcasting is an error."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
