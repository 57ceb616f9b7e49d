"""A shallow copy of a message's properties, made the way ``copy.copy`` makes it but faster:
a traced RabbitMQ publish copies the caller's properties on every message, so that the
caller's object is never modified (``swmp.instrument._mq``, pika, aiormq). And the publish's
whole attach step (the copy with the span's headers table), which the native core runs
without a Python frame."""

from __future__ import annotations

import copy
import functools
import operator
import types
from collections.abc import Callable
from typing import Any, TypeVar

from swmp.instrument import _mq
from swmp.tracing.span import native_core

T = TypeVar("T")

# A class's plan for shallow_copy: the slot names to carry over, one getter of them all, and
# their member descriptors when the native core copies them (see _copy_plan); or None for
# copy.copy.
_Plan = tuple[tuple[str, ...], Callable[[Any], Any] | None, tuple[Any, ...] | None]
_copy_plans: dict[type, _Plan | None] = {}
_OBJECT_NEW: Any = object.__new__
_OBJECT_GETATTRIBUTE: Any = object.__getattribute__
_OBJECT_SETATTR: Any = object.__setattr__
_COPY_HOOKS = ("__copy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__")
# copy_slots(obj, descriptors) (swmp/_native/slots.c): the slots copied pointer by pointer.
_copy_slots: Callable[[Any, tuple[Any, ...]], Any] | None = getattr(native_core, "copy_slots", None)


def _slot_descriptors(cls: type, names: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The member descriptors of ``names`` when reading and setting each name on an instance
    goes straight to its slot (no ``__getattribute__`` / ``__setattr__`` of the class's own,
    no class attribute shadowing a slot): what copy.copy's getattr / setattr then do, the
    native copy does directly. None otherwise."""
    if _copy_slots is None or not names:
        return None
    klass: Any = cls  # the class's own lookup (mypy types these as the instance methods)
    if klass.__getattribute__ is not _OBJECT_GETATTRIBUTE or klass.__setattr__ is not _OBJECT_SETATTR:
        return None
    found = []
    for name in names:
        attr = next((klass.__dict__[name] for klass in cls.__mro__ if name in klass.__dict__), None)
        if not isinstance(attr, types.MemberDescriptorType):
            return None
        found.append(attr)
    return tuple(found)


def _copy_plan(cls: type) -> _Plan | None:
    """The slots ``copy.copy`` would carry over for ``cls`` (its own and its bases'), or None
    when ``cls`` copies itself some other way (a copy hook, a ``__new__`` of its own, a
    private slot name whose mangled form is not the declared one): copy.copy's call then."""
    if any(getattr(cls, hook, None) is not getattr(object, hook, None) for hook in _COPY_HOOKS):
        return None
    if cls.__new__ is not _OBJECT_NEW:
        return None
    names: list[str] = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for name in (declared,) if isinstance(declared, str) else declared:
            if name.startswith("__") and not name.endswith("__"):
                return None
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    slots = tuple(names)
    descriptors = _slot_descriptors(cls, slots)
    if len(names) < 2:  # attrgetter of one name returns the value, not a tuple
        return slots, None, descriptors
    return slots, operator.attrgetter(*names), descriptors


def shallow_copy(obj: T) -> T:
    """What ``copy.copy(obj)`` makes for a plain object (its ``__dict__`` and set slots in a
    new instance made without ``__init__``), without copy.copy's ``__reduce_ex__`` round:
    a message's properties are copied on every traced publish (pamqp's ``Basic.Properties``
    5 us through copy.copy, 1.6 us slot by slot in Python, ~0.2 us by the native core;
    pika's ``BasicProperties`` 3.5 us through copy.copy)."""
    cls = obj.__class__
    try:
        plan = _copy_plans[cls]
    except KeyError:
        plan = _copy_plans[cls] = _copy_plan(cls)
    if plan is None:
        return copy.copy(obj)
    names, every, descriptors = plan
    new: T = object.__new__(cls) if descriptors is None else _copy_slots(obj, descriptors)  # type: ignore[misc]
    state = getattr(obj, "__dict__", None)
    if state:
        new.__dict__.update(state)
    if descriptors is not None:
        return new
    if every is not None:
        try:
            for name, value in zip(names, every(obj), strict=True):  # usually every slot is set
                setattr(new, name, value)
            return new
        except AttributeError:  # a slot never set: one by one below
            pass
    for name in names:
        try:
            value = getattr(obj, name)
        except AttributeError:  # a slot never set stays unset
            continue
        setattr(new, name, value)
    return new


def native_plan(cls: type) -> tuple[Any, ...] | None:
    """For the native attach step (swmp/_native/attach.c): the member descriptors whose slots
    :func:`shallow_copy` copies pointer by pointer for ``cls`` (an empty tuple for a class
    copied through its ``__dict__`` alone), or None when it copies ``cls`` another way
    (``copy.copy``, or slot by slot in Python)."""
    try:
        plan = _copy_plans[cls]
    except KeyError:
        plan = _copy_plans[cls] = _copy_plan(cls)
    if plan is None:
        return None
    names, _every, descriptors = plan
    if descriptors is not None:
        return descriptors
    return () if not names else None


def py_attach(factory: Callable[[], Any], span: Any, properties: Any) -> Any:
    """The attach step of a traced RabbitMQ publish (what ``amqp_send_span`` calls): a copy
    of the caller's properties, or ``factory()`` for none, with the span's headers table."""
    props = factory() if properties is None else shallow_copy(properties)
    props.headers = _mq.amqp_headers(span, props.headers)
    return props


def copy_back(properties: Any, sent: Any) -> None:
    """After a traced aiormq publish: aiormq gives a message without a ``message_id`` one of
    its own, written on the properties it was given, which without the agent are the
    caller's object and here are the copy ``sent``; the caller's ``properties`` get it too
    when they still have none (a ``message_id`` the caller set meanwhile is kept). The only
    field aiormq's ``basic_publish`` writes (6.0 to 7.2.4). Never raises an Exception:
    the native form is publish.c's ``copy_back``."""
    if properties is None or sent is properties:
        return
    try:
        if not properties.message_id and sent.message_id:
            properties.message_id = sent.message_id
    except Exception:  # properties of the caller's own kind: left as they are
        pass


def attach_step(factory: Callable[[], Any]) -> Callable[[Any, Any], Any]:
    """:func:`py_attach` for ``factory``: in C with the native core (swmp/_native/attach.c,
    the same steps with no Python frame), else the Python form."""
    make = getattr(native_core, "amqp_attach", None)
    if make is not None and _copy_slots is not None and _mq.amqp_send_span is not _mq._py_amqp_send_span:
        attach: Callable[[Any, Any], Any] = make(factory, shallow_copy, native_plan)
        return attach
    return functools.partial(py_attach, factory)
