"""``_mq.shallow_copy`` makes what ``copy.copy`` makes: the message properties a traced
publish copies (pamqp's ``Basic.Properties``, pika's ``BasicProperties``) and every shape
of class it may meet, including those it hands to ``copy.copy``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from swmp.instrument._mq import shallow_copy


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
