#!/usr/bin/env bash
# start_oap.sh: run a real Apache SkyWalking OAP server (10.1.0, in-memory H2 storage) on
# 127.0.0.1 for tests and demos.
#
# 10.1.0 is the last OAP release that still ships the H2 storage plugin, which lets the
# server run with no database at all. Its jars (server-starter, with the oap-server-bom
# imported so every transitive version matches the official distribution) are resolved
# once from Maven Central into $REALPEERS_CACHE and started with the machine's Java 17.
# The configuration is written fresh into RUN_DIR/config by this script: only the modules
# an agent talks to (trace, log, meter, management, profile, event receivers over gRPC and
# HTTP; optionally the Kafka fetcher) and just enough analysis config for them to work.
#
# The script returns when the server logged its boot summary, both ports accept
# connections and GraphQL answers; it prints the pid as the last line of stdout and writes
# RUN_DIR/oap.pid. The JVM runs with TZ=UTC: GraphQL time ranges are read in the server's
# time zone, so clients build them in UTC.
#
# Environment:
#   OAP_GRPC_PORT (11800)  OAP_REST_PORT (12800)   the caller picks free ports
#   RUN_DIR (a new temp dir)  OAP_VERSION (10.1.0)  OAP_HEAP (768m)  OAP_READY_TIMEOUT (240 s)
#   OAP_KAFKA_BOOTSTRAP   host:port of a running broker turns the Kafka fetcher on (start the
#                         broker first: the OAP waits for it indefinitely)
#   OAP_NAMESPACE         Kafka topic prefix (topics become NAMESPACE-skywalking-segments, ...)
#   OAP_PERSISTENT_PERIOD seconds between metric flushes to storage (5)
#   REALPEERS_CACHE (~/.cache/realpeers)  REALPEERS_OWNER_PID (stop the OAP when it exits)
# Stop it with: scripts/realpeers/stop_pid.sh RUN_DIR/oap.pid
set -euo pipefail

log() { echo "[start_oap] $*" >&2; }
# shellcheck source=scripts/realpeers/_lib.sh
. "$(dirname "$0")/_lib.sh"

OAP_VERSION=${OAP_VERSION:-10.1.0}
GRPC_PORT=${OAP_GRPC_PORT:-11800}
REST_PORT=${OAP_REST_PORT:-12800}
RUN_DIR=${RUN_DIR:-$(mktemp -d -t oap-run.XXXXXX)}
HEAP=${OAP_HEAP:-768m}
READY_TIMEOUT=${OAP_READY_TIMEOUT:-240}
PERSIST=${OAP_PERSISTENT_PERIOD:-5}
LIBS=$REALPEERS_CACHE/oap-$OAP_VERSION/libs

need_java

# 1. Jars.
fetch_jars "oap-$OAP_VERSION" "<project xmlns=\"http://maven.apache.org/POM/4.0.0\"><modelVersion>4.0.0</modelVersion>
  <groupId>local.realpeers</groupId><artifactId>oap-libs</artifactId><version>1</version><packaging>pom</packaging>
  <dependencyManagement><dependencies>
    <dependency><groupId>org.apache.skywalking</groupId><artifactId>oap-server-bom</artifactId>
      <version>$OAP_VERSION</version><type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>org.apache.skywalking</groupId><artifactId>server-starter</artifactId><version>$OAP_VERSION</version></dependency>
  </dependencies>
</project>"
[ "${REALPEERS_FETCH_ONLY:-}" = 1 ] && { log "jars cached in $LIBS"; exit 0; }

# 2. Configuration. RUN_DIR/config goes first on the classpath, so these files win over
# the defaults bundled in the jars.
CONF=$RUN_DIR/config
mkdir -p "$CONF"/{oal,lal,log-mal-rules,meter-analyzer-config,ui-initialized-templates} "$RUN_DIR/logs"
if [ -n "${OAP_KAFKA_BOOTSTRAP:-}" ]; then KAFKA_SELECTOR=default; else KAFKA_SELECTOR=-; fi

