"""Registries: a name -> definition map per extension point (methods, dataset adapters, metrics), each filled by
a decorator beside the definitions (``@register_method`` over a class), read through ``get_*`` and ``list_*``."""

from typing import Callable, TypeVar

T = TypeVar("T")


class Registry(dict):
    """Name -> a registered definition (a class or object with a ``name``), for one ``kind`` of thing.

    A name is registered once: registering another definition under it, item assignment included, is a
    ValueError unless ``replace=True``. Asking for an unknown name is a KeyError that lists the valid ones.
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, name: str, value: T, *, replace: bool = False) -> T:
        """Register ``value`` as ``name``; returns ``value``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        if not replace and self.get(name, value) is not value:
            raise ValueError(f"a {self.kind} named {name!r} is registered already ({self[name]!r}); pass "
                             "replace=True to replace it, or choose another name")
        super().__setitem__(name, value)
        return value

    def register(self, value: T | None = None, *, name: str | None = None,
                 replace: bool = False) -> T | Callable[[T], T]:
        """Decorator (``@register`` or ``@register(name=..., replace=True)``), or a call with the definition."""
        def add(value):
            return self.add(name or value.name, value, replace=replace)

        return add if value is None else add(value)

    def __setitem__(self, name: str, value) -> None:
        self.add(name, value)

    def __missing__(self, name: str):
        raise KeyError(f"unknown {self.kind} {name!r}; choose one of {sorted(self)}")
