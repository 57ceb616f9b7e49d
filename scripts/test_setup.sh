#!/usr/bin/env bash
# test_setup.sh: everything the test suite and the benchmarks need, on a Debian 12 machine.
# scripts/test.sh runs it first (SKIP_SETUP=1 skips it).
#
# Idempotent and non-interactive (run it as root, or as a user with sudo). Each step first
# checks whether its work is already done:
#   1. system packages: Java 17 + Maven (for the real Kafka / OAP used by the e2e tests), wrk
#      (load generator for benchmarks), the real servers the instrumentation tests start
#      (PostgreSQL, MariaDB, Redis, memcached, RabbitMQ), Chromium (web page tests) and what
#      building mysqlclient needs; apt-get runs only if something is missing;
#   2. Python packages: swmp in editable mode with its dev and bench extras; a virtual
#      environment for each other Python release the tests run on (scripts/other_pythons.sh);
#   3. the Kafka and SkyWalking OAP jars, fetched once from Maven Central into
#      ~/.cache/realpeers so that test runs never download anything.
#
# Environment: PYTHON (python3 by default, must be >= 3.10), SKIP_JARS=1 skips step 3.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
log() { echo "[test-setup] $*"; }
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
command -v openssl >/dev/null 2>&1 || missing+=(openssl)  # test CAs for the TLS tests
# Real servers for the instrumentation tests (started by tests/ fixtures on 127.0.0.1, never as
# system services), the browser for web page tests, and mysqlclient's build needs. Checked
# with dpkg: a package's binaries may live outside PATH (/usr/lib/postgresql/*/bin).
for pkg in postgresql mariadb-server redis-server memcached rabbitmq-server chromium \
           libmariadb-dev pkg-config gcc python3-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done

if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  # policy-rc.d 101: Debian's maintainer scripts must not start these servers as services.
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${SUDO[@]}" chmod 755 /usr/sbin/policy-rc.d
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d
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
# The other Python releases the tests also run on (Django 6 needs >= 3.12), where present.
PYTHON="$PYTHON" bash "$ROOT/scripts/other_pythons.sh" setup

# ---------------------------------------------------------------------------- 3. jars for the e2e tests
if [ "${SKIP_JARS:-}" = 1 ]; then
  log "SKIP_JARS=1: not pre-fetching Kafka / OAP jars"
else
  for launcher in start_kafka.sh start_oap.sh; do
    log "jars for $launcher (cached in ${REALPEERS_CACHE:-~/.cache/realpeers}; downloaded only once)"
    REALPEERS_FETCH_ONLY=1 bash "$ROOT/scripts/realpeers/$launcher" 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
  done
  # The second broker of the share-group tests (tests/realpeers.py KAFKA4_VERSION).
  log "jars for start_kafka.sh, Kafka ${KAFKA4_VERSION:-4.2.1}"
  KAFKA_VERSION=${KAFKA4_VERSION:-4.2.1} REALPEERS_FETCH_ONLY=1 bash "$ROOT/scripts/realpeers/start_kafka.sh" 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g'
fi

log "done in $(( $(date +%s) - T0 ))s"
