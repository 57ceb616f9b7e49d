#!/usr/bin/env bash
# stop_pid.sh PIDFILE...: stop the process named in each pid file, and nothing else.
#
# SIGTERM first so the JVM runs its shutdown hooks, then SIGKILL if it is still alive after
# STOP_GRACE seconds (20). The pid file is removed once the process is gone. Missing files
# and already-dead processes are not errors: stopping twice is safe.
set -uo pipefail

GRACE=${STOP_GRACE:-20}
for f in "$@"; do
  [ -f "$f" ] || continue
  pid=$(tr -dc '0-9' < "$f")
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then rm -f "$f"; continue; fi
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 $(( GRACE * 5 ))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null
    echo "killed $pid ($f) after ${GRACE}s" >&2
  else
    echo "stopped $pid ($f)" >&2
  fi
  rm -f "$f"
done
exit 0
