"""The native attach step of a traced RabbitMQ publish (swmp/_native/attach.c) makes what
its Python form (``_props_copy.py_attach``) makes: a new properties object of the caller's
class (``factory()`` for none) with the caller's values and the span's headers table, the
caller's object untouched, and the same errors; for pika's and pamqp's property classes and
for classes the copy handles each of its ways."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from pamqp.commands import Basic
from pika import BasicProperties

from swmp.instrument import _mq, _props_copy, aiormq, pika
from swmp.tracing.context import new_entry_span, new_exit_span
from swmp.tracing.span import NATIVE, native_core
from tests.native_forms import recording

pytestmark = pytest.mark.skipif(not NATIVE, reason="the native core is not built")


@pytest.fixture()
def span() -> Iterator[Any]:
    with recording(), new_entry_span("/publish"), new_exit_span("RabbitMQ/x/Producer", "mq:5672", 52, 4) as s:
        yield s


class Props:
    """A properties class with only a ``__dict__``."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class PikaSub(BasicProperties):  # type: ignore[misc]
    pass


class Slotted:
    __slots__ = ("headers", "mode")

    def __init__(self, headers: Any = None, mode: Any = None) -> None:
        self.headers = headers
        if mode is not None:
            self.mode = mode


class SlottedWithDict(Slotted):
    __slots__ = ("__dict__",)


class Hooked(Props):
    def __copy__(self) -> Hooked:
        return Hooked(**self.__dict__, copied=True)


class Guarded(Props):
    """Reading ``headers`` goes through a property that refuses."""

    @property
    def headers(self) -> Any:
        raise OSError("no headers")


class SetRefused(Props):
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "headers":
            raise ValueError("read-only")
        super().__setattr__(name, value)


def _state(obj: Any) -> Any:
    """The class and every value an object holds (``__dict__`` and slots)."""
    slots = {}
    for klass in type(obj).__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__"):
                slots[name] = getattr(obj, name, "<unset>")
    return type(obj), dict(getattr(obj, "__dict__", {})), slots


def _cases() -> dict[str, Any]:
    with_extra = SlottedWithDict({"a": "1"}, 2)
    with_extra.note = "n"  # type: ignore[attr-defined]
    return {
        "none": None,
        "pika": BasicProperties(delivery_mode=2, content_type="application/json"),
        "pika headers": BasicProperties(headers={"a": "1", "sw8": "old", "sw8-x": "x"}),
        "pika key not str": BasicProperties(headers={1: "2"}),
        "pika headers not a dict": BasicProperties(headers=[("a", "1")]),
        "pika subclass": PikaSub(headers={"a": "1"}, app_id="app"),
        "pamqp": Basic.Properties(delivery_mode=2, headers={"a": "1"}),
        "pamqp no headers": Basic.Properties(content_type="text/plain"),
        "dict only": Props(headers=None, mode=1),
        "dict empty": Props(),
        "slots": Slotted({"a": "1"}, 2),
        "slot unset": Slotted(None),
        "slots and dict": with_extra,
        "copy hook": Hooked(headers={"a": "1"}),
        "headers refused": Guarded(mode=1),
        "headers read-only": SetRefused(headers=None),
    }


def _attach(form: Any, span: Any, props: Any) -> Any:
    before = None if props is None else _state(props)
    try:
        out = form(span, props)
    except Exception as e:
        return ("raised", type(e).__name__, str(e))
    assert out is not props
    if props is not None:
        assert _state(props) == before  # the caller's object is never modified
    return ("returned", _state(out))


FACTORIES = {"pika": BasicProperties, "aiormq": functools.partial(Basic.Properties, delivery_mode=1)}


@pytest.mark.parametrize("factory", list(FACTORIES))
@pytest.mark.parametrize("case", list(_cases()))
def test_attach(span: Any, factory: str, case: str) -> None:
    props = _cases()[case]
    native = native_core.amqp_attach(FACTORIES[factory], _props_copy.shallow_copy, _props_copy.native_plan)
    mine = _attach(native, span, props)
    assert mine == _attach(functools.partial(_props_copy.py_attach, FACTORIES[factory]), span, props)
    if mine[0] == "returned":
        headers = mine[1][1].get("headers", mine[1][2].get("headers"))
        assert headers["sw8"] == span.inject()["sw8"]


def test_a_plan_is_asked_once_per_class(span: Any) -> None:
    asked: list[type] = []

    def plan(cls: type) -> Any:
        asked.append(cls)
        return _props_copy.native_plan(cls)

    attach = native_core.amqp_attach(BasicProperties, _props_copy.shallow_copy, plan)
    for _ in range(3):
        attach(span, BasicProperties())
        attach(span, Basic.Properties())
    assert asked == [BasicProperties, Basic.Properties]


def test_bad_plans_and_calls(span: Any) -> None:
    attach = native_core.amqp_attach(
        BasicProperties, _props_copy.shallow_copy, lambda cls: ["not", "a tuple"]
    )
    with pytest.raises(TypeError):
        attach(span, BasicProperties())
    # A descriptor that is not one of the class's slots: copy_slots refuses it.
    attach = native_core.amqp_attach(BasicProperties, _props_copy.shallow_copy, lambda cls: (Slotted.mode,))
    with pytest.raises(TypeError):
        attach(span, Props())
    with pytest.raises(TypeError):
        attach(span)
    with pytest.raises(TypeError):
        native_core.amqp_attach(BasicProperties, None, None)


def test_the_instrumentations_use_the_native_step() -> None:
    attach = _props_copy.attach_step(BasicProperties)
    assert type(attach).__name__ == "AmqpAttach"
    assert _mq.amqp_send_span is native_core.amqp_send_span
    assert pika.attach_step is aiormq.attach_step is _props_copy.attach_step
