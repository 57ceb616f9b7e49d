#!/usr/bin/env bash
# start_kafka.sh: run a real single-node Apache Kafka broker (KRaft mode, no ZooKeeper)
# on 127.0.0.1 for tests and demos.
#
# The broker is the plain upstream server: its jars (org.apache.kafka:kafka_2.13 plus a
# logging binding) are resolved once from Maven Central into $REALPEERS_CACHE and started
# with the machine's Java 17. The script returns when the broker logged its start-up line
# AND accepts connections on its port; it prints the pid as the last line of stdout and
# writes RUN_DIR/kafka.pid. Everything (config, data, kafka.log) lives in RUN_DIR.
#
# Environment:
#   KAFKA_PORT (9092)  KAFKA_CONTROLLER_PORT (19093)   the caller picks free ports
#   RUN_DIR (a new temp dir)  KAFKA_VERSION (3.9.1; 4.x also serves share groups)  KAFKA_HEAP (512m)
#   KAFKA_READY_TIMEOUT (90 s)  REALPEERS_CACHE (~/.cache/realpeers)
#   REALPEERS_OWNER_PID  if set, the broker is stopped when that process exits
# Optional secured listeners (each off unless its port is set; the PLAINTEXT one stays):
#   KAFKA_SSL_PORT  KAFKA_SASL_SSL_PORT  KAFKA_SASL_PLAINTEXT_PORT
#   KAFKA_KEYSTORE (PKCS12 file: server key + chain)  KAFKA_KEYSTORE_PASSWORD
#   KAFKA_SASL_USER / KAFKA_SASL_PASSWORD  one user for SASL PLAIN, SCRAM-SHA-256 and -512
#   KAFKA_SSL_CLIENT_CA (PEM)  if set, the SSL listener requires a client certificate from it
# Stop it with: scripts/realpeers/stop_pid.sh RUN_DIR/kafka.pid
set -euo pipefail

log() { echo "[start_kafka] $*" >&2; }
# shellcheck source=scripts/realpeers/_lib.sh
. "$(dirname "$0")/_lib.sh"

KAFKA_VERSION=${KAFKA_VERSION:-3.9.1}
PORT=${KAFKA_PORT:-9092}
CPORT=${KAFKA_CONTROLLER_PORT:-19093}
RUN_DIR=${RUN_DIR:-$(mktemp -d -t kafka-run.XXXXXX)}
HEAP=${KAFKA_HEAP:-512m}
READY_TIMEOUT=${KAFKA_READY_TIMEOUT:-90}
LIBS=$REALPEERS_CACHE/kafka-$KAFKA_VERSION/libs
SSL_PORT=${KAFKA_SSL_PORT:-}
SASL_SSL_PORT=${KAFKA_SASL_SSL_PORT:-}
SASL_PORT=${KAFKA_SASL_PLAINTEXT_PORT:-}

need_java

all_busy() {
  local p
  for p in "$@"; do port_busy "$p" || return 1; done
}

# 1. Jars. Kafka 3.x logs through slf4j 1 (reload4j binding); 4.x moved to log4j2.
case "$KAFKA_VERSION" in
  3.*) BINDING='<dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>' ;;
  *)   BINDING='<dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>' ;;
esac
fetch_jars "kafka-$KAFKA_VERSION" "<project xmlns=\"http://maven.apache.org/POM/4.0.0\"><modelVersion>4.0.0</modelVersion>
  <groupId>local.realpeers</groupId><artifactId>kafka-libs</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    $BINDING
  </dependencies>
</project>"
[ "${REALPEERS_FETCH_ONLY:-}" = 1 ] && { log "jars cached in $LIBS"; exit 0; }

# 2. Config: one process is both controller and broker; every internal topic has a single
# replica, otherwise consumer groups and transactions never become available.
mkdir -p "$RUN_DIR/data"
LISTENERS="PLAINTEXT://127.0.0.1:$PORT"
PROTOCOL_MAP="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
SECURED=""
for entry in "SSL:$SSL_PORT" "SASL_SSL:$SASL_SSL_PORT" "SASL_PLAINTEXT:$SASL_PORT"; do
  name=${entry%%:*} port=${entry#*:}
  [ -n "$port" ] || continue
  LISTENERS="$LISTENERS,$name://127.0.0.1:$port"
  PROTOCOL_MAP="$PROTOCOL_MAP,$name:$name"
  SECURED="$SECURED $name"
done
cat > "$RUN_DIR/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=$LISTENERS,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=$LISTENERS
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$PROTOCOL_MAP
log.dirs=$RUN_DIR/data
num.partitions=1
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.segment.bytes=16777216
EOF
# Kafka 4.x share groups (KIP-932): a member learns its partitions on its next heartbeat, 5 s
# apart by default; 1 s lets a test's share consumer start reading within a second or two.
case "$KAFKA_VERSION" in 3.*) ;; *)
  cat >> "$RUN_DIR/server.properties" <<EOF
