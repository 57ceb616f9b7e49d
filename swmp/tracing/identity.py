"""Who is reporting: the service and instance names stamped on every record.

A small mutable holder rather than config: the agent sets it after fork, per worker (each
worker is its own instance, named after its ring slot). It also caches the base64 forms the
``sw8`` header needs, so injecting a header does not re-encode constant strings.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from swmp.propagation import b64


class Identity:
    __slots__ = ("_binder", "instance", "instance_b64", "service", "service_b64", "unbound")

    def __init__(self) -> None:
        # ``unbound`` is checked once per new segment: True until this process has been
        # given its reporting identity (its ring slot and instance name). It makes the
        # first segment of a process - whose outgoing sw8 header carries the instance name -
        # bind before anything is built, instead of on its first record written.
        self.unbound = False
        self._binder: Callable[[], None] | None = None
        self.service = ""
        self.instance = ""
        self.service_b64 = ""
        self.instance_b64 = ""
        self.set("Python Service Name", default_instance())

    def set(self, service: str | None = None, instance: str | None = None) -> None:
        """Change the names; readers see either the old or the new pair of each field."""
        if service is not None:
            self.service_b64 = b64(service)
            self.service = service
        if instance is not None:
            self.instance_b64 = b64(instance)
            self.instance = instance

    def set_binder(self, binder: Callable[[], None] | None) -> None:
        """Install what names this process (the agent's sink); armed until first used."""
        self._binder = binder
        self.unbound = binder is not None

    def bind(self) -> None:
        """Called by the first segment of a process while ``unbound``; never raises."""
        self.unbound = False
        binder = self._binder
        if binder is not None:
            try:
                binder()
            except Exception:  # the sink logs its own failures; tracing goes on regardless
                pass


def default_instance() -> str:
    """Fallback instance name before the agent assigns one: ``<pid>@<hostname>``."""
    try:
        host = socket.gethostname()
    except OSError:
        host = "localhost"
    return f"{os.getpid()}@{host}"


identity = Identity()
