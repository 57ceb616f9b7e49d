"""The native modules' tests once more, with the modules built under AddressSanitizer and
UndefinedBehaviorSanitizer.

Why: the C code runs inside other people's processes, and a reference-count slip, a
use-after-free or a write past a buffer often passes an ordinary test run unnoticed (the
freed memory still holds the old bytes) and crashes a server weeks later. Built with
``-fsanitize=address,undefined`` and run with Python's own allocator off
(``PYTHONMALLOC=malloc``, so every object is a malloc block AddressSanitizer watches), the
first bad read or write aborts the run with its report. The build is a copy of the sources
in a temporary directory; the installed modules are not touched.

The test files are those that exercise the native code in this process (and the child
processes some of them start, which inherit the sanitizer); those starting servers are left
out (their daemons would run with the sanitizer too, several times slower), and so are the
tests that run other tests with the pure-Python forms (nothing native to watch there: the
pure ring writer's run alone took 113 s of the 500 under the sanitizers). The files run in
two shards at once, one per core of the 2-core CI machine: nothing else of the suite runs
meanwhile. Property tests try a third of their examples here (``SWMP_FUZZ_SCALE``,
tests/fuzz_budget.py): each costs several times more under the sanitizers, and the full
searches ran without them earlier in the suite. ~4-5 minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("swmp", "ipc", "reporter_proc", "tests", "benchmarks", "examples", "docs")
# Two shards of about equal time under the sanitizers (measured: test_encode_native ~135 s,
# test_propagation ~75, test_ipc_ring_native ~70, test_spancore ~25, the rest ~120 together).
SHARDS = (
    (
        "test_encode_native.py", "test_encode.py", "test_encode_json.py", "test_spancore.py",
        "test_native_json.py", "test_within.py", "test_lazy_within.py", "test_cache_call.py",
        "test_sql_call.py", "test_sql_span.py", "test_attrcache.py", "test_wsgi_entry.py",
        "test_wsgi_body.py", "test_wsgi_status.py", "test_asgi_entry.py", "test_web_entry_sw8.py",
    ),
    (
        "test_ipc_ring_native.py", "test_propagation.py", "test_celery_send_native.py",
        "test_ipc_fuzz.py", "test_instrument_gate.py", "test_thread_checks.py", "test_sink_direct.py",
        "test_segment_cycles.py", "test_mq_send_native.py", "test_mq_consume_native.py",
        "test_mq_deliver_native.py", "test_mq_publish_native.py", "test_mq_attach_native.py",
        "test_mq_copy.py", "test_mq_consume_sw8.py", "test_tracing_context.py", "test_tracing_model.py",
        "test_instrument_frameworks.py", "test_instrument_web.py", "test_instrument_http.py",
        "test_instrument_rpc_clients.py", "test_grpc_client_calls.py", "test_route_naming.py",
        "test_tornado_routes.py", "test_public_api.py", "test_compat.py",
    ),
)  # fmt: skip
# Tests that run other test files with the pure-Python forms: no native code to watch.
PURE_ONLY = (
    "tests/test_ipc_ring_native.py::test_ring_tests_pass_with_the_pure_writer",
    "tests/test_spancore.py::test_tracing_unit_tests_pass_with_the_pure_core",
)
SANITIZE = "-fsanitize=address,undefined"


def _runtime(name: str) -> str | None:
    """The path of the compiler's sanitizer runtime ``name``, or None."""
    cc = shutil.which("gcc")
    if cc is None:
        return None
    found = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False)
    path = found.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


ASAN, UBSAN = _runtime("libasan.so"), _runtime("libubsan.so")


@pytest.mark.timeout(1500)
@pytest.mark.skipif(ASAN is None or UBSAN is None, reason="gcc's sanitizer runtimes are not installed")
def test_native_tests_pass_under_address_and_undefined_behaviour_sanitizers(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", ".pytest_cache")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tree / name, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    flags = f"{SANITIZE} -fno-omit-frame-pointer -g"
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, env={**os.environ, "CFLAGS": flags, "LDFLAGS": SANITIZE},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    for module in ("swmp/_spancore", "ipc/_ringwrite", "reporter_proc/_encode_native"):
        assert list(tree.glob(f"{module}.*.so")), f"{module} not built: {build.stderr[-3000:]}"

    logs = tmp_path / "reports"
    logs.mkdir()
    env = {
        **os.environ,
        "LD_PRELOAD": f"{ASAN} {UBSAN}",
        "PYTHONMALLOC": "malloc",
        # Leaks are left to the tests' own counts (the interpreter keeps much at exit).
        "ASAN_OPTIONS": f"detect_leaks=0:log_path={logs}/asan",
        "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={logs}/ubsan",
        "PYTHONPATH": str(tree),
        # test_encode_native compiles the encoder it tests (from the current sources, never a
        # stale in-place build): with the sanitizer flags, like the tree's build above.
        # (Without them it ran the whole fuzzing on an uninstrumented copy.)
        "CFLAGS": flags,
        "LDFLAGS": SANITIZE,
        # A third of each property test's examples (tests/fuzz_budget.py): the full searches
        # ran without the sanitizers in this suite already.
        "SWMP_FUZZ_SCALE": "0.33",
    }
    env.pop("PYTEST_ADDOPTS", None)
    deselect = [arg for test in PURE_ONLY for arg in ("--deselect", test)]
    # Each shard's output goes to a file: a pipe not read while the other shard is waited
    # for could fill and stall its writer.
    shards = []
    for n, files in enumerate(SHARDS):
        out = (tmp_path / f"shard{n}.out").open("w")
        basetemp = f"--basetemp={tmp_path / f'shard{n}'}"
        tests = [f"tests/{name}" for name in files]
        runner = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x"]
        command = [*runner, basetemp, *deselect, *tests]
        with out:
            shards.append(subprocess.Popen(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        for shard in shards:
            shard.wait(timeout=1400)
    finally:
        for shard in shards:
            if shard.poll() is None:
                shard.kill()
                shard.wait()
    reports = {p.name: p.read_text(errors="replace")[:4000] for p in logs.iterdir()}
    assert not reports, f"sanitizer reports: {reports}"
    for n, shard in enumerate(shards):
        assert shard.returncode == 0, (tmp_path / f"shard{n}.out").read_text(errors="replace")[-6000:]
    # The sanitized build was the one tested (not an installed copy found first).
    check = subprocess.run(
        [sys.executable, "-c", "import swmp._spancore as m; print(m.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.stdout.strip().startswith(str(tree)), check.stdout + check.stderr
