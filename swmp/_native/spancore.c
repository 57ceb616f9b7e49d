/* swmp._spancore: the optional native core of a span's life (swmp/tracing/span.py).
 *
 * Why native: a span is created, made current and finished on every traced call, and in a
 * worker that call sits between blocking I/O (a query, a cache round trip). After each wait
 * the CPU caches are cold, and interpreted code then pays per distinct bytecode and object
 * it touches: measured here, the same ~90 bytecodes that cost 2.5 us in a warm loop cost
 * ~5-6 us between PostgreSQL round trips. This module keeps that path in a few hundred
 * instructions of C.
 *
 * What it is: ``SpanCore``, the base class of ``swmp.tracing.span.Span``, holding the
 * record's fields in a C struct (readable and writable from Python like attributes) and
 * implementing construction, ``__enter__``, ``__exit__`` and ``finish`` exactly as the
 * pure-Python ``PySpanCore`` in span.py does (tests/test_spancore.py runs the tracing tests
 * under both and compares records); plus ``rows``, the span part of a SEGMENT record. The
 * rarely used methods (tags, logs, errors, propagation) stay in Python, in ``Span``.
 *
 * ``SegmentCore`` is the base class of swmp.tracing.segment.Segment in the same way: a new
 * segment (one per traced request or consumed message) is made here, its id drawn here too
 * (``new_id``: this process's random prefix and a counter; the Python side reseeds it after
 * fork), instead of in a Python ``__init__`` that called a Python id function. The segment's
 * lock-free bookkeeping (``finished``, ``_open``, ``_token``) is done with the same list
 * operations as segment.py, each atomic under the GIL, and it is emitted exactly when
 * Segment.closed would: a native segment by ``emit_fast`` (Segment.emit's steps in C),
 * any other by its ``emit()``.
 *
 * This file is the module: its functions' table and its init. The span core's sources:
 * span.c (SpanCore: the fields, the type), finish.c (the context, a span's end, the
 * segment's bookkeeping), segment.c (SegmentCore and the ids), emit.c (the record and its
 * emission), start.c (exit_child, new_exit_span, entry_root), route.c (name_request),
 * inject.c (the outgoing sw8: inject, sw8_header), carrier.c (the incoming carrier:
 * decode_carrier), helpers.c (small steps the other sources share); span.h and segment.h
 * hold what they share.
 *
 * ``Gate`` (gate.c): a patched method whose check for a current span is made here;
 * ``thread_skipped`` / ``runs_in_own_context`` (threads.c): the thread instrumentation's checks.
 * ``split_sw8`` (sw8.c): the plain case of an incoming ``sw8`` header.
 * The SEGMENT record's JSON (json.c): written from the spans' fields, orjson's bytes.
 * ``sql_span`` (sql.c): the exit span of one SQL call, with its tags; ``SqlCall``: a
 * cursor's ``execute`` run inside it.
 * ``CacheCall`` (cache.c): a Redis or memcached command run inside its exit span.
 * ``CelerySend`` (celery.c): ``Celery.send_task`` in its exit span, the message carrying it.
 * ``wsgi_call`` (wsgi.c): a WSGI request run inside its entry span; ``WSGIMethod``: a
 * framework's WSGI entry method patched to run through it.
 * ``asgi_entry`` (asgi.c): an ASGI request's entry span and its tags; ``within``
 * (within.c): an awaitable run inside a span without a Python coroutine, and its lazy
 * form, which opens the span at the first send (the async ``SqlCall`` / ``CacheCall``,
 * ``AwaitingCall``).
 * ``amqp_consuming`` / ``kafka_consumed`` (consume.c): a consumed message's entry span;
 * ``pika_consuming`` / ``aiormq_consuming`` / ``pika_callback`` (deliver.c): its facts read
 * from the client's objects, and a pika callback run inside it.
 * ``amqp_attach`` (attach.c): a RabbitMQ publish's copy of the properties with the headers;
 * ``AmqpPublish`` (publish.c): aiormq's publish run in its span without a Python coroutine;
 * ``KafkaSend`` (kafka_send.c): the same for aiokafka's send.
 * ``status_recorder`` / ``status_sender`` (status.c): a traced WSGI request's
 * ``start_response``, an ASGI request's ``send``; ``wsgi_body`` (body.c): its response.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "asgi.h"
#include "body.h"
#include "cache.h"
#include "celery.h"
#include "gate.h"
#include "json.h"
#include "spancore.h"
#include "sql.h"
#include "status.h"
#include "threads.h"
#include "within.h"
#include "wsgi.h"
#include "sw8.h"
#include "slots.h"
#include "mq.h"
#include "consume.h"
#include "deliver.h"
#include "attach.h"
#include "attrcache.h"
#include "publish.h"
#include "kafka_send.h"
#include "span.h"
#include "finish.h"
#include "segment.h"
#include "emit.h"
#include "start.h"
#include "route.h"
#include "inject.h"
#include "carrier.h"

static PyObject *json_dumps(PyObject *module, PyObject *value) {
    PyObject *out = swmp_json_dump(value);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))swmp_setup, METH_FASTCALL,
     "setup(current_span, empty, count_lost): what the spans share with swmp.tracing.span."},
    {"setup_exit", (PyCFunction)(void (*)(void))swmp_setup_exit, METH_FASTCALL,
     "setup_exit(span_class, exit_kind, limits): what exit_child() needs."},
    {"setup_entry", (PyCFunction)(void (*)(void))swmp_setup_entry, METH_FASTCALL,
     "setup_entry(segment_class, entry_kind, policy, rules_type, profile_gate, carrier_type, cross_process_ref)"},
    {"entry_root", (PyCFunction)(void (*)(void))swmp_entry_root_py, METH_FASTCALL,
     "entry_root(op, component, layer, carrier): a new segment's entry span, or None (Python decides)."},
    {"setup_new_exit", (PyCFunction)(void (*)(void))swmp_setup_new_exit, METH_FASTCALL,
     "setup_new_exit(new_exit_span, decide_exit_span): the Python paths new_exit_span() hands over to."},
    {"new_exit_span", (PyCFunction)(void (*)(void))swmp_new_exit_span, METH_FASTCALL | METH_KEYWORDS,
     "new_exit_span(op, peer, component, layer, carrier=None): context.new_exit_span, its common cases in C."},
    {"exit_child", (PyCFunction)(void (*)(void))swmp_exit_child, METH_FASTCALL,
     "exit_child(op, peer, component, layer): a child exit span of the current span, the first span of a "
     "new trace when none is current, or None."},
    {"setup_carrier", (PyCFunction)(void (*)(void))swmp_setup_carrier, METH_FASTCALL,
     "setup_carrier(carrier_class, callers): what decode_carrier() builds and the callers it knows."},
    {"decode_carrier", (PyCFunction)swmp_decode_carrier, METH_O,
     "decode_carrier(value): the ContextCarrier of a plain sw8 from a known caller, else None."},
    {"setup_inject", (PyCFunction)(void (*)(void))swmp_setup_inject, METH_FASTCALL,
     "setup_inject(fallback): what span.inject() calls when it does not build the headers itself."},
    {"rows", (PyCFunction)(void (*)(void))swmp_rows, METH_FASTCALL,
     "rows(spans, skip_analysis): the span lists of a SEGMENT record."},
    {"set_ids", (PyCFunction)(void (*)(void))swmp_set_ids, METH_FASTCALL,
     "set_ids(prefix, pid, pid_holder, pid_function, reseed): this process's id source."},
    {"new_id", (PyCFunction)swmp_new_id, METH_NOARGS, "new_id(): a unique id (prefix + counter)."},
    {"set_direct_sink", (PyCFunction)(void (*)(void))swmp_set_direct_sink, METH_FASTCALL,
     "set_direct_sink(write, pid_holder, pid_function): the sink method emit may go around."},
    {"set_emit", (PyCFunction)(void (*)(void))swmp_set_emit, METH_FASTCALL,
     "set_emit(emit, identity, dumps, sink_namespace, stats, record_type): what Segment.emit uses."},
    {"setup_status", (PyCFunction)(void (*)(void))swmp_setup_status, METH_FASTCALL,
     "setup_status(tags, limits): the status tags the recorders append."},
    {"setup_recorder", (PyCFunction)(void (*)(void))swmp_setup_recorder, METH_FASTCALL,
     "setup_recorder(slow, call): the WSGI recorder's Python code."},
    {"setup_sender", (PyCFunction)(void (*)(void))swmp_setup_sender, METH_FASTCALL,
     "setup_sender(span_class, send_slow, send_call): the ASGI sender's Python code."},
    {"status_recorder", (PyCFunction)(void (*)(void))swmp_status_recorder, METH_FASTCALL,
     "status_recorder(span, start_response): a traced WSGI request's start_response."},
    {"wsgi_body", (PyCFunction)(void (*)(void))swmp_wsgi_body, METH_FASTCALL,
     "wsgi_body(result, span): a WSGI response that finishes span when closed."},
    {"setup_wsgi_body", (PyCFunction)swmp_setup_wsgi_body, METH_O,
     "setup_wsgi_body(failed_first): what wsgi_body() calls when the response fails before its first item."},
    {"status_sender", (PyCFunction)(void (*)(void))swmp_status_sender, METH_FASTCALL,
     "status_sender(span, send): a traced ASGI request's send."},
    {"sw8_header", (PyCFunction)(void (*)(void))swmp_sw8_header, METH_FASTCALL,
     "sw8_header(span, service_b64, instance_b64): the sw8 value Span.inject sends, or None."},
    {"json_dumps", (PyCFunction)json_dumps, METH_O,
     "json_dumps(value): the record writer's bytes for value (orjson's), or None where it declines."},
    {"split_sw8", (PyCFunction)swmp_split_sw8, METH_O,
     "split_sw8(value): (sampled, trace_id, segment_id, span_id, tail) of a plain sw8, else None."},
    {"setup_route", (PyCFunction)swmp_setup_route, METH_O,
     "setup_route(name_request): the Python name_request that name_request() hands other cases to."},
    {"name_request", (PyCFunction)swmp_name_request, METH_O,
     "name_request(template): name the request's entry span after its route (swmp/instrument/_route.py)."},
    {"setup_asgi", (PyCFunction)(void (*)(void))swmp_setup_asgi, METH_FASTCALL,
     "setup_asgi(py_entry, tag_request, decide_entry_span, from_headers, request_tags, noop, span_class, policy, "
     "limits, layer, tag_method, tag_url, no_tags): what asgi_entry() reads and hands over to."},
    {"asgi_entry", (PyCFunction)(void (*)(void))swmp_asgi_entry, METH_FASTCALL,
     "asgi_entry(scope, component, collect_params, params_limit): an ASGI request's entry span, tagged, or None."},
    {"setup_sql", (PyCFunction)(void (*)(void))swmp_setup_sql, METH_FASTCALL,
     "setup_sql(py_sql_span, span_class, no_tags, limits, settings, text, params_text, layer, tag_type, "
     "tag_instance, tag_statement, tag_parameters): what sql_span() reads and hands over to."},
    {"setup_cache", (PyCFunction)(void (*)(void))swmp_setup_cache, METH_FASTCALL,
     "setup_cache(span_class, no_tags, limits, settings, layer, tag_key, tag_instance): what CacheCall reads."},
    {"sql_span", (PyCFunction)(void (*)(void))swmp_sql_span, METH_FASTCALL | METH_KEYWORDS,
     "sql_span(op, address, component, db_type, instance, statement, params=None, many=False): the exit span "
     "of one SQL call, tagged (swmp/instrument/_datastore.py's sql_span)."},
    {"setup_celery", (PyCFunction)(void (*)(void))swmp_setup_celery, METH_FASTCALL,
     "setup_celery(span_class, noop, no_tags, limits, settings, component, layer, tag_broker, armed, failed, "
     "not_consumed, send_in): what CelerySend reads and hands over to."},
    {"setup_wsgi", (PyCFunction)(void (*)(void))swmp_setup_wsgi, METH_FASTCALL,
     "setup_wsgi(py_trace, tag_request, run_unrecorded, decide_entry_span, from_headers, request_tags, noop, "
     "span_class, policy, limits, layer, tag_method, tag_url, no_tags, current): what wsgi_call() reads and hands "
     "over to."},
    {"setup_wsgi_file", (PyCFunction)swmp_setup_wsgi_file, METH_O,
     "setup_wsgi_file(file_response): what wsgi_call() hands a server's own file wrapper to."},
    {"wsgi_call", (PyCFunction)(void (*)(void))swmp_wsgi_call, METH_FASTCALL | METH_KEYWORDS,
     "wsgi_call(app, environ, start_response, component, collect_params, params_limit): a WSGI request run in "
     "its entry span (swmp/instrument/wsgi.py's trace_wsgi)."},
    {"within", (PyCFunction)(void (*)(void))swmp_within, METH_FASTCALL,
     "within(span, awaitable): awaitable awaited with span entered around it (no Python coroutine)."},
    {"setup_threads", (PyCFunction)(void (*)(void))swmp_setup_threads, METH_FASTCALL,
     "setup_threads(skip_prefixes, skip_exact, copying_owners, partial): what the thread checks read."},
    {"thread_skipped", (PyCFunction)(void (*)(void))swmp_thread_skipped, METH_FASTCALL | METH_KEYWORDS,
     "thread_skipped(thread): whether Thread.start leaves this thread untraced (a Gate's passes)."},
    {"runs_in_own_context", (PyCFunction)(void (*)(void))swmp_runs_in_own_context, METH_FASTCALL | METH_KEYWORDS,
     "runs_in_own_context(executor, fn, ...): whether submit() leaves this work item as it is (a Gate's passes)."},
    {"setup_mq", (PyCFunction)(void (*)(void))swmp_setup_mq, METH_FASTCALL,
     "setup_mq(span_class, kafka_send_span, amqp_send_span, kafka_headers, amqp_headers, tag_mq, failed, limits, "
     "layer, tag_broker, tag_topic, tag_queue, own_headers, kafka_component, amqp_component): the Python forms the "
     "producer steps hand other cases to, and what they read."},
    {"kafka_send_span", (PyCFunction)(void (*)(void))swmp_kafka_send_span, METH_FASTCALL | METH_KEYWORDS,
     "kafka_send_span(topic, brokers, headers, merge=None): a Kafka producer's exit span, tagged, and the record's "
     "new headers; (None, None) when nothing is recorded (swmp/instrument/_mq.py)."},
    {"amqp_send_span", (PyCFunction)(void (*)(void))swmp_amqp_send_span, METH_FASTCALL | METH_KEYWORDS,
     "amqp_send_span(exchange, routing_key, peer, attach, arg): a RabbitMQ publisher's exit span, tagged, and "
     "attach(span, arg); (None, None) when nothing is recorded (swmp/instrument/_mq.py)."},
    {"kafka_headers", (PyCFunction)(void (*)(void))swmp_kafka_headers, METH_FASTCALL,
     "kafka_headers(span, headers): a new Kafka header list, the caller's without sw8 ones plus the span's."},
    {"amqp_headers", (PyCFunction)(void (*)(void))swmp_amqp_headers, METH_FASTCALL,
     "amqp_headers(span, headers): a new AMQP headers table, the caller's without sw8 ones plus the span's."},
    {"setup_consume", (PyCFunction)(void (*)(void))swmp_setup_consume, METH_FASTCALL,
     "setup_consume(span_class, amqp_consuming, table_carrier, decode_sw8, decide_entry_span, current, "
     "failed, layer, component, sw8, sw8_correlation, sw8_x): the Python forms amqp_consuming() hands other cases to, "
     "and what it reads (after setup_mq())."},
    {"amqp_consuming", (PyCFunction)(void (*)(void))swmp_amqp_consuming, METH_FASTCALL,
     "amqp_consuming(exchange, routing_key, headers, peer): the entry span of one delivered RabbitMQ message, "
     "current inside ``with`` (swmp/instrument/_mq.py)."},
    {"pika_consuming", (PyCFunction)(void (*)(void))swmp_pika_consuming, METH_FASTCALL,
     "pika_consuming(channel, method, properties): amqp_consuming() with the facts of a message delivered on a "
     "pika channel (swmp/instrument/pika.py's _consuming)."},
    {"aiormq_consuming", (PyCFunction)(void (*)(void))swmp_aiormq_consuming, METH_FASTCALL,
     "aiormq_consuming(channel, message): amqp_consuming() with the facts of a message delivered on an aiormq "
     "channel (swmp/instrument/aiormq.py's _message_facts)."},
    {"slot_attr", (PyCFunction)(void (*)(void))swmp_slot_attr_py, METH_FASTCALL,
     "slot_attr(obj, name): getattr(obj, name) as the C paths read their settings (attrcache.c), one cache."},
    {"amqp_attach", (PyCFunction)(void (*)(void))swmp_amqp_attach, METH_FASTCALL,
     "amqp_attach(factory, shallow_copy, native_plan): the attach step of a RabbitMQ publish, attach(span, "
     "properties): a copy of the properties (factory() for None) with the span's headers table."},
    {"pika_peer", (PyCFunction)swmp_pika_peer, METH_O,
     "pika_peer(channel): swmp/instrument/pika.py's _peer, remembered for the last connection parameters."},
    {"aiormq_peer", (PyCFunction)swmp_aiormq_peer, METH_O,
     "aiormq_peer(channel): swmp/instrument/aiormq.py's _peer, remembered for the last URL."},
    {"pika_callback", (PyCFunction)(void (*)(void))swmp_pika_callback, METH_FASTCALL,
     "pika_callback(callback, via_impl=True): callback(channel, method, properties, body) run inside the message's "
     "entry span, its facts read from channel._impl (a BlockingChannel's) or the channel "
     "(swmp/instrument/pika.py's _traced_callback)."},
    {"setup_kafka_consumed", (PyCFunction)(void (*)(void))swmp_setup_kafka_consumed, METH_FASTCALL,
     "setup_kafka_consumed(kafka_consumed, failed, component): the Python form kafka_consumed() hands other cases "
     "to, the failure logger, the component (after setup_consume())."},
    {"kafka_consumed", (PyCFunction)(void (*)(void))swmp_kafka_consumed, METH_FASTCALL,
     "kafka_consumed(topic, group, headers, brokers): the entry span of one Kafka record returned to the caller, "
     "recorded and finished (swmp/instrument/_mq.py)."},
    {"copy_slots", (PyCFunction)(void (*)(void))swmp_copy_slots, METH_FASTCALL,
     "copy_slots(obj, descriptors): a new object.__new__ instance of type(obj) with obj's values in those slots."},
    {"set_segments", (PyCFunction)(void (*)(void))swmp_set_segments, METH_FASTCALL,
     "set_segments(identity, no_correlation): what a new segment needs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef spancore_module = {
    PyModuleDef_HEAD_INIT, "swmp._spancore", "The native core of a span's life (see spancore.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__spancore(void) {
    if (swmp_finish_init() < 0 || swmp_segment_init() < 0 || swmp_emit_init() < 0 || swmp_start_init() < 0 ||
        swmp_inject_init() < 0) {
        return NULL;
    }
    swmp_sw8_init();
    if (PyType_Ready(&swmp_SpanCoreType) < 0 || PyType_Ready(&swmp_SegmentCoreType) < 0 ||
        PyType_Ready(&swmp_SpanIdsType) < 0 || PyType_Ready(&swmp_GateType) < 0 ||
        PyType_Ready(&swmp_StatusRecorderType) < 0 || PyType_Ready(&swmp_BodyType) < 0 ||
        PyType_Ready(&swmp_WithinType) < 0 || PyType_Ready(&swmp_AwaitingCallType) < 0 ||
        PyType_Ready(&swmp_AmqpPublishType) < 0 || PyType_Ready(&swmp_KafkaSendType) < 0 ||
        PyType_Ready(&swmp_WSGIMethodType) < 0 ||
        PyType_Ready(&swmp_SqlCallType) < 0 || PyType_Ready(&swmp_CacheCallType) < 0 ||
        PyType_Ready(&swmp_CelerySendType) < 0 || PyType_Ready(&swmp_ConsumingType) < 0 ||
        PyType_Ready(&swmp_PikaCallbackType) < 0 || PyType_Ready(&swmp_AttachType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&spancore_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "SpanCore", (PyObject *)&swmp_SpanCoreType) < 0 ||
        PyModule_AddObjectRef(m, "SegmentCore", (PyObject *)&swmp_SegmentCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Gate", (PyObject *)&swmp_GateType) < 0 ||
        PyModule_AddObjectRef(m, "SqlCall", (PyObject *)&swmp_SqlCallType) < 0 ||
        PyModule_AddObjectRef(m, "CacheCall", (PyObject *)&swmp_CacheCallType) < 0 ||
        PyModule_AddObjectRef(m, "AwaitingCall", (PyObject *)&swmp_AwaitingCallType) < 0 ||
        PyModule_AddObjectRef(m, "AmqpPublish", (PyObject *)&swmp_AmqpPublishType) < 0 ||
        PyModule_AddObjectRef(m, "KafkaSend", (PyObject *)&swmp_KafkaSendType) < 0 ||
        PyModule_AddObjectRef(m, "CelerySend", (PyObject *)&swmp_CelerySendType) < 0 ||
        PyModule_AddObjectRef(m, "WSGIMethod", (PyObject *)&swmp_WSGIMethodType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
