#!/usr/bin/env bash
# test.sh: the whole check, as CI runs it. Exits non-zero on any failure.
#
#   0. scripts/test_setup.sh (idempotent: system packages, dev extras, jars; SKIP_SETUP=1 skips);
#   1. ruff (lint) and mypy (types) first: they take seconds and fail fast;
#   2. the complete pytest suite, end-to-end tests included: they start a real Kafka broker
#      and real SkyWalking OAP servers on 127.0.0.1 (jars pre-fetched by test_setup.sh);
#   3. after a whole run, a part of the suite on the other Python releases present
#      (scripts/other_pythons.sh: Python 3.10, 3.12 and 3.13 by default; Django 6 on 3.12+).
#
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k kafka -x`).
# PYTHON selects the interpreter (python3 by default).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
log() { echo "[test] $*"; }
T0=$(date +%s)

if [ "${SKIP_SETUP:-}" != 1 ]; then
  bash scripts/test_setup.sh || { log "FAILED: test set-up"; exit 1; }
fi

log "ruff check"
"$PYTHON" -m ruff check . || { log "FAILED: ruff"; exit 1; }

log "mypy"
"$PYTHON" -m mypy || { log "FAILED: mypy"; exit 1; }

log "pytest (whole suite, e2e included)"
"$PYTHON" -m pytest -q "$@"
rc=$?
case $rc in
  0) ;;
  5) log "FAILED: pytest collected no tests"; exit 1 ;;
  *) log "FAILED: pytest exit status $rc"; exit "$rc" ;;
esac

# The other Python releases (scripts/other_pythons.sh): after a whole run only, not a chosen part.
if [ $# -eq 0 ]; then
  log "other Python releases"
  PYTHON="$PYTHON" bash scripts/other_pythons.sh test || { log "FAILED: other Python releases"; exit 1; }
fi
log "all passed in $(( $(date +%s) - T0 ))s"
