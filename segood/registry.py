"""Registries: a name -> definition map per extension point (methods, dataset adapters, metrics), each filled by
a decorator beside the definitions (``@register_method`` over a class), read through ``get_*`` and ``list_*``."""

import importlib
import os
import sys
from typing import Callable, TypeVar

T = TypeVar("T")


RESERVED = (".", "..", "all")  # ('all': every method, to --methods)
MAX_NAME_BYTES = 100  # (a name and the words around it in a file name stay within the usual 255 bytes)


def check_name(kind: str, name, reserved=RESERVED):
    """Refuse a ``kind``'s name that cannot name files and folders or be a word of the command line: empty, longer
    than :data:`MAX_NAME_BYTES` bytes, with a path separator or a control character, starting with -, or one of
    ``reserved``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} needs a non-empty name, got {name!r}")
    odd = ("/" in name or "\\" in name or name in reserved or name.startswith("-")
           or any(ord(c) < 32 or ord(c) == 127 for c in name) or len(name.encode()) > MAX_NAME_BYTES)
    if odd:
        raise ValueError(f"a {kind} name names files and folders and is a word of the command line: {name!r} "
                         f"cannot be one (at most {MAX_NAME_BYTES} bytes, no path separators or control characters, "
                         f"no leading -, nor {', '.join(map(repr, reserved))})")


class Registry(dict):
    """Name -> a registered definition (a class or object with a ``name``), for one ``kind`` of thing.

    A name is registered once: registering another definition under it, item assignment and ``update``
    included, is a ValueError unless ``replace=True``. Asking for an unknown name is a KeyError that lists the
    valid ones. ``reserved``: names the command line gives another meaning, refused besides :data:`RESERVED`.
    """

    kind, reserved = "definition", RESERVED  # (class defaults: a pickled registry adds its items before its fields)

    def __init__(self, kind: str, *, reserved: tuple = ()):
        super().__init__()
        self.kind, self.reserved = kind, RESERVED + tuple(reserved)

    def add(self, name: str, value: T, *, replace: bool = False) -> T:
        """Register ``value`` as ``name``; returns ``value``."""
        check_name(self.kind, name, self.reserved)
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

    def update(self, *others, **named) -> None:
        for name, value in dict(*others, **named).items():
            self.add(name, value)

    def __ior__(self, other):
        self.update(other)
        return self

    def setdefault(self, name: str, value):
        return self[name] if name in self else self.add(name, value)

    def __missing__(self, name: str):
        raise KeyError(f"unknown {self.kind} {name!r}; choose one of {sorted(self)}")


def import_user_module(flag: str, module_name: str):
    """The user's module ``module_name`` (a scorer, or code that registers a loader), imported from the current
    folder (searched first, as ``python -m`` does) or PYTHONPATH; a ValueError that starts with ``flag`` and names
    what is missing."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):  # (it, or a package of
            # its path; not another module whose name begins alike)
            raise ValueError(f"{flag}: no module {module_name!r} in the current folder ({cwd}) or on PYTHONPATH; "
                             "run segood from the folder that holds it, or add that folder to PYTHONPATH") from err
        raise ValueError(f"{flag}: importing {module_name} failed: it needs {err.name!r}, which is not "
                         "installed") from err
    except Exception as err:  # whatever the user's module raises while it is imported
        raise ValueError(f"{flag}: importing {module_name} failed ({type(err).__name__}: {err})") from err
