"""The public signatures say what they take: at most 5% of the public parameters are ``Any``.

Walked: every public name of ``ptl_rl`` (``ptl_rl.__all__``), of ``ptl_rl.lightning``, ``ptl_rl.distributed``,
``ptl_rl.replay`` and ``ptl_rl.core.protocols``; for a function its parameters, for a class those of its
``__init__``, its ``__call__`` and its public methods (defined in ptl_rl, not inherited from torch or Lightning).
A parameter counts as ``Any`` when its annotation, resolved by :func:`typing.get_type_hints`, says nothing
beyond ``Any`` (``Any``, ``Any | None``) or when it has no annotation at all. ``self`` and ``cls`` are not
parameters. The remaining ``Any`` and their reasons are listed in ``docs/design/typing.md``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

MAX_ANY_SHARE = 0.05
PACKAGES = ["ptl_rl", "ptl_rl.lightning", "ptl_rl.distributed", "ptl_rl.replay", "ptl_rl.core.protocols"]


def public_objects() -> dict[str, Any]:
    """Qualified public name -> object, each object once (the first package that exports it names it)."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for name in package.__all__:
            obj = getattr(package, name)
            if id(obj) in seen or not (inspect.isclass(obj) or callable(obj)):
                continue
            seen.add(id(obj))
            found[f"{package_name}.{name}"] = obj
    return found


def _is_ptl_rl(module_name: str | None) -> bool:
    return module_name is not None and (module_name == "ptl_rl" or module_name.startswith("ptl_rl."))


def public_callables() -> Iterator[tuple[str, Callable[..., Any], type | None]]:
    """(name, function, owning class) of every public function, class ``__init__``/``__call__`` and method."""
    seen: set[int] = set()
    for qualified, obj in public_objects().items():
        if not inspect.isclass(obj):
            if id(obj) not in seen:
                seen.add(id(obj))
                yield qualified, obj, None
            continue
        names: dict[str, Any] = {}
        for klass in reversed(obj.__mro__):  # the most derived definition wins
            if not _is_ptl_rl(klass.__module__):
                continue
            for name, member in vars(klass).items():
                if name in ("__init__", "__call__") or not name.startswith("_"):
                    names[name] = member
        for name, member in sorted(names.items()):
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if not inspect.isfunction(member) or not _is_ptl_rl(member.__module__) or id(member) in seen:
                continue  # properties, attributes, nested classes; a Protocol's __init__ (typing's)
            seen.add(id(member))
            yield f"{qualified}.{name}", member, obj


@functools.cache
def type_checking_names(module_name: str) -> dict[str, Any]:
    """The names a module imports under ``if TYPE_CHECKING:``, imported for real (the tests run after import)."""
    module = sys.modules[module_name]
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return {}
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if isinstance(statement, (ast.Import, ast.ImportFrom)):
                    exec(compile(ast.Module(body=[statement], type_ignores=[]), module_name, "exec"), names)  # noqa: S102
    names.pop("__builtins__", None)
    return names


def resolved_hints(function: Callable[..., Any], owner: type | None) -> dict[str, Any]:
    module_name = function.__module__
    if owner is not None and module_name not in sys.modules:
        module_name = owner.__module__
    globalns = dict(vars(sys.modules[module_name]))
    # the string alias ObsTree is evaluated where it is used: its own module's names come last
    localns = dict(vars(sys.modules["ptl_rl.core.protocols.agents"]))
    localns.update(type_checking_names("ptl_rl.core.protocols.agents"))
    localns.update(globalns)
    localns.update(type_checking_names(module_name))
    if owner is not None:  # names of the class body (and of the module the class lives in)
        localns.update(type_checking_names(owner.__module__))
        localns.update(vars(owner))
    return typing.get_type_hints(inspect.unwrap(function), globalns=globalns, localns=localns)


def says_nothing(annotation: Any) -> bool:
    """Whether an annotation carries no information beyond ``Any`` (``Any``, ``Any | None``, ``Optional[Any]``)."""
    if annotation is Any:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return any(arg is Any for arg in args) and all(arg is Any or arg is type(None) for arg in args)
    return False


def survey() -> tuple[list[str], list[str], list[str]]:
    """(every public parameter, those that say nothing beyond Any, those typed ``object``), as ``name(param)``.

    ``object`` is counted apart, not as ``Any``: it is a type the checker holds a caller and the body to (the
    body may do nothing with the value unchecked), for a value only stored, compared or passed on (a snapshot
    token, a hook's ignored arguments).
    """
    parameters: list[str] = []
    offenders: list[str] = []
    objects: list[str] = []
    for name, function, owner in public_callables():
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            continue
        hints = resolved_hints(function, owner)
        positional = list(signature.parameters.values())
        for index, parameter in enumerate(positional):
            if index == 0 and owner is not None and parameter.name in ("self", "cls"):
                continue
            label = f"{name}({parameter.name})"
            parameters.append(label)
            if parameter.name not in hints or says_nothing(hints[parameter.name]):
                offenders.append(label)
            elif hints[parameter.name] is object:
                objects.append(label)
    return parameters, offenders, objects


def test_every_public_annotation_resolves() -> None:
    """Each public signature's annotations evaluate (no stale name in a string annotation)."""
    failures = []
    for name, function, owner in public_callables():
        try:
            resolved_hints(function, owner)
        except Exception as error:  # noqa: BLE001 - reported, whatever it is
            failures.append(f"{name}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


def test_at_most_five_percent_of_public_parameters_are_any(capsys: pytest.CaptureFixture[str]) -> None:
    parameters, offenders, objects = survey()
    share = len(offenders) / len(parameters)
    with capsys.disabled():
        print(f"\npublic parameters: {len(parameters)}, Any: {len(offenders)} ({share:.1%}), object: {len(objects)}")
        for label in offenders:
            print(f"  Any: {label}")
    assert len(parameters) > 300  # the walk found the API (a broken walk would pass with nothing)
    assert share <= MAX_ANY_SHARE, f"{len(offenders)} of {len(parameters)} public parameters are Any: {offenders}"


def test_the_checker_sees_any() -> None:
    """The checker itself: ``Any``, ``Any | None`` and a missing annotation count; ``dict[str, Any]`` does not."""

    def example(a: Any, b: Any | None, c, d: dict[str, Any], e: int | None) -> None: ...  # noqa: ANN001

    hints = typing.get_type_hints(example)
    assert says_nothing(hints["a"]) and says_nothing(hints["b"])
    assert "c" not in hints
    assert not says_nothing(hints["d"]) and not says_nothing(hints["e"])
