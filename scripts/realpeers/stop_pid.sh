#!/usr/bin/env bash
# stop_pid.sh PIDFILE...: stop the process named in each pid file, and nothing else.
#
# SIGTERM first so the JVM runs its shutdown hooks, then SIGKILL if it is still alive after
# STOP_GRACE seconds (20). The pid file is removed once the process is gone. Missing files
# and already-dead processes are not errors: stopping twice is safe.
set -uo pipefail

log() { echo "[stop_pid] $*" >&2; }
# shellcheck source=scripts/realpeers/_lib.sh
. "$(dirname "$0")/_lib.sh"

GRACE=${STOP_GRACE:-20}
for f in "$@"; do
  [ -f "$f" ] || continue
  pid=$(tr -dc '0-9' < "$f")
  if [ -z "$pid" ] || ! alive "$pid"; then rm -f "$f"; continue; fi
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 $(( GRACE * 5 ))); do
    alive "$pid" || break
    sleep 0.2
  done
  if alive "$pid"; then
    kill -9 "$pid" 2>/dev/null
    log "killed $pid ($f): still running ${GRACE}s after SIGTERM"
  else
    log "stopped $pid ($f)"
  fi
  rm -f "$f"
done
exit 0
