"""The C paths read their settings (Limits, the sampling policy, the ignore rules, the process
identity, the pid) through a per-call-site cache of the slot's offset (swmp/_native/attrcache.c):
what they read must always be what ``getattr`` gives, whatever happens to the object or its
class between two reads. ``slot_attr`` is that read with one cache of its own."""

from __future__ import annotations

from typing import Any

import pytest

from swmp.tracing.span import NATIVE, native_core

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


def _read(obj: Any, name: str) -> Any:
    try:
        return ("value", native_core.slot_attr(obj, name))
    except Exception as e:
        return ("raised", type(e).__name__)


def _getattr(obj: Any, name: str) -> Any:
    try:
        return ("value", getattr(obj, name))
    except Exception as e:
        return ("raised", type(e).__name__)


def _same(obj: Any, name: str) -> None:
    for _ in range(3):  # the first read fills the cache, the next ones use it
        assert _read(obj, name) == _getattr(obj, name)


def _slotted() -> type:
    class Settings:
        __slots__ = ("limit", "unset")

        def __init__(self, limit: int) -> None:
            self.limit = limit

    return Settings


def test_a_slot_is_read_as_getattr_reads_it() -> None:
    cls = _slotted()
    a, b = cls(1), cls(2)
    _same(a, "limit")
    _same(b, "limit")
    a.limit = 7  # the slot changed: read again
    _same(a, "limit")
    _same(a, "unset")  # never set: AttributeError
    a.unset = None
    _same(a, "unset")
    del a.unset
    _same(a, "unset")


def test_a_class_changed_after_the_first_read() -> None:
    cls = _slotted()
    obj = cls(3)
    _same(obj, "limit")
    member = cls.__dict__["limit"]
    cls.limit = property(lambda self: 99)  # type: ignore[attr-defined]  # the slot shadowed
    _same(obj, "limit")
    assert _read(obj, "limit") == ("value", 99)
    cls.limit = member  # type: ignore[attr-defined]  # and put back
    _same(obj, "limit")
    assert _read(obj, "limit") == ("value", 3)


def test_other_types_and_kinds_of_attribute() -> None:
    cls = _slotted()

    class Sub(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

    class Plain:
        def __init__(self) -> None:
            self.limit = 5

    class Hooked(cls):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return "hooked" if name == "limit" else super().__getattribute__(name)

    class WithProperty:
        __slots__ = ("_v",)

        def __init__(self) -> None:
            self._v = 4

        @property
        def limit(self) -> int:
            return self._v

    objs = [cls(1), Sub(2), Plain(), Hooked(3), WithProperty(), cls(4), object(), None, 3]
    for _ in range(2):
        for obj in objs:  # one cache, types changing from one read to the next
            _same(obj, "limit")
    with pytest.raises(TypeError):
        native_core.slot_attr(cls(1), 2)


def test_the_tracing_settings_are_read_through_it() -> None:
    """The objects the C paths read are __slots__ classes, so the cache applies to them."""
    from swmp.profiling.gate import gate
    from swmp.tracing.context import policy
    from swmp.tracing.identity import identity
    from swmp.tracing.ignore import IgnoreRules
    from swmp.tracing.limits import limits, stats

    for obj, name in [
        (gate, "board"),
        (IgnoreRules(), "_cache"),
        (limits, "tag_value_max"),
        (limits, "span_limit"),
        (policy, "rules"),
        (policy, "sampling"),
        (identity, "service"),
        (identity, "unbound"),
        (stats, "segments_written"),
    ]:
        assert type(obj).__dict__[name].__class__.__name__ == "member_descriptor"
        _same(obj, name)
    # The sink's claim, read for every emitted segment (emit.c's direct_writer).
    from swmp._runtime import ProcessSink

    for name in ("_pid", "_writer"):
        assert ProcessSink.__dict__[name].__class__.__name__ == "member_descriptor"
