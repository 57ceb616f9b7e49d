# shellcheck shell=bash
# Helpers shared by start_kafka.sh and start_oap.sh. Sourced, never run directly.
#
# Both launchers follow the same recipe: resolve the server's jars from Maven Central once
# into a cache, write a config for the ports the caller picked, start the JVM in the
# background with its output in RUN_DIR, and return only when the server really answers.

REALPEERS_CACHE=${REALPEERS_CACHE:-$HOME/.cache/realpeers}

now_ms() { date +%s%3N; }

# alive PID: the process exists and is not a zombie (an exited child its parent has not
# reaped yet still answers kill -0, which would make a stop loop wait for nothing).
alive() {
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  read -r stat < "/proc/$1/stat" 2>/dev/null || return 0
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# port_busy PORT: true when something already accepts connections on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

need_java() {
  if ! command -v java >/dev/null 2>&1; then
    log "java not found on PATH: install a Java 17 runtime (Debian: apt-get install -y openjdk-17-jre-headless)"
    exit 2
  fi
}

# fetch_jars NAME POM_XML: copy the runtime dependency closure of POM_XML into
# $REALPEERS_CACHE/NAME/libs unless a previous run finished it (marker file .complete).
# A lock on the cache entry keeps two concurrent first runs from downloading into the
# same directory; the second one simply waits and then finds the marker.
fetch_jars() {
  local name=$1 pom=$2
  local dir=$REALPEERS_CACHE/$name
  local libs=$dir/libs
  [ -f "$libs/.complete" ] && return 0
  if ! command -v mvn >/dev/null 2>&1; then
    log "maven (mvn) not found and $libs is not cached: install it (Debian: apt-get install -y maven)"
    exit 2
  fi
  mkdir -p "$dir/pom"
  (
    flock 9
    [ -f "$libs/.complete" ] && exit 0
    printf '%s\n' "$pom" > "$dir/pom/pom.xml"
    log "resolving $name jars from Maven Central into $libs (first run only) ..."
    local t0; t0=$(now_ms)
    rm -rf "$libs.partial"
    mvn -q -B -f "$dir/pom/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$libs.partial" -DincludeScope=runtime -Dmaven.artifact.threads=8 >&2
    rm -rf "$libs"
    mv "$libs.partial" "$libs"
    touch "$libs/.complete"
    log "fetched $(find "$libs" -name '*.jar' | wc -l) jars in $(( ($(now_ms) - t0) / 1000 ))s"
  ) 9>"$dir/.lock"
}

# start_watchdog OWNER_PID SERVER_PID: if the owner (e.g. a pytest session) dies without
# stopping the server, stop it anyway, so a killed test run leaves no JVM behind.
start_watchdog() {
  local owner=$1 server=$2
  [ -n "$owner" ] || return 0
  (
    trap '' HUP
    while alive "$owner" && alive "$server"; do sleep 1; done
    if alive "$server"; then
      kill "$server" 2>/dev/null
      for _ in $(seq 1 40); do alive "$server" || exit 0; sleep 0.5; done
      kill -9 "$server" 2>/dev/null
    fi
  ) </dev/null >/dev/null 2>&1 &
  disown $! 2>/dev/null || true
}
