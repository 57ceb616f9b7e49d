"""Who is reporting: the service and instance names stamped on every record.

A small mutable holder rather than config: the agent sets it after fork, per worker (each
worker is its own instance, named after its ring slot). It also caches the base64 forms the
``sw8`` header needs, so injecting a header does not re-encode constant strings.
"""

from __future__ import annotations

import os
import socket

from swmp.propagation import b64


class Identity:
    __slots__ = ("instance", "instance_b64", "service", "service_b64")

    def __init__(self) -> None:
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


def default_instance() -> str:
    """Fallback instance name before the agent assigns one: ``<pid>@<hostname>``."""
    try:
        host = socket.gethostname()
    except OSError:
        host = "localhost"
    return f"{os.getpid()}@{host}"


identity = Identity()
