"""Build of the optional native modules; everything else is declared in pyproject.toml.

``reporter_proc._encode_native`` (C, CPython API only, sources in ``reporter_proc/_native/``)
speeds up the reporter's encoding of segments and logs. It is ``optional``: without a
compiler or Python headers the install goes on and the reporter uses the pure-Python encoder
(``reporter_proc/encode.py``), which produces the same bytes.

``swmp._spancore`` (C, sources in ``swmp/_native/``) is the native core of a span's life in
the application's workers; without it ``swmp.tracing.span`` uses its pure-Python core.
``ipc._ringwrite`` (C, ``ipc/_native/``) is the fast path of a ring writer; without it
``ipc.ring_writer`` writes in pure Python (the same bytes).
"""

from setuptools import Extension, setup

NATIVE = "reporter_proc/_native/"
SPAN = "swmp/_native/"
FLAGS = [
    "-O2",
    "-fno-plt",
    # No padding before functions, jump targets and loops (GCC aligns them to 16 bytes at
    # -O2): a traced call runs short stretches of many functions, and starts with cold
    # caches after the application's own work, so the code lines it touches count, not
    # the fetch alignment within them. 5 % less code, 2-8 % fewer level-1 instruction
    # misses per request or message (benchmarks/cold_cachegrind.py, docs/performance.md).
    "-falign-functions=1",
    "-falign-jumps=1",
    "-falign-loops=1",
    "-falign-labels=1",
    "-std=c11",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-Wno-cast-function-type",
]


def native(name: str, sources: list[str], depends: list[str] | None = None) -> Extension:
    """An optional C module: without a compiler the install goes on in pure Python."""
    return Extension(name, sources=sources, depends=depends or [], optional=True, extra_compile_args=FLAGS)


setup(
    ext_modules=[
        native(
            "reporter_proc._encode_native",
            [NATIVE + "module.c", NATIVE + "records.c", NATIVE + "json.c"],
            [NATIVE + "wire.h", NATIVE + "text.h"],
        ),
        native(
            "swmp._spancore",
            [
                SPAN + f
                for f in (
                    "spancore.c",
                    "span.c",
                    "finish.c",
                    "segment.c",
                    "emit.c",
                    "start.c",
                    "route.c",
                    "inject.c",
                    "carrier.c",
                    "helpers.c",
                    "gate.c",
                    "sw8.c",
                    "status.c",
                    "body.c",
                    "json.c",
                    "threads.c",
                    "asgi.c",
                    "within.c",
                    "awaiting.c",
                    "wsgi.c",
                    "wsgi_method.c",
                    "web_entry.c",
                    "join.c",
                    "sql.c",
                    "cache.c",
                    "celery.c",
                    "slots.c",
                    "mq.c",
                    "consume.c",
                    "deliver.c",
                    "attach.c",
                    "attrcache.c",
                    "publish.c",
                    "kafka_send.c",
                )
            ],
            [
                SPAN + f
                for f in (
                    "gate.h",
                    "sw8.h",
                    "status.h",
                    "body.h",
                    "json.h",
                    "threads.h",
                    "asgi.h",
                    "within.h",
                    "wsgi.h",
                    "web_entry.h",
                    "join.h",
                    "sql.h",
                    "cache.h",
                    "celery.h",
                    "slots.h",
                    "mq.h",
                    "consume.h",
                    "deliver.h",
                    "attach.h",
                    "attrcache.h",
                    "spancore.h",
                    "span.h",
                    "finish.h",
                    "segment.h",
                    "emit.h",
                    "start.h",
                    "route.h",
                    "inject.h",
                    "carrier.h",
                    "publish.h",
                    "kafka_send.h",
                )
            ],
        ),
        native("ipc._ringwrite", ["ipc/_native/ringwrite.c"]),
    ]
)
