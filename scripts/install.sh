#!/usr/bin/env bash
# install.sh: everything swmp needs to run, develop and test, on a Debian 12 machine.
#
# Idempotent and non-interactive (run it as root, or as a user with sudo). Each step first
# checks whether its work is already done:
#   1. system packages: Java 17 + Maven (for the real Kafka / OAP used by the e2e tests) and
#      wrk (load generator for benchmarks); apt-get runs only if something is missing;
#   2. Python packages: swmp in editable mode with its dev and bench extras;
#   3. the Kafka and SkyWalking OAP jars, fetched once from Maven Central into
#      ~/.cache/realpeers so that test runs never download anything.
#
# Environment: PYTHON (python3 by default, must be >= 3.10), SKIP_JARS=1 skips step 3.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
log() { echo "[install] $*"; }
T0=$(date +%s)

# ---------------------------------------------------------------------------- 1. system packages
SUDO=()
if [ "$(id -u)" != 0 ]; then SUDO=(sudo -n); fi

java_major() {
  # "openjdk version "17.0.15" ..." -> 17 ; old style "1.8.0_x" -> 8
  local v
  v=$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -1)
  case "$v" in 1.*) v=${v#1.} ;; esac
  echo "${v%%[.+-]*}"
}

missing=()
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then missing+=(openjdk-17-jre-headless); fi
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)

if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "system packages present: java $(java_major), $(mvn -v 2>/dev/null | head -1 | sed 's/\x1b\[[0-9;]*m//g'), wrk"
fi

# ---------------------------------------------------------------------------- 2. Python packages
if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  log "need Python >= 3.10 (set PYTHON=/path/to/python); found: ${PYTHON:-none}"
  exit 1
fi
log "pip install -e '.[dev,bench]' with $("$PYTHON" --version) ($PYTHON)"
"$PYTHON" -m pip install --disable-pip-version-check --progress-bar off -q -e "${ROOT}[dev,bench]"

# ---------------------------------------------------------------------------- 3. jars for the e2e tests
if [ "${SKIP_JARS:-}" = 1 ]; then
  log "SKIP_JARS=1: not pre-fetching Kafka / OAP jars"
else
  for launcher in start_kafka.sh start_oap.sh; do
    log "jars for $launcher (cached in ${REALPEERS_CACHE:-~/.cache/realpeers}; downloaded only once)"
    REALPEERS_FETCH_ONLY=1 bash "$ROOT/scripts/realpeers/$launcher" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
  done
fi

log "done in $(( $(date +%s) - T0 ))s"
