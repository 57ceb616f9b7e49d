"""Build of the optional native encoder; everything else is declared in pyproject.toml.

``reporter_proc._encode_native`` (C, CPython API only) speeds up the reporter's encoding of
segments and logs. It is ``optional``: without a compiler or Python headers the install goes
on and the reporter uses the pure-Python encoder (``reporter_proc/encode.py``), which
produces the same bytes.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "reporter_proc._encode_native",
            sources=["reporter_proc/_encode_native.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-Wno-missing-field-initializers"],
        )
    ]
)
