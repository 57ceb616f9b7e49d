"""Replacing a method on a class, reversibly, and only once.

The wrapper remembers the original in ``__swmp_original__``: installing twice keeps one
layer, and ``restore`` puts the original back (tests, ``swmp.stop``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ORIGINAL = "__swmp_original__"
INHERITED = "__swmp_inherited__"  # the wrapper shadows a base class's method: restore deletes it


def original(owner: Any, name: str) -> Any:
    fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    return getattr(fn, ORIGINAL, fn)


def patch(
    owner: Any, name: str, make_wrapper: Callable[[Any], Callable[..., Any]], *, inherited: bool = False
) -> None:
    """Set ``owner.name`` to ``make_wrapper(original)`` unless it is already patched.

    With ``inherited``, a method the class only inherits (e.g. from a compiled base class
    whose methods cannot be replaced) is wrapped on ``owner`` itself.
    """
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    shadow = False
    if current is None and inherited and isinstance(owner, type):
        current = getattr(owner, name, None)
        shadow = current is not None
    if current is None:
        raise AttributeError(f"{owner!r} has no attribute {name!r} to instrument")
    if hasattr(current, ORIGINAL):
        return
    wrapper = make_wrapper(current)
    try:
        functools.update_wrapper(wrapper, current)
    except (AttributeError, TypeError):
        pass
    setattr(wrapper, ORIGINAL, current)
    if shadow:
        setattr(wrapper, INHERITED, True)
    setattr(owner, name, wrapper)


def restore(owner: Any, name: str) -> None:
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    orig = getattr(current, ORIGINAL, None)
    if orig is not None and getattr(current, INHERITED, False):
        delattr(owner, name)
    elif orig is not None:
        setattr(owner, name, orig)


def is_patched(owner: Any, name: str) -> bool:
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    return hasattr(current, ORIGINAL)


Target = tuple[Any, str, Callable[[Any], Callable[..., Any]]]  # (owner, name, make_wrapper)


def patch_all(targets: list[Target], *, inherited: bool = False) -> None:
    """:func:`patch` each ``(owner, name, make_wrapper)``."""
    for owner, name, make in targets:
        patch(owner, name, make, inherited=inherited)


def restore_all(targets: list[Target]) -> None:
    for owner, name, _ in targets:
        restore(owner, name)
