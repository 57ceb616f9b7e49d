#!/usr/bin/env bash
# install.sh: swmp itself, for running your application and `swmp demo` (no Java, no servers).
#
# Installs swmp in editable mode from this checkout with its runtime dependencies and the
# `demo` extra (Gunicorn and Flask, which the demo's two example services run on). The demo's
# collector is part of swmp (SQLite from Python's standard library). What only the test suite
# needs (Java + Maven for the real Kafka and OAP, database and broker servers,
# Chromium, the dev/bench Python extras, the jars) is installed by scripts/test_setup.sh, which
# scripts/test.sh runs first.
#
# pip also compiles the optional native modules, the reporter's encoder
# (reporter_proc/_native/*.c) and the workers' span core (swmp/_native/*.c), when a C
# compiler and the Python headers are present (Debian/Ubuntu: gcc python3-dev); without
# them the install still succeeds and both run in pure Python.
#
# Environment: PYTHON (python3 by default, must be >= 3.10).
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
log() { echo "[install] $*"; }

if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  log "need Python >= 3.10 (set PYTHON=/path/to/python); found: ${PYTHON:-none}"
  exit 1
fi
log "pip install -e '.[demo]' with $("$PYTHON" --version) ($PYTHON)"
"$PYTHON" -m pip install --disable-pip-version-check --progress-bar off -q -e "$PWD[demo]"
if ! command -v swmp >/dev/null 2>&1; then
  log "note: 'swmp' is not on PATH; pip put it in $("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
fi
log "done: try 'swmp demo' (or 'swmp --help')"
