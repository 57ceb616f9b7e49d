"""gRPC (grpcio): entry spans on server methods, exit spans on client calls, sync and
``grpc.aio``, unary and streaming (component GRPC, 23; layer RPCFramework).

Servers: ``grpc.server`` and ``grpc.aio.server`` register traced method handlers, or,
when the application gives them interceptors, get our interceptor first
(``_grpc_server``). Clients: channels from ``grpc.insecure_channel`` /
``grpc.secure_channel`` and the ``grpc.aio`` forms hand out traced multicallables
(``_grpc_client``). Operation names are full method names (``/package.Service/Method``), as
the SkyWalking Python agent reports them; ``SW_PLUGIN_GRPC_IGNORED_METHODS`` leaves methods
untraced on both sides.

Channels created by the agent's own reporter (its thread, in
``SW_AGENT_REPORTER_PROCESS=false`` mode, or the reporter process) are left exactly as they
are: the telemetry the agent ships is never traced nor given ``sw8``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from swmp.instrument._grpc_client import KINDS, ClientTracing
from swmp.instrument._grpc_registration import ServerTracing
from swmp.instrument._incoming import reporter_is_calling
from swmp.instrument._patch import patch, restore

if TYPE_CHECKING:
    from swmp.config import Config

NAME = "grpc"
PEER_NAMES = ("sw_grpc",)  # the SkyWalking Python agent's plugin module(s)
PACKAGE = "grpcio"
SUPPORTED = ("1.48", "2")  # aio ServicerContext.add_done_callback / code() since 1.48
TRIGGER = "grpc"  # grpc/__init__ imports grpc.aio at its end


class IgnoredMethods:
    """``SW_PLUGIN_GRPC_IGNORED_METHODS``: the peer agent joins the entries into one
    case-insensitive regular expression matched against the whole method name; so do we
    (exact names when the entries are not a valid expression). Answers are cached: a
    service has a handful of methods."""

    def __init__(self, entries: Sequence[str]) -> None:
        names = [e.strip() for e in entries if e.strip()]
        self._exact = frozenset(n.lower() for n in names)
        self._rx: re.Pattern[str] | None = None
        if names:
            try:
                self._rx = re.compile("^(?:" + "|".join(names) + ")$", re.IGNORECASE)
            except re.error:
                self._rx = None
        self._cache: dict[str, bool] = {}

    def __call__(self, method: str) -> bool:
        if not self._exact:
            return False
        hit = self._cache.get(method)
        if hit is None:
            rx = self._rx
            hit = bool(rx.match(method)) if rx is not None else method.lower() in self._exact
            if len(self._cache) < 4096:
                self._cache[method] = hit
        return hit


def _traced_server(orig: Callable[..., Any], tracing: ServerTracing, aio: bool) -> Any:
    """A wrapper of ``grpc.server`` / ``grpc.aio.server``: with interceptors of the
    application's, ours goes first among them; without, the server registers traced
    handlers (``ServerTracing``)."""
    sig = inspect.signature(orig)
    ours = tracing.aio_interceptor if aio else tracing.sync_interceptor

    def server(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
            theirs = list(bound.arguments.get("interceptors") or ())
            if theirs:
                bound.arguments["interceptors"] = [ours, *theirs]
            elif bound.arguments.get("handlers"):
                bound.arguments["handlers"] = [tracing.generic(h, aio) for h in bound.arguments["handlers"]]
        except Exception:
            return orig(*args, **kwargs)  # a wrong call: let the library raise its own error
        made = orig(*bound.args, **bound.kwargs)
        if not theirs:
            try:
                tracing.trace_server(made, aio)
            except Exception:
                pass
        return made

    return server


def _marking(orig: Callable[..., Any], clients: ClientTracing) -> Any:
    """A wrapper of a channel factory: the application's channels are marked for tracing,
    the reporter's are left as they are."""

    def channel(*args: Any, **kwargs: Any) -> Any:
        ch = orig(*args, **kwargs)
        if not reporter_is_calling():
            clients.mark(ch, args[0] if args else kwargs.get("target", ""))
        return ch

    return channel


def install(config: Config) -> None:
    import grpc  # noqa: PLC0415
    from grpc import _channel, aio  # noqa: PLC0415
    from grpc.aio import _channel as aio_channel  # noqa: PLC0415

    ignored = IgnoredMethods(config.plugin_grpc_ignored_methods)
    servers = ServerTracing(ignored)
    clients = ClientTracing(ignored)
    for name in ("insecure_channel", "secure_channel"):
        patch(grpc, name, lambda orig: _marking(orig, clients))
        patch(aio, name, lambda orig: _marking(orig, clients))
    for kind in KINDS:
        patch(_channel.Channel, kind, functools.partial(clients.factory, kind=kind, aio=False))
        patch(aio_channel.Channel, kind, functools.partial(clients.factory, kind=kind, aio=True))
    patch(grpc, "server", lambda orig: _traced_server(orig, servers, aio=False))
    patch(aio, "server", lambda orig: _traced_server(orig, servers, aio=True))


def uninstall() -> None:
    import grpc  # noqa: PLC0415
    from grpc import _channel, aio  # noqa: PLC0415
    from grpc.aio import _channel as aio_channel  # noqa: PLC0415

    for owner, name in (
        (grpc, "server"),
        (grpc, "insecure_channel"),
        (grpc, "secure_channel"),
        (aio, "server"),
        (aio, "insecure_channel"),
        (aio, "secure_channel"),
        *((_channel.Channel, kind) for kind in KINDS),
        *((aio_channel.Channel, kind) for kind in KINDS),
    ):
        restore(owner, name)
