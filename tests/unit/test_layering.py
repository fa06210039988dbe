"""Composition, not towers: no class of ``ptl_rl`` inherits through more than 3 levels of ``ptl_rl``'s own classes.

A class whose behaviour is spread over a chain of its own base classes shares one ``self`` among all of
them: each layer reads attributes another sets, and none can be read or tested alone (``FrameStorage`` was
``FramePool`` <- ``FrameLinks`` <- ... <- ``FrameCheckpoint`` <- ``FrameStorage``, eight levels). Parts
with narrow interfaces, owned by the class that uses them, are the rule (docs/design/layering.md); a base
class of one's own (``Stage``) and a specialisation or two of it (``AsyncSource`` <- ``RemoteSource`` <-
``Stage``) stay within the limit. Bases from outside
``ptl_rl`` (``Protocol``, ``dict``, Lightning's ``Callback``) are not counted.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import ptl_rl

MAX_DEPTH = 3


def own_depth(cls: type, package: str = "ptl_rl") -> int:
    """Levels of ``package``'s own classes above ``cls``: 0 without such a base, else 1 + the deepest base's."""
    own = [base for base in cls.__bases__ if base.__module__.split(".")[0] == package]
    return 1 + max(own_depth(base, package) for base in own) if own else 0


def package_classes() -> set[type]:
    """Every class defined in a module of ``ptl_rl`` (at module level, or nested in such a class)."""
    found: set[type] = set()
    pending: list[type] = []
    for info in pkgutil.walk_packages(ptl_rl.__path__, "ptl_rl."):
        module = importlib.import_module(info.name)
        pending += [obj for obj in vars(module).values() if inspect.isclass(obj) and obj.__module__ == info.name]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.add(cls)
            pending += [obj for obj in vars(cls).values() if inspect.isclass(obj) and obj.__module__ == cls.__module__]
    return found


def test_no_class_inherits_through_more_than_three_levels_of_its_own_package():
    classes = package_classes()
    assert len(classes) > 100  # (every module was walked)
    deep = sorted(f"{c.__module__}.{c.__qualname__}: {own_depth(c)}" for c in classes if own_depth(c) > MAX_DEPTH)
    assert not deep, f"classes deeper than {MAX_DEPTH} levels of ptl_rl's own bases (compose parts instead): {deep}"


def test_the_depth_counts_the_longest_chain_of_own_bases():
    class Base: ...

    class Mixin: ...

    class One(Base): ...

    class Two(One, Mixin): ...

    class Three(Two): ...

    class Four(Three, dict): ...

    package = __name__.split(".")[0]  # (these classes are this test module's own)
    assert [own_depth(c, package) for c in (Base, One, Two, Three, Four)] == [0, 1, 2, 3, 4]
    assert own_depth(Four, "ptl_rl") == 0  # (bases of other packages are not counted)
