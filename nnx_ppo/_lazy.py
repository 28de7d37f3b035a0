"""Packages whose public names are imported on first use (internal).

``nnx_ppo``, ``nnx_ppo.algorithms`` and ``nnx_ppo.envs`` list their public
names by the module defining them; :func:`lazy_exports` gives the
package's ``__getattr__`` and ``__dir__``, so importing the package (or a
light module in it, such as the configs) loads no JAX.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], object],
                                                                             Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` whose public names
    are ``modules`` (defining module -> its names). A name is imported on
    first use and then kept in the package; any other attribute is an
    AttributeError (which is also how ``from package import submodule``
    finds a submodule)."""
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return list(exports), __getattr__, __dir__