# The receiver-sharing-server has port 0 so every receiver (gRPC and the HTTP /v3/* routes)
# shares core's two ports. Sampling keeps everything; searchable tags cover what tests
# filter on.
cat > "$CONF/application.yml" <<EOF
cluster: {selector: standalone, standalone: {}}
core:
  selector: default
  default:
    role: Mixed
    restHost: 127.0.0.1
    restPort: $REST_PORT
    restContextPath: /
    gRPCHost: 127.0.0.1
    gRPCPort: $GRPC_PORT
    downsampling: [Hour, Day]
    enableDataKeeperExecutor: false
    recordDataTTL: 3
    metricsDataTTL: 7
    l1FlushPeriod: 500
    storageSessionTimeout: 70000
    persistentPeriod: $PERSIST
    topNReportPeriod: 10
    searchableTracesTags: http.method,http.status_code,rpc.status_code,db.type,db.instance,mq.queue,mq.topic,mq.broker
    searchableLogsTags: level,http.status_code
    searchableAlarmTags: level
    enableEndpointNameGroupingByOpenapi: false
    enableHierarchy: false
storage:
  selector: h2
  h2:
    properties:
      jdbcUrl: jdbc:h2:mem:skywalking-oap-db;DB_CLOSE_DELAY=-1;DATABASE_TO_UPPER=FALSE
      dataSource.user: sa
    metadataQueryMaxSize: 5000
    maxSizeOfBatchSql: 100
    asyncBatchPersistentPoolSize: 1
agent-analyzer:
  selector: default
  default:
    traceSamplingPolicySettingsFile: trace-sampling-policy-settings.yml
    forceSampleErrorSegment: true
    segmentStatusAnalysisStrategy: FROM_SPAN_STATUS
    noUpstreamRealAddressAgents: 6000,9000
    meterAnalyzerActiveFiles: python-pvm,swmp-test
log-analyzer: {selector: default, default: {lalFiles: default, malFiles: ""}}
event-analyzer: {selector: default, default: {}}
receiver-sharing-server:
  selector: default
  default: {restHost: 127.0.0.1, restPort: 0, gRPCHost: 127.0.0.1, gRPCPort: 0}
receiver-register: {selector: default, default: {}}
receiver-trace: {selector: default, default: {}}
receiver-jvm: {selector: default, default: {}}
receiver-profile: {selector: default, default: {}}
receiver-meter: {selector: default, default: {}}
receiver-log: {selector: default, default: {}}
receiver-event: {selector: default, default: {}}
configuration-discovery: {selector: default, default: {disableMessageDigest: false}}
ai-pipeline: {selector: default, default: {uriRecognitionServerAddr: "", uriRecognitionServerPort: 17128}}
kafka-fetcher:
  selector: "$KAFKA_SELECTOR"
  default:
    bootstrapServers: "${OAP_KAFKA_BOOTSTRAP:-127.0.0.1:9092}"
    namespace: "${OAP_NAMESPACE:-}"
    partitions: 1
    replicationFactor: 1
    enableNativeProtoLog: true
    enableNativeJsonLog: true
    consumers: 1
    kafkaHandlerThreadPoolSize: -1
    kafkaHandlerThreadPoolQueueSize: -1
query:
  selector: graphql
  graphql: {enableLogTestTool: false, maxQueryComplexity: 3000, enableUpdateUITemplate: false, enableOnDemandPodLog: false}
telemetry: {selector: none, none: {}}
configuration: {selector: none, none: {}}
EOF

cat > "$CONF/log4j2.xml" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="OUT" target="SYSTEM_OUT"><PatternLayout pattern="%d %c{1} [%t] %-5p - %m%n"/></Console></Appenders>
  <Loggers><Root level="INFO"><AppenderRef ref="OUT"/></Root></Loggers>
