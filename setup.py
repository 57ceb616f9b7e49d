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

setup(
    ext_modules=[
        Extension(
            "reporter_proc._encode_native",
            sources=[NATIVE + "module.c", NATIVE + "records.c", NATIVE + "json.c"],
            depends=[NATIVE + "wire.h", NATIVE + "text.h"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
        ),
        Extension(
            "swmp._spancore",
            sources=["swmp/_native/spancore.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                                "-Wno-cast-function-type"],
        ),
        Extension(
            "ipc._ringwrite",
            sources=["ipc/_native/ringwrite.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-fvisibility=hidden", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                                "-Wno-cast-function-type"],
        ),
    ]
)
