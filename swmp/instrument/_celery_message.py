"""A Celery publish span's ``sw8`` headers, written into the task message Celery builds.

Handing them to ``Celery.send_task`` as its ``headers=`` option cost every publish ~6,700
instructions, a fifth of the whole publish span: ``headers`` is a named parameter of
neither ``send_task`` nor ``AMQP.as_task_v2``, and CPython matches a keyword that lands in
``**options`` against every one of a function's ~30 parameter names with a full string
comparison, twice per publish. Instead, the publish wrapper *arms* this module for the
duration of the original ``send_task`` call, and ``celery.app.amqp.task_message`` (the
namedtuple ``as_task_v1`` / ``as_task_v2`` build every message with) is replaced by a
subclass that adds the armed headers to the new message's header dict: the same headers in
the same message, and no option passed.

Used only for an app whose AMQP object builds its messages with Celery's own
``as_task_v1`` / ``as_task_v2`` (a custom ``amqp`` class may not call ``task_message``); the
wrapper passes ``headers=`` as before for any other app, and when the caller gave headers
of its own (a retry copies its request's: theirs are replaced, not merged).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from swmp.instrument._patch import patch, restore

log = logging.getLogger("swmp.instrument")
_missed: list[bool] = []  # one entry once an app did (logged once per process)

_FIELDS = ("headers", "properties", "body", "sent_event")
# The armed headers, one dict in a list: the message builder pops it (an empty list after
# the call: consumed).
_armed: ContextVar[list[dict[str, str]] | None] = ContextVar("swmp_celery_message", default=None)
arm = _armed.set
disarm = _armed.reset
_get_armed = _armed.get
_tuple_new = tuple.__new__
# Celery's own message builders (AMQP.as_task_v1, AMQP.as_task_v2), once task_message is ours.
_builders: tuple[Any, ...] = ()


def _carrying(base: type) -> type:
    """``base`` (Celery's ``task_message``) with the armed headers added to a new message's."""

    class task_message(base):  # type: ignore[misc]
        __slots__ = ()

        def __new__(cls, headers: Any, properties: Any, body: Any, sent_event: Any) -> Any:
            box = _get_armed()
            if box and headers.__class__ is dict:
                headers.update(box.pop())
            return _tuple_new(cls, (headers, properties, body, sent_event))

    return task_message


def builds_stock_messages(app: Any) -> bool:
    """Whether ``app``'s messages are built by Celery's own builders (through our type)."""
    try:
        return getattr(app.amqp.create_task_message, "__func__", None) in _builders
    except Exception:
        return False


def missed(app: Any) -> None:
    """An armed send built no message through us (its message went without ``sw8``): said
    once; the caller stops arming for this app."""
    if not _missed:
        _missed.append(True)
        log.warning(
            "swmp: Celery app %r built a task message without celery.app.amqp.task_message; "
            "its messages now carry the trace as a headers option",
            getattr(app, "main", "?"),
        )


def install() -> None:
    global _builders
    from celery.app import amqp  # noqa: PLC0415 (only when the application has Celery)

    builders = (amqp.AMQP.as_task_v1, amqp.AMQP.as_task_v2)
    if getattr(amqp.task_message, "_fields", None) != _FIELDS or not all(
        "task_message" in b.__code__.co_names for b in builders
    ):
        return  # a Celery that builds its messages otherwise: headers go as an option
    patch(amqp, "task_message", _carrying)
    _builders = builders


def uninstall() -> None:
    global _builders
    from celery.app import amqp  # noqa: PLC0415

    _builders = ()
    restore(amqp, "task_message")
