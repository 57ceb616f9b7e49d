"""``_props_copy.shallow_copy`` makes what ``copy.copy`` makes: the message properties a traced
publish copies (pamqp's ``Basic.Properties``, pika's ``BasicProperties``) and every shape
of class it may meet, including those it hands to ``copy.copy``."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest

from swmp.instrument import _props_copy
from swmp.instrument._props_copy import shallow_copy
from swmp.tracing.span import native_core


class Plain:
    def __init__(self) -> None:
        self.a, self.b = 1, [2]


class Slotted:
    __slots__ = ("x", "y")


class SlottedChild(Slotted):
    __slots__ = ("z",)


class OneSlot:
    __slots__ = "only"  # noqa: PLC0205 (a single name as a str: a shape copy.copy meets)


class Mixed(Slotted):  # slots and a __dict__
    pass


class Private:
    __slots__ = ("__hidden",)

    def __init__(self) -> None:
        self.__hidden = 5


class OwnCopy:
    def __init__(self) -> None:
        self.copied = False

    def __copy__(self) -> OwnCopy:
        new = OwnCopy()
        new.copied = True
        return new


class Watched(Slotted):  # a __setattr__ of its own: copy.copy's setattr runs it
    __slots__ = ("log",)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value * 2 if name == "x" else value)


class Shadowed(Slotted):  # a property in front of a base's slot: setattr goes to it
    __slots__ = ("_seen",)

    @property  # type: ignore[override]
    def x(self) -> Any:
        return self._seen

    @x.setter
    def x(self, value: Any) -> None:
        self._seen = ("set", value)


class OwnNew:
    def __new__(cls, *args: Any) -> OwnNew:
        obj = super().__new__(cls)
        obj.made = True  # type: ignore[attr-defined]
        return obj


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        names += [declared] if isinstance(declared, str) else list(declared)
    return [n for n in names if not n.startswith("__")]


def _state(obj: Any) -> Any:
    return (
        type(obj),
        dict(getattr(obj, "__dict__", {})),
        {n: getattr(obj, n, "<unset>") for n in _slot_names(type(obj))},
    )


def _cases() -> list[Any]:
    cases: list[Any] = [
        Plain(),
        Slotted(),
        SlottedChild(),
        OneSlot(),
        Mixed(),
        Private(),
        OwnCopy(),
        OwnNew(),
    ]
    s = Slotted()
    s.x = 1  # y never set
    cases.append(s)
    c = SlottedChild()
    c.x, c.y, c.z = 1, 2, {"k": 3}
    cases.append(c)
    o = OneSlot()
    o.only = "v"
    cases.append(o)
    m = Mixed()
    m.x, m.extra = 1, "e"  # type: ignore[attr-defined]
    cases.append(m)
    w = Watched()
    w.x, w.y = 1, 2
    cases.append(w)
    sh = Shadowed()
    sh.x = 1
    cases.append(sh)
    pamqp = pytest.importorskip("pamqp.commands")
    cases += [
        pamqp.Basic.Properties(),
        pamqp.Basic.Properties(
            content_type="application/json", headers={"a": 1}, delivery_mode=2, message_id="m"
        ),
    ]
    pika = pytest.importorskip("pika.spec")
    cases += [pika.BasicProperties(), pika.BasicProperties(content_type="text/plain", headers={"a": 1})]
    return cases


@pytest.mark.parametrize("obj", _cases(), ids=lambda o: type(o).__name__)
def test_shallow_copy_makes_what_copy_copy_makes(obj: Any) -> None:
    for _ in range(2):  # the class's plan made, then used
        mine, theirs = shallow_copy(obj), copy.copy(obj)
        assert mine is not obj
        assert _state(mine) == _state(theirs)
        if not isinstance(obj, OwnCopy):  # shallow: the values themselves are shared
            for name, value in _state(obj)[1].items():
                assert getattr(mine, name) is value
    if isinstance(obj, OwnCopy):
        assert shallow_copy(obj).copied  # its own __copy__ ran
    if isinstance(obj, Private):
        assert shallow_copy(obj)._Private__hidden == 5  # type: ignore[attr-defined]


needs_native = pytest.mark.skipif(native_core is None, reason="the native span core is not built")


@needs_native
@pytest.mark.parametrize(
    ("cls", "native"),
    [
        (Slotted, True),
        (SlottedChild, True),
        (OneSlot, True),
        (Mixed, True),
        (Watched, False),
        (Shadowed, False),
    ],
)
def test_slots_are_copied_natively_only_where_setattr_goes_straight_to_them(cls: type, native: bool) -> None:
    shallow_copy(cls())
    plan = _props_copy._copy_plans[cls]
    assert plan is not None
    assert (plan[2] is not None) is native


@needs_native
def test_the_message_properties_take_the_native_copy() -> None:
    pamqp = pytest.importorskip("pamqp.commands")
    props = pamqp.Basic.Properties(content_type="text/plain", headers={"a": 1})
    shallow_copy(props)
    plan = _props_copy._copy_plans[type(props)]
    assert plan is not None and plan[2] is not None


@needs_native
def test_copy_slots_shares_values_and_leaves_unset_slots_unset() -> None:
    value = object()
    obj = SlottedChild()
    obj.x, obj.z = value, [1]
    descriptors = (Slotted.x, Slotted.y, SlottedChild.z)
    before = sys.getrefcount(value)
    copies = [native_core.copy_slots(obj, descriptors) for _ in range(100)]
    assert sys.getrefcount(value) == before + 100
    assert all(type(c) is SlottedChild and c.x is value and c.z is obj.z for c in copies)
    assert not hasattr(copies[0], "y")
    del copies
    assert sys.getrefcount(value) == before


class Other:
    __slots__ = ("a",)


@needs_native
@pytest.mark.parametrize(
    ("obj", "descriptors"),
    [
        (Slotted(), [Slotted.x]),  # not a tuple
        (Slotted(), (Other.a,)),  # another class's slot: outside this object's layout
        (Slotted(), (type.__dict__["__basicsize__"],)),  # read-only, not an object slot
        (Slotted(), (Slotted.__dict__["__slots__"],)),  # not a member descriptor
        (OwnNew(), ()),  # a __new__ of its own
    ],
)
def test_copy_slots_refuses_what_it_cannot_copy_safely(obj: Any, descriptors: Any) -> None:
    with pytest.raises(TypeError):
        native_core.copy_slots(obj, descriptors)
