"""Meters: values, record layout and wire shape, modes, buckets, threads, fork, PVM."""

from __future__ import annotations

import gc
import math
import os
import sys
import threading
import time
from typing import Any

import orjson
import pytest

from reporter_proc import encode
from reporter_proc.protocol.generated import meter_pb2
from reporter_proc.records import METER, METER_HISTOGRAM, METER_SINGLE
from swmp import _sink, meters
from swmp.config import Config
from swmp.meters import RATE, Counter, Gauge, Histogram
from swmp.tracing.identity import identity

DEADLINE_S = 20.0  # generous upper bound for "the thread reported"; never asserted as a timing


def _config(period: float = 3600.0, pvm: bool = False) -> Config:
    return Config(agent_meter_reporter_period=period, agent_pvm_meter_reporter_active=pvm)


def _records(memory: _sink.MemorySink) -> list[list[Any]]:
    return [orjson.loads(p) for t, p in list(memory.records) if t == METER]


def _by_name(record: list[Any]) -> dict[str, list[Any]]:
    return {m[1]: m for m in record[3]}


def _wait_for(predicate: Any) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


# -- record layout and wire shape ----------------------------------------------------------------
def test_record_layout_and_wire_shape(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    requests = Counter("requests", labels={"route": "/a", "method": "GET"})
    Gauge("queue_depth", supplier=lambda: 7)
    latency = Histogram("latency_ms", steps=[10, 100], labels=[("route", "/a")])
    requests.increment()
    requests.increment(2.5)
    for v in (0, 5, 10, 99, 100, 1000):
        latency.observe(v)

    before = int(time.time() * 1000)
    assert meters.report() is True
    after = int(time.time() * 1000)

    (rec,) = _records(meter_sink)
    timestamp, service, instance, entries = rec
    assert before <= timestamp <= after
    assert (service, instance) == (identity.service, identity.instance)
    assert _by_name(rec) == {
        # labels are sorted by name, flat [name, value, ...]
        "requests": [METER_SINGLE, "requests", ["method", "GET", "route", "/a"], 3.5],
        "queue_depth": [METER_SINGLE, "queue_depth", [], 7.0],
        "latency_ms": [
            METER_HISTOGRAM,
            "latency_ms",
            ["route", "/a"],
            [[0.0, 2, False], [10.0, 2, False], [100.0, 2, False]],
        ],
    }
    assert len(entries) == 3

    collection = meter_pb2.MeterDataCollection()
    collection.ParseFromString(encode.meter_collection(rec))
    datas = {(d.singleValue.name or d.histogram.name): d for d in collection.meterData}
    assert set(datas) == {"requests", "queue_depth", "latency_ms"}
    for d in collection.meterData:
        assert (d.service, d.serviceInstance, d.timestamp) == (service, instance, timestamp)
    single = datas["requests"].singleValue
    assert single.value == 3.5
    assert [(lb.name, lb.value) for lb in single.labels] == [("method", "GET"), ("route", "/a")]
    assert datas["queue_depth"].singleValue.value == 7.0
    hist = datas["latency_ms"].histogram
    assert [(lb.name, lb.value) for lb in hist.labels] == [("route", "/a")]
    assert [(b.bucket, b.count, b.isNegativeInfinity) for b in hist.values] == [
        (0.0, 2, False),
        (10.0, 2, False),
        (100.0, 2, False),
    ]


def test_nothing_declared_writes_nothing(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    assert meters.report() is False
    assert meter_sink.records == []


# -- counters --------------------------------------------------------------------------------
def test_rate_reports_deltas_increment_reports_totals(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    rate = Counter("rate", mode=RATE)
    total = Counter("total")  # INCREMENT is the default, as in the Java agent
    seen: list[tuple[float, float]] = []
    for add in (3, 2, 0):
        for _ in range(add):
            rate.increment()
            total.increment()
        meters.report()
        got = _by_name(_records(meter_sink)[-1])
        seen.append((got["rate"][3], got["total"][3]))
    assert seen == [(3.0, 3.0), (2.0, 5.0), (0.0, 5.0)]


class _Refusing:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, rtype: int, payload: bytes) -> bool:
        self.calls += 1
        return False


def test_a_dropped_report_gives_its_rate_delta_to_the_next(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    rate = Counter("rate", mode=RATE)
    rate.increment(4)
    refusing = _Refusing()
    _sink.set_sink(refusing)
    dropped_before = meters.stats()["reports_dropped"]
    assert meters.report() is False
    assert refusing.calls == 1
    assert meters.stats()["reports_dropped"] == dropped_before + 1
    rate.increment(1)
    _sink.set_sink(meter_sink)
    assert meters.report() is True
    assert _by_name(_records(meter_sink)[-1])["rate"][3] == 5.0


class _Raising:
    def write(self, rtype: int, payload: bytes) -> bool:
        raise RuntimeError("broken sink")


def test_a_raising_sink_is_counted_not_raised(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    Counter("c").increment()
    _sink.set_sink(_Raising())
    errors = meters.stats()["errors"]
    assert meters.report() is False
    assert meters.stats()["errors"] == errors + 1


def test_declaring_again_returns_the_same_meter(meter_sink: _sink.MemorySink) -> None:
    a = Counter("hits", labels={"x": "1", "y": "2"})
    b = Counter("hits", labels=[("y", "2"), ("x", "1")])
    assert a is b
    assert Counter("hits") is not a  # other labels, other meter
    with pytest.raises(ValueError):
        Counter("hits", labels={"x": "1", "y": "2"}, mode=RATE)
    with pytest.raises(ValueError):
        Histogram("hits", steps=[1], labels={"x": "1", "y": "2"})
    with pytest.raises(ValueError):
        Counter("")
    with pytest.raises(ValueError):
        Gauge("g")  # no supplier


# -- histograms ------------------------------------------------------------------------------
def test_histogram_buckets_are_lower_bounds(meter_sink: _sink.MemorySink) -> None:
    h = Histogram("h", steps=[5, 1, 5, 10])  # unsorted, duplicated: sorted set, 0 prepended
    for v in (0, 0.99, 1, 4.999, 5, 9.99, 10, 1e9):
        h.observe(v)
    assert h.buckets == [(0.0, 2), (1.0, 2), (5.0, 2), (10.0, 2)]
    h.observe(-0.1)
    h.observe(float("nan"))
    assert h.dropped == 2
    assert meters.stats()["observations_dropped"] == 2
    assert h.buckets == [(0.0, 2), (1.0, 2), (5.0, 2), (10.0, 2)]

    with_min = Histogram("with_min", steps=[1, 2], min_value=1)
    assert [b for b, _ in with_min.buckets] == [1.0, 2.0]
    with pytest.raises(ValueError):
        Histogram("bad", steps=[-1, 2])  # below the default min_value 0
    with pytest.raises(ValueError):
        Histogram("empty", steps=[])
    with pytest.raises(ValueError):
        Histogram("inf", steps=[1, math.inf])


def test_negative_infinity_bucket_on_the_wire(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    h = Histogram("temp", steps=[0, 10], min_value=-math.inf)
    for v in (-1e300, -5, 0, 3, 50):
        h.observe(v)
    assert h.dropped == 0
    meters.report()
    (rec,) = _records(meter_sink)
    values = _by_name(rec)["temp"][3]
    assert [(count, neg) for _, count, neg in values] == [(2, True), (2, False), (1, False)]
    collection = meter_pb2.MeterDataCollection()
    collection.ParseFromString(encode.meter_collection(rec))
    (data,) = collection.meterData
    assert [(b.count, b.isNegativeInfinity) for b in data.histogram.values] == [
        (2, True),
        (2, False),
        (1, False),
    ]
    assert [b.bucket for b in data.histogram.values][1:] == [0.0, 10.0]


# -- gauges ----------------------------------------------------------------------------------
def test_failing_gauges_are_skipped_and_counted(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())

    def broken() -> float:
        raise ZeroDivisionError

    Gauge("broken", supplier=broken)
    Gauge("nan", supplier=lambda: float("nan"))
    Gauge("fine", supplier=lambda: 1.25)
    before = meters.stats()["supplier_errors"]
    assert meters.report() is True
    assert meters.stats()["supplier_errors"] == before + 2
    assert _by_name(_records(meter_sink)[-1]) == {"fine": [METER_SINGLE, "fine", [], 1.25]}


# -- threads ---------------------------------------------------------------------------------
def test_threads_hammering_meters_lose_nothing(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config())
    n_threads, per_thread = 8, 5000
    barrier = threading.Barrier(n_threads)
    declared: list[Counter] = []

    def work() -> None:
        barrier.wait()
        counter = Counter("hammered", mode=RATE)  # declared concurrently: one object
        declared.append(counter)
        hist = Histogram("hammered_h", steps=[1, 2])
        for i in range(per_thread):
            counter.increment()
            hist.observe(i % 3)

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    # report concurrently with the writers: RATE deltas must add up exactly
    while any(t.is_alive() for t in threads):
        meters.report()
    for t in threads:
        t.join()
    meters.report()
    assert len({id(c) for c in declared}) == 1
    total = sum(_by_name(r)["hammered"][3] for r in _records(meter_sink) if "hammered" in _by_name(r))
    assert total == n_threads * per_thread
    last = _by_name(_records(meter_sink)[-1])["hammered_h"][3]
    per_value = [sum(1 for i in range(per_thread) if i % 3 == v) * n_threads for v in range(3)]
    assert [count for _, count, _ in last] == per_value  # cumulative, exact


def test_the_reporter_thread_reports_and_flush_is_final(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config(period=0.05))
    assert meters.stats()["thread_alive"] is False  # nothing used yet: no thread
    counter = Counter("ticks", mode=RATE)
    counter.increment(2)
    assert meters.stats()["thread_alive"] is True  # started by the first use
    assert _wait_for(lambda: any("ticks" in _by_name(r) for r in _records(meter_sink)))
    counter.increment(3)
    assert meters.flush() is True  # the final report, written by the caller
    assert meters.stats()["thread_alive"] is False
    assert sum(_by_name(r)["ticks"][3] for r in _records(meter_sink)) == 5.0
    counter.increment()  # after the final flush (atexit), no new thread
    assert meters.stats()["thread_alive"] is False
    meters.start_meter_reporter(_config(period=3600))  # until reporting is started again
    counter.increment()
    assert meters.stats()["thread_alive"] is True


def test_a_huge_period_from_a_hand_built_config_keeps_the_thread_alive(meter_sink: _sink.MemorySink) -> None:
    """Event.wait overflows above threading.TIMEOUT_MAX; the default period is used instead."""
    from swmp.meters._state import config as current

    meters.start_meter_reporter(_config(period=1e10))
    assert current.settings is not None and current.settings.period == 20.0
    Counter("huge-period").increment()
    thread = meters._control.here.thread
    assert thread is not None and thread.is_alive() and thread.period == 20.0


# -- fork ------------------------------------------------------------------------------------
def _in_child(body: Any) -> Any:
    """Run ``body()`` in a forked child and return what it returns (orjson-able)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 0
        try:
            os.close(read_fd)
            out = orjson.dumps(body())
        except BaseException as exc:
            out = orjson.dumps({"child_error": repr(exc)})
            status = 1
        try:
            with os.fdopen(write_fd, "wb") as f:
                f.write(out)
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as f:
            data = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    result = orjson.loads(data)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_a_forked_child_reports_its_own_values(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config(period=0.05))
    counter = Counter("forked", mode=RATE)
    total = Counter("forked_total")
    counter.increment(5)
    total.increment(5)
    parent_pid = os.getpid()

    def child() -> Any:
        meter_sink.clear()  # the child's copy: what it holds now came from the parent
        counter.increment(3)
        total.increment(3)
        alive = meters.stats()["thread_alive"]
        got = _wait_for(lambda: any("forked" in _by_name(r) for r in _records(meter_sink)))
        meters.flush()
        return {"pid": os.getpid(), "alive": alive, "got": got, "records": _records(meter_sink)}

    result = _in_child(child)
    assert result["pid"] != parent_pid
    assert result["alive"] is True and result["got"] is True
    child_rate = sum(_by_name(r)["forked"][3] for r in result["records"])
    child_total = _by_name(result["records"][-1])["forked_total"][3]
    assert (child_rate, child_total) == (3.0, 3.0)  # nothing inherited from the parent
    meters.flush()
    parent = _records(meter_sink)
    assert sum(_by_name(r)["forked"][3] for r in parent) == 5.0
    assert _by_name(parent[-1])["forked_total"][3] == 5.0


def test_the_fork_hook_starts_pvm_reporting_in_the_child(meter_sink: _sink.MemorySink) -> None:
    meters.start_meter_reporter(_config(period=0.05, pvm=True))
    assert meters.stats()["thread_alive"] is False  # the parent (a "master") starts nothing

    def child() -> Any:
        meter_sink.clear()
        alive = meters.stats()["thread_alive"]  # started by the at-fork hook
        got = _wait_for(lambda: bool(_records(meter_sink)))
        meters.flush()
        return {"alive": alive, "got": got, "names": sorted(_by_name(_records(meter_sink)[0]))}

    result = _in_child(child)
    assert result["alive"] is True and result["got"] is True
    assert result["names"] == sorted(meters.PVM_METERS)
    assert meters.stats()["thread_alive"] is False


# -- PVM -------------------------------------------------------------------------------------
def test_pvm_meters_are_plausible(meter_sink: _sink.MemorySink) -> None:
    import psutil

    meters.start_meter_reporter(_config(pvm=True))
    assert meters.report() is True  # first CPU sample (the thread primes it the same way)

    started = time.process_time()
    while time.process_time() - started < 0.1:  # spend some CPU: bounded by work, not asserted
        pass
    for _ in range(100):
        cycle: list[Any] = []
        cycle.append(cycle)
    del cycle
    gc.collect()
    assert meters.report() is True

    pvm = {name: m[3] for name, m in _by_name(_records(meter_sink)[-1]).items()}
    assert set(pvm) == set(meters.PVM_METERS)
    assert all(isinstance(v, float) for v in pvm.values())
    assert 0.0 <= pvm["instance_pvm_total_cpu_utilization"] <= 100.0
    assert 0.0 < pvm["instance_pvm_process_cpu_utilization"] <= 100.0 * (psutil.cpu_count() or 1)
    assert 0.0 < pvm["instance_pvm_total_mem_utilization"] <= 100.0
    rss_percent = 100.0 * psutil.Process().memory_info().rss / psutil.virtual_memory().total
    assert 0.0 < pvm["instance_pvm_process_mem_utilization"] < 100.0
    assert pvm["instance_pvm_process_mem_utilization"] == pytest.approx(rss_percent, rel=0.5)
    assert pvm["instance_pvm_thread_active_count"] >= threading.active_count() - 1
    daemons = sum(1 for t in threading.enumerate() if t.daemon)
    assert pvm["instance_pvm_thread_daemon_count"] == daemons
    stats = gc.get_stats()
    assert pvm["instance_pvm_gc_g2"] <= stats[2]["collected"]
    assert pvm["instance_pvm_gc_g2"] >= 100  # the cycles collected above
    assert pvm["instance_pvm_gc_g0"] >= 0 and pvm["instance_pvm_gc_g1"] >= 0
    assert pvm["instance_pvm_gc_time"] > 0.0  # the collection above was timed

    gc_time = pvm["instance_pvm_gc_time"]
    gc.collect()
    meters.report()
    assert _by_name(_records(meter_sink)[-1])["instance_pvm_gc_time"][3] > gc_time  # cumulative

    meters.stop_meter_reporter()
    assert all(meters.registry.get(name) is None for name in meters.PVM_METERS)


# -- the agent's sink: the ring claim starts reporting ---------------------------------------
def test_claiming_a_ring_starts_the_reporter_and_the_record_lands_there(tmp_path: Any) -> None:
    import ipc
    from swmp._arena_sink import ArenaSink
    from swmp._runtime import worker_instance_name

    meters.stop_meter_reporter()
    meters.registry.clear()
    saved = (identity.service, identity.instance)
    arena = ipc.Arena.create(str(tmp_path / "m.arena"), slots=2, ring_capacity=1 << 16)
    # owner: another pid, so this test process is never taken for a prefork master
    ring_sink = ArenaSink(arena, "svc", "base", owner_pid=os.getppid())
    _sink.set_sink(ring_sink)
    try:
        Gauge("depth", supplier=lambda: 2.0)
        meters.start_meter_reporter(_config())
        assert meters.stats()["thread_alive"] is False  # no ring claimed yet
        assert ring_sink.write(METER, b'[0,"svc","x",[]]')  # first write: claim + announce
        assert meters.stats()["thread_alive"] is True
        assert meters.flush() is True
        slot = ring_sink.slot
        assert slot is not None
        got = [orjson.loads(p) for t, p in arena.reader(slot).read() if t == METER]
        rec = got[-1]
        assert rec[1:3] == ["svc", worker_instance_name("base", slot)]
        assert _by_name(rec) == {"depth": [METER_SINGLE, "depth", [], 2.0]}
    finally:
        meters.stop_meter_reporter()
        meters.registry.clear()
        _sink.set_sink(None)
        ring_sink.leave(1.0)
        arena.close()
        arena.unlink()
        identity.set(*saved)


def test_a_prefork_master_starts_no_thread_its_workers_do(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from swmp import lifecycle

    meters.stop_meter_reporter()
    meters.registry.clear()
    master_sink = _sink.MemorySink()
    _sink.set_sink(master_sink)
    lifecycle.announce_owner(os.getpid())  # what the agent says in the application's owner
    # what swmp.lifecycle.prefork_master looks for in Gunicorn's arbiter process
    monkeypatch.setitem(sys.modules, "gunicorn.arbiter", types.ModuleType("gunicorn.arbiter"))
    try:
        meters.start_meter_reporter(_config(period=0.05))
        counter = Counter("in_master", mode=RATE)
        counter.increment(4)  # e.g. Gunicorn --preload importing the app
        assert meters.stats()["thread_alive"] is False

        def worker() -> Any:
            master_sink.clear()
            alive = meters.stats()["thread_alive"]
            counter.increment()
            meters.flush()
            return {"alive": alive, "values": [_by_name(r)["in_master"][3] for r in _records(master_sink)]}

        # Gunicorn's workers are the forks made in Arbiter.spawn_worker (swmp.lifecycle tells
        # them from the master's other forks by that frame): fork from a function of that name
        # and file, as the arbiter does.
        arbiter: dict[str, Any] = {}
        source = "def spawn_worker(fork):\n    return fork()\n"
        exec(compile(source, "/x/gunicorn/arbiter.py", "exec"), arbiter)
        result = arbiter["spawn_worker"](lambda: _in_child(worker))
        assert result["alive"] is True
        assert sum(result["values"]) == 1.0
        assert meters.stats()["thread_alive"] is False
    finally:
        lifecycle.announce_owner(0)
        meters.stop_meter_reporter()
        meters.registry.clear()
        _sink.set_sink(None)


def test_the_pid_backstop_resets_inherited_values(meter_sink: _sink.MemorySink) -> None:
    # uWSGI without usable fork hooks: the hot path compares pids. Simulate the moment a
    # worker first counts by making the recorded pid stale.
    meters.start_meter_reporter(_config())
    counter = Counter("backstop")
    counter.increment(7)
    here = meters._here
    old_thread = here.thread
    saved = here.check_pid
    here.check_pid = True
    here.pid = -2
    try:
        counter.increment(1)
    finally:
        meters._here.check_pid = saved
        if old_thread is not None:  # the "parent's" thread: the new process forgot it
            old_thread.stop(2.0)
    assert here.pid == os.getpid() and here.thread is not old_thread  # a new process was entered
    assert counter.value == 1