</Configuration>
EOF
: > "$CONF/endpoint-name-grouping.yml"
: > "$CONF/gateways.yml"
echo 'default: 500' > "$CONF/service-apdex-threshold.yml"
printf 'default:\n  rate: 10000\n  duration: -1\n' > "$CONF/trace-sampling-policy-settings.yml"
# shellcheck disable=SC2016 # ${NAME} is for the OAP to expand, not the shell
printf 'serviceName: ${NAME}\nserviceInstanceName: ${NAME}\n' > "$CONF/metadata-service-mapping.yaml"

# Component ids the OAP resolves to names in traces and topology. The Python block is
# SkyWalking's registered list ([7000, 8000) is the Python range); the shared ids below it
# are the client libraries Python plugins also report, plus the server names that
# Component-Server-Mappings points at (the OAP refuses to start if a mapped name is not
# defined). An id missing here shows up as "N/A" in query results.
cat > "$CONF/component-libraries.yml" <<'EOF'
Unknown: {id: 0, languages: All}
Mysql: {id: 5, languages: Java}
Redis: {id: 7, languages: "Java,Python"}
MongoDB: {id: 9, languages: "Java,Python"}
PostgreSQL: {id: 22, languages: Java}
Kafka: {id: 27, languages: Java}
kafka-producer: {id: 40, languages: "Java,Python"}
kafka-consumer: {id: 41, languages: "Java,Python"}
Elasticsearch: {id: 47, languages: "Java,Python"}
RabbitMQ: {id: 51, languages: Java}
rabbitmq-producer: {id: 52, languages: "Java,Python"}
rabbitmq-consumer: {id: 53, languages: "Java,Python"}
Python: {id: 7000, languages: Python}
Flask: {id: 7001, languages: Python}
Requests: {id: 7002, languages: Python}
PyMysql: {id: 7003, languages: Python}
Django: {id: 7004, languages: Python}
Tornado: {id: 7005, languages: Python}
Urllib3: {id: 7006, languages: Python}
Sanic: {id: 7007, languages: Python}
AioHttp: {id: 7008, languages: Python}
Pyramid: {id: 7009, languages: Python}
Psychopg: {id: 7010, languages: Python}
Celery: {id: 7011, languages: Python}
Falcon: {id: 7012, languages: Python}
MysqlClient: {id: 7013, languages: Python}
FastAPI: {id: 7014, languages: Python}
Bottle: {id: 7015, languages: Python}
AsyncPG: {id: 7016, languages: Python}
AIORedis: {id: 7017, languages: Python}
Websockets: {id: 7018, languages: Python}
HTTPX: {id: 7019, languages: Python}
Component-Server-Mappings:
  kafka-producer: Kafka
  kafka-consumer: Kafka
  rabbitmq-producer: RabbitMQ
  rabbitmq-consumer: RabbitMQ
  PyMysql: Mysql
  MysqlClient: Mysql
  Psychopg: PostgreSQL
  AsyncPG: PostgreSQL
  AIORedis: Redis
EOF

# OAL: a service and an endpoint metric are enough to see traffic analysed. The JVM
# receiver loads oal/java-agent.oal at start-up and the OAP aborts if it is missing, so it
# gets one line.
cat > "$CONF/oal/core.oal" <<'EOF'
service_cpm = from(Service.*).cpm();
service_resp_time = from(Service.latency).longAvg();
endpoint_cpm = from(Endpoint.*).cpm();
EOF
echo '// nothing disabled' > "$CONF/oal/disable.oal"
echo 'instance_jvm_cpu = from(ServiceInstanceJVMCPU.usePercent).doubleAvg();' > "$CONF/oal/java-agent.oal"

# LAL: keep every log as it arrives.
cat > "$CONF/lal/default.yaml" <<'EOF'
rules:
  - name: default
    layer: GENERAL
    dsl: |
      filter {
        sink {
        }
      }
EOF

