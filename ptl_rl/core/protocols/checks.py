"""Checking an object against a protocol: fast per-class answers, and the members missing, for error messages."""

from __future__ import annotations

import functools


def implements(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for a protocol of methods only, decided once per class of ``obj``.

    ``isinstance`` against a runtime protocol looks every member up each time
    (about 20 us on Python 3.11), too slow for a per-step check; the class
    decides for methods, so the answer is cached per class. An object that
    gains methods per instance (``__getattr__`` forwarding, as a wrapped
    agent does) needs ``isinstance`` instead.
    """
    # (annotated as plain `type`: mypy checks `type[X]` against the cache's Hashable key through X's unbound
    # __hash__ and refuses it, though every class is hashable)
    kind: type = type(obj)
    return _class_implements(kind, protocol)


@functools.cache
def _class_implements(kind: type, protocol: type) -> bool:
    return issubclass(kind, protocol)


_CALLED_DUNDERS = ("__call__", "__iter__", "__len__", "__next__")


def missing_members(obj: object, protocol: type) -> list[str]:
    """The members of ``protocol`` that ``obj`` lacks, for an error message (empty when ``obj`` has them all)."""
    members = list(getattr(protocol, "__annotations__", {}))
    members += [
        name
        for name, value in vars(protocol).items()
        if callable(value) and (not name.startswith("_") or name in _CALLED_DUNDERS)
    ]
    return [name for name in members if not hasattr(obj, name)]