group.share.min.heartbeat.interval.ms=1000
group.share.heartbeat.interval.ms=1000
EOF
;; esac
# TLS listeners share one keystore; SASL listeners accept PLAIN (the user in the JAAS line)
# and SCRAM (credentials written into the metadata log by the storage format below).
SCRAM_ARGS=()
case "$SECURED" in *SSL*)
  [ -n "${KAFKA_KEYSTORE:-}" ] || { log "an SSL listener needs KAFKA_KEYSTORE (PKCS12)"; exit 2; }
  cat >> "$RUN_DIR/server.properties" <<EOF
ssl.keystore.type=PKCS12
ssl.keystore.location=$KAFKA_KEYSTORE
ssl.keystore.password=${KAFKA_KEYSTORE_PASSWORD:-}
ssl.key.password=${KAFKA_KEYSTORE_PASSWORD:-}
ssl.client.auth=none
EOF
  if [ -n "${KAFKA_SSL_CLIENT_CA:-}" ]; then
    cat >> "$RUN_DIR/server.properties" <<EOF
listener.name.ssl.ssl.client.auth=required
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$KAFKA_SSL_CLIENT_CA
EOF
  fi
;; esac
case "$SECURED" in *SASL*)
  if [ -z "${KAFKA_SASL_USER:-}" ] || [ -z "${KAFKA_SASL_PASSWORD:-}" ]; then
    log "a SASL listener needs KAFKA_SASL_USER and KAFKA_SASL_PASSWORD"; exit 2
  fi
  echo "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512" >> "$RUN_DIR/server.properties"
  for name in $SECURED; do
    case "$name" in SASL_*) ;; *) continue ;; esac
    lname=$(echo "$name" | tr '[:upper:]' '[:lower:]')
    cat >> "$RUN_DIR/server.properties" <<EOF
listener.name.$lname.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER="$KAFKA_SASL_PASSWORD";
listener.name.$lname.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.$lname.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
  done
  SCRAM_ARGS=(--add-scram "SCRAM-SHA-256=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]"
              --add-scram "SCRAM-SHA-512=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]")
;; esac
chmod 600 "$RUN_DIR/server.properties"
# Console logging at INFO for both logging backends (only one is on the classpath).
cat > "$RUN_DIR/log4j.properties" <<'EOF'
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
cat > "$RUN_DIR/log4j2.xml" <<'EOF'
<Configuration status="WARN">
  <Appenders><Console name="OUT" target="SYSTEM_OUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="INFO"><AppenderRef ref="OUT"/></Root></Loggers>
</Configuration>
EOF
JLOG=(-Dlog4j.configuration="file:$RUN_DIR/log4j.properties" -Dlog4j2.configurationFile="$RUN_DIR/log4j2.xml")

for p in "$PORT" "$CPORT" $SSL_PORT $SASL_SSL_PORT $SASL_PORT; do
  if port_busy "$p"; then log "port $p is already in use"; exit 3; fi
done

# 3. KRaft needs its storage formatted with a cluster id before the first start.
CLUSTER_ID=$(java "${JLOG[@]}" -cp "$LIBS/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
if ! java "${JLOG[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format -t "$CLUSTER_ID" \
       -c "$RUN_DIR/server.properties" "${SCRAM_ARGS[@]}" > "$RUN_DIR/format.log" 2>&1; then
  log "storage format failed:"; cat "$RUN_DIR/format.log" >&2; exit 1
fi

T0=$(now_ms)
java -Xms128m "-Xmx$HEAP" -XX:+UseSerialGC "${JLOG[@]}" -cp "$LIBS/*" kafka.Kafka "$RUN_DIR/server.properties" \
     </dev/null > "$RUN_DIR/kafka.log" 2>&1 &
PID=$!
echo "$PID" > "$RUN_DIR/kafka.pid"
start_watchdog "${REALPEERS_OWNER_PID:-}" "$PID"

# 4. Ready = the broker said so in its log and its listener accepts connections.
DEADLINE=$(( T0 + READY_TIMEOUT * 1000 ))
while [ "$(now_ms)" -lt "$DEADLINE" ]; do
  if ! kill -0 "$PID" 2>/dev/null; then
    log "broker exited during start-up; last lines of $RUN_DIR/kafka.log:"; tail -30 "$RUN_DIR/kafka.log" >&2; exit 1
  fi
  if grep -q 'Kafka Server started' "$RUN_DIR/kafka.log" 2>/dev/null && port_busy "$PORT" \
     && all_busy $SSL_PORT $SASL_SSL_PORT $SASL_PORT; then
    log "ready in $(( $(now_ms) - T0 ))ms pid=$PID bootstrap=127.0.0.1:$PORT${SECURED:+ secured:$SECURED} run_dir=$RUN_DIR"
    echo "$PID"
    exit 0
  fi
  sleep 0.2
done
log "not ready after ${READY_TIMEOUT}s; stopping pid $PID (log: $RUN_DIR/kafka.log)"
kill "$PID" 2>/dev/null || true
exit 1