# MAL: meters become queryable only when a rule names them. The OAP adds the labels
# `service` and `instance` to every received sample; the rules attach the result to that
# service instance.
#  - python-pvm: two of the Python agent's process gauges, stored as meter_test_<name>;
#  - swmp-test: meters that tests send on purpose, stored as meter_<name>; extra labels are
#    summed away so any label set works.
cat > "$CONF/meter-analyzer-config/python-pvm.yaml" <<'EOF'
expSuffix: instance(['service'], ['instance'], Layer.GENERAL)
metricPrefix: meter_test
metricsRules:
  - name: thread_active_count
    exp: instance_pvm_thread_active_count
  - name: total_cpu_utilization
    exp: instance_pvm_total_cpu_utilization
EOF
cat > "$CONF/meter-analyzer-config/swmp-test.yaml" <<'EOF'
expSuffix: instance(['service'], ['instance'], Layer.GENERAL)
metricPrefix: meter
metricsRules:
  - name: swmp_test_gauge
    exp: swmp_test_gauge.sum(['service', 'instance'])
  - name: swmp_test_counter
    exp: swmp_test_counter.sum(['service', 'instance'])
  - name: swmp_test_histogram
    exp: swmp_test_histogram.sum(['le', 'service', 'instance']).histogram().histogram_percentile([50, 90, 99])
EOF

for p in "$GRPC_PORT" "$REST_PORT"; do
  if port_busy "$p"; then log "port $p is already in use"; exit 3; fi
done

# 3. Start.
T0=$(now_ms)
TZ=UTC java -Xms256m "-Xmx$HEAP" -XX:+UseSerialGC -Duser.timezone=UTC -Doap.logDir="$RUN_DIR/logs" \
     -cp "$CONF:$LIBS/*" org.apache.skywalking.oap.server.starter.OAPServerStartUp \
     </dev/null > "$RUN_DIR/oap.log" 2>&1 &
PID=$!
echo "$PID" > "$RUN_DIR/oap.pid"
start_watchdog "${REALPEERS_OWNER_PID:-}" "$PID"

# 4. Ready = boot summary logged, both ports open, and a GraphQL query answered (the REST
# port opens a little before the query module is wired).
graphql_ok() {
  local body='{"query":"{ listLayers }"}' url="http://127.0.0.1:$REST_PORT/graphql"
  if command -v curl >/dev/null 2>&1; then
    curl -sf -m 3 -X POST "$url" -H 'Content-Type: application/json' -d "$body" 2>/dev/null | grep -q listLayers
  else
    python3 - "$url" "$body" <<'PY' >/dev/null 2>&1
import sys, urllib.request
req = urllib.request.Request(sys.argv[1], sys.argv[2].encode(), {"Content-Type": "application/json"})
sys.exit(0 if b"listLayers" in urllib.request.urlopen(req, timeout=3).read() else 1)
PY
  fi
}
DEADLINE=$(( T0 + READY_TIMEOUT * 1000 ))
while [ "$(now_ms)" -lt "$DEADLINE" ]; do
  if ! kill -0 "$PID" 2>/dev/null; then
    log "OAP exited during start-up; errors from $RUN_DIR/oap.log:"
    grep -E 'ERROR|Caused by|Exception' "$RUN_DIR/oap.log" | head -20 >&2 || tail -20 "$RUN_DIR/oap.log" >&2
    exit 1
  fi
  if grep -q 'key booting parameters' "$RUN_DIR/oap.log" 2>/dev/null &&
     port_busy "$GRPC_PORT" && port_busy "$REST_PORT" && graphql_ok; then
    log "ready in $(( $(now_ms) - T0 ))ms pid=$PID grpc=127.0.0.1:$GRPC_PORT rest=http://127.0.0.1:$REST_PORT kafka=${OAP_KAFKA_BOOTSTRAP:-off} run_dir=$RUN_DIR"
    echo "$PID"
    exit 0
  fi
  sleep 0.25
done
log "not ready after ${READY_TIMEOUT}s; stopping pid $PID (log: $RUN_DIR/oap.log)"
kill "$PID" 2>/dev/null || true
exit 1
