"""The one way a package names its public API without importing it: `__getattr__ = lazy_exports(__name__, ...)`
(PEP 562). A name is imported from its module on first use, so importing a package costs nothing. A leaf: it
imports nothing of stepscope."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that resolves each name of `exports` (name -> module of the package
    that defines it) on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
