"""Configuration: declarations, environment and keyword parsing, bad values, generated doc."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from swmp import config as C

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_is_declared_with_env_doc_and_kwarg_mapping() -> None:
    seen_env = set()
    for s in C.settings():
        assert s.env.startswith("SW_"), s
        assert s.doc and s.section, s
        assert s.env not in seen_env
        seen_env.add(s.env)
        if not s.prefix:
            assert C.env_to_kwarg(s.env) == s.name, s
    # Peer-agent names the brief asks for are kept.
    for env in (
        "SW_AGENT_NAME",
        "SW_AGENT_INSTANCE_NAME",
        "SW_AGENT_NAMESPACE",
        "SW_AGENT_COLLECTOR_BACKEND_SERVICES",
        "SW_AGENT_PROTOCOL",
        "SW_AGENT_AUTHENTICATION",
        "SW_AGENT_FORCE_TLS",
        "SW_AGENT_LOGGING_LEVEL",
        "SW_KAFKA_BOOTSTRAP_SERVERS",
        "SW_KAFKA_NAMESPACE",
        "SW_KAFKA_TOPIC_SEGMENT",
        "SW_AGENT_TRACE_IGNORE_PATH",
        "SW_AGENT_IGNORE_SUFFIX",
        "SW_SAMPLE_N_PER_3_SECS",
        "SW_CORRELATION_ELEMENT_MAX_NUMBER",
        "SW_CORRELATION_VALUE_MAX_LENGTH",
        "SW_AGENT_LOG_REPORTER_ACTIVE",
        "SW_AGENT_LOG_REPORTER_LEVEL",
        "SW_AGENT_METER_REPORTER_ACTIVE",
        "SW_AGENT_METER_REPORTER_PERIOD",
        "SW_AGENT_PROFILE_ACTIVE",
        "SW_AGENT_DISABLE_PLUGINS",
        "SW_AGENT_SPAN_LIMIT",
        "SW_PLUGIN_HTTP_IGNORE_METHOD",
        "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD",
        "SW_AGENT_COLLECTOR_PROPERTIES_REPORT_PERIOD_FACTOR",
        "SW_AGENT_REPORTER_PROCESS",
        "SW_AGENT_ARENA_DIR",
        "SW_AGENT_ARENA_SLOTS",
        "SW_AGENT_RING_SIZE",
        "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT",
        "SW_AGENT_REPORTER_BATCH_SIZE",
        "SW_AGENT_SPOOL_DIR",
        "SW_AGENT_SPOOL_MAX_BYTES",
        "SW_AGENT_TAG_VALUE_MAX_LENGTH",
        "SW_AGENT_LOG_VALUE_MAX_LENGTH",
    ):
        assert env in seen_env, env


def test_defaults_without_environment() -> None:
    cfg = C.load({})
    assert cfg == C.Config()
    assert cfg.agent_reporter_process is True
    assert cfg.agent_arena_dir == "/dev/shm"
    assert cfg.agent_arena_slots == 64
    assert cfg.agent_ring_size == 4 * 1024 * 1024
    assert ".css" in cfg.agent_ignore_suffix


def test_environment_values_are_parsed() -> None:
    env = {
        "SW_AGENT_NAME": "orders",
        "SW_AGENT_NAMESPACE": "prod",
        "SW_AGENT_FORCE_TLS": "TRUE",
        "SW_AGENT_REPORTER_PROCESS": "off",
        "SW_SAMPLE_N_PER_3_SECS": " 7 ",
        "SW_AGENT_RING_SIZE": "1M",
        "SW_AGENT_TRACE_IGNORE_PATH": "/health, /static/**",
        "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD": "2.5",
        "SW_AGENT_PROTOCOL": "HTTP",
        "SW_KAFKA_REPORTER_CONFIG_ACKS": "all",
        "SW_KAFKA_REPORTER_CONFIG_COMPRESSION_TYPE": "gzip",
        "SW_KAFKA_REPORTER_TOPIC_LOG": "my-logs",  # accepted alias
    }
    cfg = C.load(env)
    assert cfg.agent_name == "orders"
    assert cfg.service_name == "orders|prod"
    assert cfg.agent_force_tls is True
    assert cfg.agent_reporter_process is False
    assert cfg.sample_n_per_3_secs == 7
    assert cfg.agent_ring_size == 1024 * 1024
    assert cfg.agent_trace_ignore_path == ("/health", "/static/**")
    assert cfg.agent_collector_heartbeat_period == 2.5
    assert cfg.agent_protocol == "http"
    assert cfg.kafka_reporter_config == {"acks": "all", "compression_type": "gzip"}
    assert cfg.kafka_topic_log == "my-logs"


def test_keywords_override_environment() -> None:
    cfg = C.load(
        {"SW_AGENT_NAME": "from-env", "SW_AGENT_SPAN_LIMIT": "10"},
        agent_name="kw",
        agent_span_limit=5,
        agent_disable_plugins=["httpx", "django"],
    )
    assert cfg.agent_name == "kw"
    assert cfg.agent_span_limit == 5
    assert cfg.agent_disable_plugins == ("httpx", "django")


@pytest.mark.parametrize(
    ("env", "value", "why"),
    [
        ("SW_AGENT_ARENA_SLOTS", "many", "not an integer"),
        ("SW_AGENT_RING_SIZE", "3000", "power of two"),
        ("SW_AGENT_FORCE_TLS", "maybe", "not a boolean"),
        ("SW_AGENT_PROTOCOL", "carrier-pigeon", "must be one of"),
        ("SW_AGENT_REPORTER_FLUSH_INTERVAL", "nan", "finite"),
        ("SW_SAMPLE_N_PER_3_SECS", "-1", ">= 0"),
        ("SW_AGENT_LOGGING_LEVEL", "LOUD", "must be one of"),
        ("SW_AGENT_METER_REPORTER_PERIOD", "1e10", "between 1 and 86400 seconds"),
        ("SW_AGENT_REPORTER_PROCESS", "", "not a boolean"),  # Kubernetes `value: ""`
        ("SW_AGENT_PROFILE_ACTIVE", " ", "not a boolean"),
        # A segment is sampled no longer than its task runs: SkyWalking's 1 to 15 minutes.
        ("SW_AGENT_PROFILE_DURATION", "16", "between 1 and 15 minutes"),
        ("SW_AGENT_PROFILE_DURATION", "1000000000", "between 1 and 15 minutes"),
        ("SW_AGENT_PROFILE_DURATION", "0", "between 1 and 15 minutes"),
    ],
)
def test_invalid_value_is_reported_once_and_default_used(
    env: str, value: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    C._load._reported.clear()
    default = C.load({})
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = C.load({env: value})
        C.load({env: value})  # a worker re-loading: not reported again
    name = C.env_to_kwarg(env)
    assert getattr(cfg, name) == getattr(default, name)
    msgs = [r.getMessage() for r in caplog.records if env in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert value in msgs[0] and why in msgs[0] and "using" in msgs[0]


def test_the_profile_duration_accepts_a_tasks_whole_range() -> None:
    assert C.load({"SW_AGENT_PROFILE_DURATION": "1"}).agent_profile_duration == 1
    assert C.load({"SW_AGENT_PROFILE_DURATION": "15"}).agent_profile_duration == 15
    assert C.load({}).agent_profile_duration == 10


def test_an_empty_boolean_is_refused_like_an_empty_number(caplog: pytest.LogCaptureFixture) -> None:
    """Never silently false: every boolean keeps its default, each refusal is logged."""
    C._load._reported.clear()
    booleans = [s for s in C.settings() if s.type_name == "bool"]
    assert len(booleans) > 10
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = C.load({s.env: "" for s in booleans})
        kw = C.load({}, **{s.name: "" for s in booleans})
    for s in booleans:
        assert getattr(cfg, s.name) == s.default and getattr(kw, s.name) == s.default, s.env
        assert any(f"{s.env}='' is invalid" in r.getMessage() for r in caplog.records), s.env
    assert cfg.agent_reporter_process is True  # the reporter process stays on


def test_every_setting_in_seconds_is_at_most_a_day(caplog: pytest.LogCaptureFixture) -> None:
    """Each reaches a wait, sleep or timer, which overflow on huge values (Event.wait above
    threading.TIMEOUT_MAX killed the meter thread): above a day is refused, the default used."""
    timed = {s.env: s for s in C.settings() if s.type_name == "float"}
    assert set(timed) == {  # a new float setting must be looked at here
        "SW_AGENT_COLLECTOR_HEARTBEAT_PERIOD",
        "SW_AGENT_METER_REPORTER_PERIOD",
        "SW_AGENT_COLLECTOR_GET_PROFILE_TASK_INTERVAL",
        "SW_AGENT_REPORTER_FLUSH_INTERVAL",
        "SW_AGENT_REPORTER_SEND_TIMEOUT",
        "SW_AGENT_REPORTER_SHUTDOWN_TIMEOUT",
    }
    assert C.MAX_SECONDS == 86400
    C._load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        huge = C.load({env: "1e10" for env in timed})
        kw = C.load({}, **{s.name: 86400.5 for s in timed.values()})
    day = C.load({env: "86400" for env in timed})
    for env, s in timed.items():
        assert getattr(huge, s.name) == s.default and getattr(kw, s.name) == s.default, env
        assert getattr(day, s.name) == 86400.0, env
        assert any(f"{env}='1e10' is invalid" in r.getMessage() for r in caplog.records), env


def test_unknown_keyword_is_reported_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    C._load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = C.load({}, agent_nmae="typo", agent_name="ok")
    assert cfg.agent_name == "ok"
    assert any("agent_nmae" in r.getMessage() for r in caplog.records)


def test_bad_keyword_type_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    C._load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = C.load({}, agent_span_limit="lots", agent_force_tls="yes")
    assert cfg.agent_span_limit == 300
    assert cfg.agent_force_tls is True
    assert any("agent_span_limit" in r.getMessage() for r in caplog.records)


def test_to_reporter_settings() -> None:
    cfg = C.load(
        {
            "SW_AGENT_NAME": "svc",
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": "a:11800, b:11800",
            "SW_KAFKA_NAMESPACE": "ns",
            "SW_KAFKA_REPORTER_CONFIG_COMPRESSION_TYPE": "lz4",
            "SW_KAFKA_REPORTER_CONFIG_LINGER_MS": "5",
            "SW_AGENT_PROTOCOL": "http",
            "SW_AGENT_SPOOL_DIR": "/tmp/spool",
        }
    )
    rs = cfg.to_reporter_settings()
    assert rs.service == "svc"
    assert rs.backends == ("a:11800", "b:11800")
    assert rs.protocol == "http"
    assert rs.kafka_topic_segment == "skywalking-segments"
    assert rs.kafka_namespace == "ns"
    assert rs.kafka_compression == "lz4"
    assert rs.kafka_extra == {"linger_ms": "5"}
    assert rs.meter_enabled is False and rs.profile_enabled is False  # no HTTP receivers for them
    assert rs.spool_dir == "/tmp/spool"
    assert rs.keepalive_interval_s == cfg.agent_collector_heartbeat_period


def test_instance_properties_json(caplog: pytest.LogCaptureFixture) -> None:
    assert C.parse_instance_properties(C.load({"SW_AGENT_INSTANCE_PROPERTIES_JSON": '{"a": 1}'})) == {
        "a": "1"
    }
    C._load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        assert C.parse_instance_properties(C.load({"SW_AGENT_INSTANCE_PROPERTIES_JSON": "{"})) == {}
    assert caplog.records


def test_generated_configuration_doc_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_config_doc.py"), "--check"],
        capture_output=True,
        check=False,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr + " (run: python scripts/gen_config_doc.py)"
    text = (ROOT / "docs" / "configuration.md").read_text()
    for s in C.settings():
        assert f"`{s.env}`" in text


def test_every_declared_setting_is_read_by_the_code() -> None:
    """A documented setting nothing reads is a promise the code does not keep: each field
    must be used somewhere besides its own declaration."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    texts = [
        p.read_text()
        for d in ("swmp", "reporter_proc", "ipc")
        for p in (root / d).rglob("*.py")
        if "generated" not in p.parts
    ]
    unread = []
    for s in C.settings():
        declaration = re.compile(rf"^\s+{s.name}:\s*[^=\n]+=\s*opt\(", re.M)
        uses = sum(len(re.findall(rf"\b{s.name}\b", t)) - len(declaration.findall(t)) for t in texts)
        if uses < 1:
            unread.append(s.env)
    assert not unread, f"declared and documented, but never read: {unread}"
