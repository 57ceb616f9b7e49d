"""Replacing a method on a class, reversibly, and only once.

The wrapper remembers the original in ``__swmp_original__``: installing twice keeps one
layer, and ``restore`` puts the original back (tests, ``swmp.stop``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ORIGINAL = "__swmp_original__"


def original(owner: Any, name: str) -> Any:
    fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    return getattr(fn, ORIGINAL, fn)


def patch(owner: Any, name: str, make_wrapper: Callable[[Any], Callable[..., Any]]) -> None:
    """Set ``owner.name`` to ``make_wrapper(original)`` unless it is already patched."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
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
    setattr(owner, name, wrapper)


def restore(owner: Any, name: str) -> None:
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    orig = getattr(current, ORIGINAL, None)
    if orig is not None:
        setattr(owner, name, orig)


def is_patched(owner: Any, name: str) -> bool:
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    return hasattr(current, ORIGINAL)
