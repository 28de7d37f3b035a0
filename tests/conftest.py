"""Strict JAX settings for the whole suite: silent broadcasting is an error."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

# The longest files run first, so that neither of the two xdist workers
# (`make test`, whole files each) is left alone with one of them at the end.
_FIRST = ("test_sharding.py", "test_cli.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _FIRST.index(item.path.name) if item.path.name in _FIRST else len(_FIRST))
