"""Bad settings the agent must survive: refused with one clear warning, or made to fit, and
the application's data still delivered (the settings no earlier test fed it)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from ipc._layout import META_MAX
from reporter_proc.journal import Journal
from reporter_proc.settings import ReporterSettings, settings_from_mapping
from reporter_proc.spooling import SpoolWriter, spool_name
from swmp._arena_meta import arena_meta
from swmp.config import _load, load
from tests.collector import Collector

REPO = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent(
    """
    import swmp
    from swmp import agent
    swmp.start()
    print("agent running:", agent.running(), flush=True)
    for i in range(5):
        with swmp.entry_span(f"/job/{i}"):
            pass
    """
)


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector(enable_http=False) as c:
        yield c


def run_program(tmp_path: Path, collector: Collector, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "SWMP_"))}
    (tmp_path / "shm").mkdir(exist_ok=True)
    env.update(
        {
            "SW_AGENT_COLLECTOR_BACKEND_SERVICES": collector.grpc_address,
            "SW_AGENT_ARENA_DIR": str(tmp_path / "shm"),
            "SW_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
            "SW_AGENT_REPORTER_FLUSH_INTERVAL": "0.05",
            "SW_AGENT_LOG_REPORTER_ACTIVE": "false",
            "SW_AGENT_METER_REPORTER_ACTIVE": "false",
            "SW_AGENT_PROFILE_ACTIVE": "false",
            "PYTHONPATH": str(REPO),
            **extra,
        }
    )
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    return subprocess.run(
        [sys.executable, str(prog)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- names longer than the arena header holds ----------------------------------------------------
@pytest.mark.parametrize(
    "variable", ["SW_AGENT_NAME", "SW_AGENT_INSTANCE_NAME", "SW_AGENT_COLLECTOR_BACKEND_SERVICES"]
)
def test_a_long_name_does_not_keep_the_agent_from_starting(
    tmp_path: Path, collector: Collector, variable: str
) -> None:
    # The header's JSON (service, instance, backends) did not fit its 3968 bytes: "the agent
    # could not start" with an ArenaError traceback that named no setting.
    if variable == "SW_AGENT_COLLECTOR_BACKEND_SERVICES":
        value = ",".join([collector.grpc_address] + [f"backup{i}.example.com:11800" for i in range(300)])
    else:
        value = "n" * 5000
    done = run_program(tmp_path, collector, **{variable: value})
    assert done.returncode == 0, done.stderr
    assert "agent running: True" in done.stdout, done.stderr
    assert "could not start" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "too long for the arena header" in done.stderr
    assert collector.wait_for(lambda: len(collector.segments) >= 5, 20), done.stderr


def test_the_arena_header_of_long_names_fits_and_is_json() -> None:
    cfg = load(
        {}, agent_name="s" * 9000, agent_namespace="n" * 9000, agent_collector_backend_services="b:1," * 900
    )
    data = arena_meta(cfg, 1, "i" * 9000, "process")
    assert len(data) <= META_MAX
    doc = orjson.loads(data)
    assert doc["service"].startswith("sss") and doc["instance"].startswith("iii") and doc["backends"]
    short = arena_meta(load({}, agent_name="svc"), 1, "inst", "thread", "reg.arena")
    assert orjson.loads(short)["service"] == "svc" and orjson.loads(short)["registry"] == "reg.arena"


# -- an authentication token no header can carry --------------------------------------------------
@pytest.mark.parametrize("token", ["tok\nen", "tok\ten", "t\u00f6ken"])
def test_a_token_no_header_can_carry_is_refused_and_not_shown(
    token: str, caplog: pytest.LogCaptureFixture
) -> None:
    _load._reported.clear()  # (each bad value is reported once per process)
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = load({"SW_AGENT_AUTHENTICATION": token})
    assert cfg.agent_authentication == ""
    assert "SW_AGENT_AUTHENTICATION='****' is invalid (must be printable ASCII" in caplog.text
    assert "tok" not in caplog.text
    assert load({"SW_AGENT_AUTHENTICATION": "Bearer abc-123 ~!"}).agent_authentication == "Bearer abc-123 ~!"


def test_the_reporter_refuses_such_a_token_from_its_settings_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="swmp.reporter"):
        s = settings_from_mapping({"authentication": "secret\nvalue"})
    assert s.authentication == ""
    assert "authentication='****' is invalid" in caplog.text and "secret" not in caplog.text


def test_with_a_bad_token_the_data_is_still_delivered(tmp_path: Path, collector: Collector) -> None:
    # gRPC refused the metadata on every call: the keep-alive and profile task failed with
    # ExecuteBatchError, the segments were dropped as "invalid records" and the reporter
    # stopped on an internal error.
    done = run_program(tmp_path, collector, SW_AGENT_AUTHENTICATION="tok\nen")
    assert done.returncode == 0, done.stderr
    assert "agent running: True" in done.stdout, done.stderr
    assert "SW_AGENT_AUTHENTICATION='****' is invalid" in done.stderr
    assert collector.wait_for(lambda: len(collector.segments) >= 5, 20), done.stderr
    assert "invalid record" not in done.stderr and "Illegal header" not in done.stderr, done.stderr


# -- the spool directory of an odd service name ------------------------------------------------------
@pytest.mark.parametrize(
    ("service", "expected"),
    [
        ("orders", "orders"),
        ("a/b|ns", "a_b_ns"),
        ("", "default"),
        (".", "_"),
        ("..", "__"),
        ("x" * 300, "x" * 200),
    ],
)
def test_spool_names(service: str, expected: str) -> None:
    assert spool_name(service) == expected


@pytest.mark.parametrize("service", ["..", "s" * 300])
def test_the_spool_of_an_odd_service_name_is_inside_its_base(tmp_path: Path, service: str) -> None:
    # ".." spooled into the parent of the spool directory; a name over 255 bytes disabled the
    # spool ("File name too long"), so an outage lost the data.
    base = tmp_path / "a" / "spool"
    writer = SpoolWriter.open(Journal(ReporterSettings(service=service, spool_dir=str(base))))
    assert writer is not None
    assert Path(writer.spool.directory).parent == base
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["spool"]


# -- the command line's numbers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        # gRPC listened on 99999 % 65536 = 34463 and said so as if asked; HTTP: OverflowError.
        (["collector", "--memory", "--grpc-port", "99999"], "--grpc-port: must be between 0 and 65535"),
        (["collector", "--memory", "--http-port", "-1"], "--http-port: must be between 0 and 65535"),
        (["collector", "--memory", "--http-port", "x"], "--http-port: not an integer: 'x'"),
        # inf passed "> 0", then int(inf) failed with a traceback
        (["collector", "--memory", "--max-mb", "inf"], "--max-mb: must be a finite number > 0"),
        (["collector", "--memory", "--max-body-mb", "inf"], "--max-body-mb: must be a finite number > 0"),
        # 0 workers: "did not answer within 30 s" after a 30 s wait
        (["demo", "--workers", "0"], "--workers: must be at least 1"),
        (["demo", "--requests", "-5"], "--requests: must be at least 1"),
        (["demo", "--grpc-port", "70000"], "--grpc-port: must be between 0 and 65535"),
    ],
)
def test_out_of_range_numbers_on_the_command_line_are_refused(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "swmp.cli", *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- an arena directory the agent cannot use ------------------------------------------------------------
@pytest.mark.parametrize(("directory", "why"), [("", "No such file or directory"), ("/etc/passwd", "a file")])
def test_an_unusable_arena_directory_is_named_without_a_traceback(
    tmp_path: Path, collector: Collector, directory: str, why: str
) -> None:
    # The start failed with a bare FileNotFoundError / FileExistsError traceback.
    done = run_program(tmp_path, collector, SW_AGENT_ARENA_DIR=directory)
    assert done.returncode == 0, done.stderr
    assert "agent running: False" in done.stdout, done.stderr
    assert f"the agent could not start: SW_AGENT_ARENA_DIR={directory!r} cannot be used ({why}" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


# -- names with blanks around them ------------------------------------------------------------------------
def test_protocol_and_levels_are_read_without_surrounding_blanks() -> None:
    # Numbers and booleans were read so; "http " was refused and gRPC used instead.
    cfg = load(
        {
            "SW_AGENT_PROTOCOL": " HTTP\t",
            "SW_AGENT_LOGGING_LEVEL": "debug ",
            "SW_AGENT_LOG_REPORTER_LEVEL": " error",
        }
    )
    assert cfg.agent_protocol == "http"
    assert (cfg.agent_logging_level, cfg.agent_log_reporter_level) == ("DEBUG", "ERROR")


# -- backend addresses no client can use ----------------------------------------------------------------
# (a list with a usable entry keeps it: tests/test_left_fixes.py)
BAD_ADDRESSES = ["host:", ":11800", "host:99999", "127.0.0.1:abc", ",,b:, :1", "[::1]:0", "[::1]x"]
ADDRESS_SETTINGS = [
    ("SW_AGENT_COLLECTOR_BACKEND_SERVICES", "127.0.0.1:11800"),
    ("SW_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
]


@pytest.mark.parametrize("value", BAD_ADDRESSES)
@pytest.mark.parametrize(("variable", "default"), ADDRESS_SETTINGS)
def test_a_backend_address_without_a_usable_port_is_refused(
    variable: str, default: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    # It was taken as it was: every send failed as if the backend were down (gRPC took
    # 99999 modulo 65536), with no word about the setting.
    _load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = load({variable: value})
    assert (cfg.agent_collector_backend_services, cfg.kafka_bootstrap_servers) == (
        "127.0.0.1:11800",
        "localhost:9092",
    )
    assert f"{variable}={value!r} is invalid (" in caplog.text and f"using {default!r} instead" in caplog.text


@pytest.mark.parametrize(
    "value",
    [
        "oap:11800",
        "oap-1.example.com:11800, oap-2:11800,",
        "[::1]:11800",
        "[::1]",
        "::1",
        "127.0.0.1",
        "http://oap:12800/base",
        "https://oap",
        "dns:///oap:11800",
        "unix:///run/oap.sock",
    ],
)
def test_usable_backend_addresses_are_kept(value: str, caplog: pytest.LogCaptureFixture) -> None:
    _load._reported.clear()
    with caplog.at_level(logging.WARNING, logger="swmp.config"):
        cfg = load({"SW_AGENT_COLLECTOR_BACKEND_SERVICES": value, "SW_KAFKA_BOOTSTRAP_SERVERS": value})
    assert (cfg.agent_collector_backend_services, cfg.kafka_bootstrap_servers) == (value, value)
    assert caplog.text == ""
