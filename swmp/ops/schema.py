"""JSON Schemas (draft 2020-12) of ``swmp health --json`` and ``swmp status --json``.

They are the documented contract (docs/operations.md prints the same shapes) and the test
suite validates real output against them. Extra fields may appear in later versions;
existing ones keep their name, type and meaning while ``v`` stays 1.
"""

from __future__ import annotations

from typing import Any

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_NINT = {"type": ["integer", "null"]}
_NNUM = {"type": ["number", "null"]}
_NSTR = {"type": ["string", "null"]}


def _obj(props: dict[str, Any], extra: bool = True) -> dict[str, Any]:
    return {"type": "object", "required": sorted(props), "properties": props, "additionalProperties": extra}


# Figures each health check reports, by check name.
CHECK_FIGURES: dict[str, dict[str, Any]] = {
    "reporter": _obj({"pid": _NINT, "last_pid": _NINT, "starts": _INT, "restarts": _NINT, "uptime_s": _NNUM}),
    "heartbeat": _obj({"age_s": _NNUM, "max_age_s": _NUM}),
    "rings": _obj(
        {
            "slots_with_data": _INT,
            "waiting_bytes": _INT,
            "stuck_slots": {"type": "array", "items": _INT},
            "held_by_backend": _BOOL,
        }
    ),
    "backend": _obj(
        {
            "address": _NSTR,
            "state": {"enum": ["unknown", "ok", "failing"]},
            "last_success_age_s": _NNUM,
            "last_error_age_s": _NNUM,
            "last_error": _STR,
            "consecutive_failures": _INT,
            "window_s": _NUM,
            "in_grace": _BOOL,
        }
    ),
    "drops": _obj(
        {
            "over": {"enum": ["interval", "totals"]},
            "seconds": _NNUM,
            "offered": _INT,
            "dropped": _INT,
            "ring_dropped": _INT,
            "unbuilt": _INT,
            "stale": _INT,
            "prestart": _INT,
            "reporter_dropped": _INT,
            "no_slot_dropped": _INT,
            "helper_dropped": _INT,
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "max_ratio": _NUM,
        }
    ),
    "spool": _obj({"enabled": _BOOL, "bytes": _INT, "cap": _INT, "records": _INT, "fill_ratio": _NNUM}),
    "supervisor": _obj({"pid": _NINT, "alive": {"type": ["boolean", "null"]}, "replaced": _INT}),
}


def _check_schema(name: str) -> dict[str, Any]:
    return _obj(
        {
            "name": {"const": name},
            "status": {"enum": ["ok", "fail", "skip"]},
            "selected": _BOOL,
            "message": _STR,
            "figures": CHECK_FIGURES[name],
        }
    )


HEALTH_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "swmp health --json",
    **_obj(
        {
            "v": {"const": 1},
            "command": {"const": "health"},
            "mode": {"enum": ["all", "liveness", "readiness"]},
            "healthy": _BOOL,
            "exit_code": {"enum": [0, 1, 2]},
            "time_ns": _INT,
            "interval_s": _NUM,
            "thresholds": _obj(
                {
                    "max_heartbeat_age_s": _NUM,
                    "backend_window_s": _NUM,
                    "backend_failures": _INT,
                    "max_drop_ratio": _NUM,
                }
            ),
            "agents": {
                "type": "array",
                "items": _obj(
                    {
                        "arena": _STR,
                        "service": _NSTR,
                        "namespace": _NSTR,
                        "owner_pid": _INT,
                        "reporter_pid": _NINT,
                        "healthy": _BOOL,
                        # The six checks, always all present, always in this order.
                        "checks": {
                            "type": "array",
                            "prefixItems": [_check_schema(n) for n in CHECK_FIGURES],
                            "minItems": len(CHECK_FIGURES),
                            "items": False,
                        },
                    }
                ),
            },
            "error": _NSTR,
            "notes": {"type": "array", "items": _STR},
        }
    ),
}

_SLOT = _obj(
    {
        "slot": _INT,
        "pid": _NINT,
        "alive": _BOOL,
        "last_pid": _NINT,
        "instance": _NSTR,
        "last_keepalive_age_s": _NNUM,
        "written": _INT,
        "dropped": _INT,
        "unbuilt": _INT,
        "stale": _INT,
        "prestart": _INT,
        "bad_input": _INT,
        "read": _INT,
        "used_bytes": _INT,
        "capacity": _INT,
        "fill_ratio": _NUM,
        "high_water": _INT,
        "records_per_s": _NNUM,
    }
)
_COUNTS = {"type": "object", "additionalProperties": _INT}

STATUS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "swmp status --json",
    **_obj(
        {
            "v": {"const": 1},
            "command": {"const": "status"},
            "time_ns": _INT,
            "interval_s": _NUM,
            "agents": {
                "type": "array",
                "items": _obj(
                    {
                        "arena": _STR,
                        "service": _NSTR,
                        "namespace": _NSTR,
                        "instance": _NSTR,
                        "protocol": _NSTR,
                        "mode": _NSTR,
                        "backends": {"type": "array", "items": _STR},
                        "authentication": _STR,
                        "owner_pid": _INT,
                        "owner_alive": _BOOL,
                        "created_ns": _INT,
                        "reporter": _obj(
                            {
                                "pid": _NINT,
                                "alive": _BOOL,
                                "last_pid": _NINT,
                                "started_ns": _INT,
                                "uptime_s": _NNUM,
                                "starts": _INT,
                                "restarts": _NINT,
                                "heartbeat_age_s": _NNUM,
                                "sleeping": _BOOL,
                                "document": _BOOL,
                                "document_error": _NSTR,
                            }
                        ),
                        "backend": _obj(
                            {
                                "address": _NSTR,
                                "state": {"enum": ["unknown", "ok", "failing"]},
                                "last_success_age_s": _NNUM,
                                "last_error": _STR,
                                "last_error_age_s": _NNUM,
                                "consecutive_failures": _INT,
                            }
                        ),
                        "totals": _obj(
                            {
                                "written": _INT,
                                "ring_dropped": _INT,
                                "ring_skipped": _INT,
                                "unbuilt": _INT,
                                "stale": _INT,
                                "prestart": _INT,
                                "bad_input": _INT,
                                "read": _INT,
                                "sent": _INT,
                                "retried": _INT,
                                "failed": _INT,
                                "reporter_dropped": _INT,
                                "no_slot_dropped": _INT,
                                "no_slot_workers": _INT,
                                "helper_dropped": _INT,
                                "master_dropped": _INT,
                                "late_dropped": _INT,
                                "spooled": _INT,
                            }
                        ),
                        "read": _COUNTS,
                        "sent": _COUNTS,
                        "dropped": _COUNTS,
                        "spool": _obj({"enabled": _BOOL, "bytes": _INT, "cap": _INT, "records": _INT}),
                        "pending_bytes": _INT,
                        "rates": _obj({"written_per_s": _NNUM, "read_per_s": _NNUM, "sent_per_s": _NNUM}),
                        "slots": {"type": "array", "items": _SLOT},
                        "idle_slots": _INT,
                        "profile": _obj({"commands_refused": _INT}),
                    }
                ),
            },
            "error": _NSTR,
            "notes": {"type": "array", "items": _STR},
        }
    ),
}
