"""The in-application tracing core: spans, segments, context, ids, sampling, limits.

``configure(config)`` applies a :class:`swmp.config.Config`; the agent calls it at start.
Everything works before that with defaults (records go to the sink in place, which is a
counting null sink until the agent installs the worker's ring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swmp.tracing import context as _context
from swmp.tracing.constants import Component, Kind, Layer
from swmp.tracing.context import (
    Snapshot,
    active_span,
    capture,
    new_entry_span,
    new_exit_span,
    new_local_span,
    trace_id,
)
from swmp.tracing.identity import identity
from swmp.tracing.ignore import IgnoreRules
from swmp.tracing.limits import limits, stats
from swmp.tracing.sampling import Sampler
from swmp.tracing.segment import Segment
from swmp.tracing.span import NOOP, IgnoredSpan, NoopSpan, Span, current_span

if TYPE_CHECKING:
    from swmp.config import Config

__all__ = [
    "NOOP",
    "Component",
    "IgnoreRules",
    "IgnoredSpan",
    "Kind",
    "Layer",
    "NoopSpan",
    "Sampler",
    "Segment",
    "Snapshot",
    "Span",
    "active_span",
    "capture",
    "configure",
    "current_span",
    "identity",
    "limits",
    "new_entry_span",
    "new_exit_span",
    "new_local_span",
    "stats",
    "trace_id",
]


def configure(config: Config) -> None:
    """Apply the tracing-related settings of ``config`` (limits, sampling, ignore rules, names)."""
    limits.span_limit = config.agent_span_limit
    limits.tag_value_max = config.agent_tag_value_max_length
    limits.log_value_max = config.agent_log_value_max_length
    limits.exception_depth = config.agent_cause_exception_depth
    limits.correlation_max_elements = config.correlation_element_max_number
    limits.correlation_max_value_length = config.correlation_value_max_length
    _context.policy.sampler = Sampler(config.sample_n_per_3_secs)
    _context.policy.sampling = config.sample_n_per_3_secs > 0
    _context.policy.rules = IgnoreRules(
        config.agent_trace_ignore_path, config.agent_ignore_suffix, config.plugin_http_ignore_method
    )
    identity.set(service=config.service_name)
    if config.agent_instance_name:
        identity.set(instance=config.agent_instance_name)
