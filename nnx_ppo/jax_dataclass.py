"""``JaxDataclass``: a mixin that makes a frozen dataclass usable as a JAX pytree.

Every field of the dataclass is a child of the pytree (none is static), in
field order. Rebuilding the object from its children (what JAX does inside
``jit``, ``vmap`` or ``scan``, possibly with tracers or placeholder values
as children) does not call ``__init__``, so a validating ``__init__`` or
``__post_init__``, or a runtime type checker instrumenting it, only sees the
values a user passes::

    import dataclasses

    import jax
    import jax.numpy as jnp

    from nnx_ppo.jax_dataclass import JaxDataclass

    @jax.tree_util.register_pytree_node_class
    @dataclasses.dataclass(frozen=True)
    class Step(JaxDataclass):
        obs: jax.Array
        reward: jax.Array

    step = Step(obs=jnp.zeros((4, 3)), reward=jnp.zeros(4))
    jax.tree.map(lambda x: x + 1, step).replace(reward=jnp.ones(4))

Register the class with ``jax.tree_util.register_pytree_node_class`` (as
above, below the dataclass decorator) or with
``jax.tree_util.register_pytree_with_keys_class``; the latter also gives the
leaves attribute key paths (``.obs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["JaxDataclass"]


class JaxDataclass:
    """Mixin for frozen dataclasses registered as pytrees (see the module docstring)."""

    def replace(self, **changes: Any) -> Any:
        """A copy with the given fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def _field_names(self) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(self))  # type: ignore[arg-type]

    def tree_flatten(self) -> tuple[list[Any], tuple[str, ...]]:
        """``(children, names)``: every field's value, in field order."""
        names = self._field_names()
        return [getattr(self, name) for name in names], names

    def tree_flatten_with_keys(self) -> tuple[list[tuple[Any, Any]], tuple[str, ...]]:
        """Like :meth:`tree_flatten`, with a ``GetAttrKey`` per child."""
        import jax

        children, names = self.tree_flatten()
        return [(jax.tree_util.GetAttrKey(name), child) for name, child in zip(names, children)], names

    @classmethod
    def tree_unflatten(cls, names: tuple[str, ...], children: Any) -> Any:
        """Rebuild an instance without running ``__init__`` (frozen fields set directly)."""
        obj = object.__new__(cls)
        for name, value in zip(names, children):
            object.__setattr__(obj, name, value)
        return obj
