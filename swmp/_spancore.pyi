from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from swmp.tracing.segment import Segment

class SpanCore:
    segment: Segment
    span_id: int
    parent_id: int
    start: int
    end: int
    op: str
    peer: str
    kind: int
    layer: int
    component: int
    is_error: bool
    tags: Any
    logs: Any
    refs: Any
    _prev: Any
    def __init__(
        self,
        segment: Segment,
        span_id: int,
        parent_id: int,
        op: str,
        kind: int,
        layer: int,
        component: int,
        peer: str,
        /,
    ) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, et: Any, ev: Any, tb: Any, /) -> None: ...
    def finish(self, end_ms: int | None = None) -> None: ...

def setup(current_span: ContextVar[Any], empty: tuple[()], count_lost: Callable[[], None], /) -> None: ...
def rows(spans: list[Any], skip_analysis: bool, /) -> list[list[Any]]: ...
def split_sw8(value: str, /) -> tuple[bool, str, str, int, str] | None: ...
def sw8_header(span: Any, service_b64: str, instance_b64: str, /) -> str | None: ...
def setup_entry(
    segment_class: type,
    entry_kind: int,
    policy: Any,
    rules_type: type,
    profile_gate: Any,
    carrier_type: type,
    cross_process_ref: Callable[[Any], list[Any]],
    /,
) -> None: ...
def entry_root(op: str, component: int, layer: int, carrier: Any, /) -> Any: ...
def setup_status(tags: dict[int, tuple[str, str]], limits: Any, /) -> None: ...
def setup_recorder(slow: Callable[[Any, Any], None], call: Callable[..., Any], /) -> None: ...
def setup_sender(
    span_class: type, send_slow: Callable[[Any, Any], None], send_call: Callable[..., Any], /
) -> None: ...
def status_recorder(span: Any, start_response: Callable[..., Any], /) -> Callable[..., Any]: ...
def status_sender(span: Any, send: Any, /) -> Any: ...
def wsgi_body(result: Any, span: Any, /) -> Any: ...
