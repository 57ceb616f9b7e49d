/* The producer side of the message-queue instrumentations (swmp/instrument/_mq.py) in C:
 *
 *   kafka_send_span(topic, brokers, headers, merge=None) -> (span, new headers) | (None, None)
 *   amqp_send_span(exchange, routing_key, peer, attach, arg) -> (span, attach(span, arg)) | ...
 *   kafka_headers(span, headers), amqp_headers(span, headers): the caller's headers without
 *       old sw8 ones, plus this span's.
 *
 * Why: a traced publish ran five Python frames of the agent's (the send's span, the
 * producer span, the exit span, its tags, the header list) between the client's own work;
 * in a process that waits for its broker they run with the CPU caches cold, where each
 * frame's bytecode, code object and globals cost their cache lines (docs/performance.md,
 * "Where the real-server and end-to-end gap comes from"). The same reasoning as CacheCall.
 *
 * The common case only, every step as the Python form (``_py_*`` in _mq.py, the
 * reference and the fallback) takes it: names that are exact strs and tag values within the
 * tag limit, decided before the span exists (a span once made counts as open in its
 * segment, so the fallback cannot be chosen after it); header lists of tuples and header
 * dicts with str keys, merged here; anything else is the Python form's. An ``Exception``
 * once the span exists is the Python form's ``except``: ``failed(component, span)`` logs it
 * once and finishes the span, and the message goes out untraced ``(None, None)``. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "join.h"
#include "mq.h"
#include "spancore.h"

/* Set by setup_mq(): see its docstring in spancore.c's method table. */
static PyTypeObject *span_class = NULL;
static PyObject *py_kafka_send = NULL, *py_amqp_send = NULL, *py_kafka_headers = NULL, *py_amqp_headers = NULL,
                *py_tag_mq = NULL, *failed = NULL, *limits = NULL, *layer = NULL, *tag_broker = NULL, *tag_topic = NULL,
                *tag_queue = NULL, *own_headers = NULL, *kafka_component = NULL, *amqp_component = NULL;
static PyObject *s_kafka, *s_producer, *s_rabbitmq, *s_queue, *s_inject, *s_encode, *s_ascii, *s_sw8;

PyObject *swmp_setup_mq(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15 || !PyType_Check(args[0]) || !PyFrozenSet_CheckExact(args[12])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_mq(span_class: type, kafka_send_span, amqp_send_span, kafka_headers, amqp_headers, "
                        "tag_mq, failed, limits, layer, tag_broker, tag_topic, tag_queue, own_headers: frozenset, "
                        "kafka_component, amqp_component)");
        return NULL;
    }
    if (s_sw8 == NULL && ((s_kafka = PyUnicode_InternFromString("Kafka/")) == NULL ||
                            (s_producer = PyUnicode_InternFromString("/Producer")) == NULL ||
                            (s_rabbitmq = PyUnicode_InternFromString("RabbitMQ/Topic/")) == NULL ||
                            (s_queue = PyUnicode_InternFromString("/Queue/")) == NULL ||
                            (s_inject = PyUnicode_InternFromString("inject")) == NULL ||
                            (s_encode = PyUnicode_InternFromString("encode")) == NULL ||
                            (s_ascii = PyUnicode_InternFromString("ascii")) == NULL ||
                            (s_sw8 = PyUnicode_InternFromString("sw8")) == NULL)) {
        return NULL;
    }
    PyObject **slots[] = {(PyObject **)&span_class, &py_kafka_send, &py_amqp_send, &py_kafka_headers, &py_amqp_headers,
                          &py_tag_mq, &failed, &limits, &layer, &tag_broker, &tag_topic, &tag_queue, &own_headers,
                          &kafka_component, &amqp_component};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    return Py_NewRef(Py_None);
}

int swmp_mq_fit(PyObject *const *values, int n) {
    Py_ssize_t lim = swmp_tag_limit(limits);
    if (lim == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return -1;
        }
        PyErr_Clear(); /* the Python form reads the limit itself, and says what is wrong */
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (PyUnicode_GET_LENGTH(values[i]) > lim) {
            return 0;
        }
    }
    return 1;
}

int swmp_mq_tags(PyObject *span, PyObject *broker, PyObject *topic, PyObject *queue) {
    if (Py_IS_TYPE(span, span_class) && !PyObject_IsTrue(swmp_span_tags(span))) {
        PyObject *tags = PyList_New(queue != NULL ? 6 : 4);
        if (tags == NULL) {
            return -1;
        }
        PyObject *items[6] = {tag_broker, broker, tag_topic, topic, tag_queue, queue};
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tags); i++) {
            PyList_SET_ITEM(tags, i, Py_NewRef(items[i]));
        }
        swmp_span_set_tags(span, tags);
        return 0;
    }
    PyObject *r = PyObject_CallFunctionObjArgs(py_tag_mq, span, broker, topic, queue != NULL ? queue : Py_None, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static PyObject *none_pair(void) {
    return swmp_pair(Py_None, Py_None);
}

/* The ``except Exception`` of the Python form: the error set now logged once by ``failed``
 * (warn_once logs the exception being handled: it is made that one for the call), the span
 * finished there, and the message sent untraced. Anything that is not an Exception
 * (KeyboardInterrupt...) is raised, as the Python form raises it. */
static PyObject *give_up(PyObject *component, PyObject *span) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return NULL;
    }
    PyObject *args[2] = {component, span != NULL ? span : Py_None};
    swmp_report_handled(failed, args, 2);
    return none_pair();
}

/* span.inject(): the span core's own for the recorded class, the method otherwise. */
static PyObject *inject(PyObject *span) {
    return Py_IS_TYPE(span, span_class) ? swmp_span_inject(span) : PyObject_CallMethodNoArgs(span, s_inject);
}

/* The truth of a caller's headers (None: false without a call). */
static int given(PyObject *headers) {
    return headers == Py_None ? 0 : PyObject_IsTrue(headers);
}

/* kafka_headers(span, headers): a new Kafka header list, the caller's ``(name, value)``
 * tuples without sw8 ones, then the span's headers as ``(name, ASCII bytes)``. Other shapes
 * (not a list, an item that is not a tuple or whose name is not an exact str) are the
 * Python form's. */
static PyObject *kafka_merge(PyObject *span, PyObject *headers) {
    int truth = given(headers);
    if (truth < 0) {
        return NULL;
    }
    if (truth && !PyList_CheckExact(headers)) {
        return PyObject_CallFunctionObjArgs(py_kafka_headers, span, headers, NULL);
    }
    /* Made before the headers are checked: making a list may run the garbage collector, and
     * with it finalizers that could change the caller's list between the check and the copy. */
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; truth && i < PyList_GET_SIZE(headers); i++) {
        PyObject *h = PyList_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) < 1 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(h, 0))) {
            Py_DECREF(out);
            return PyObject_CallFunctionObjArgs(py_kafka_headers, span, headers, NULL);
        }
    }
    /* No Python code runs in this loop (exact strs hash and compare in C, the list grows by
     * realloc): the list cannot change under it. */
    for (Py_ssize_t i = 0; truth && i < PyList_GET_SIZE(headers); i++) {
        PyObject *h = PyList_GET_ITEM(headers, i);
        int own = PySet_Contains(own_headers, PyTuple_GET_ITEM(h, 0));
        if (own < 0 || (!own && PyList_Append(out, h) < 0)) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (Py_IS_TYPE(span, span_class)) {
        /* The span core's plain sw8 value: the one item inject()'s dict would hold, without
         * the dict. */
        PyObject *sw8 = swmp_span_sw8(span);
        if (sw8 != NULL) {
            PyObject *b = PyUnicode_AsASCIIString(sw8);
            PyObject *pair = b == NULL ? NULL : swmp_pair(s_sw8, b);
            int ok = pair != NULL && PyList_Append(out, pair) == 0;
            Py_DECREF(sw8);
            Py_XDECREF(b);
            Py_XDECREF(pair);
            if (!ok) {
                Py_DECREF(out);
                return NULL;
            }
            return out;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
    }
    PyObject *injected = inject(span);
    if (injected == NULL || !PyDict_Check(injected)) {
        if (injected != NULL) {
            PyErr_SetString(PyExc_TypeError, "span.inject() did not return a dict");
        }
        Py_XDECREF(injected);
        Py_DECREF(out);
        return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int ok = 1;
    while (ok && PyDict_Next(injected, &pos, &k, &v)) {
        PyObject *b = PyUnicode_CheckExact(v) ? PyUnicode_AsASCIIString(v)
                                               : PyObject_CallMethodOneArg(v, s_encode, s_ascii);
        PyObject *pair = b == NULL ? NULL : swmp_pair(k, b);
        ok = pair != NULL && PyList_Append(out, pair) == 0;
        Py_XDECREF(b);
        Py_XDECREF(pair);
    }
    Py_DECREF(injected);
    if (!ok) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* amqp_headers(span, headers): a new AMQP headers table, the caller's entries without sw8
 * ones, then the span's. A table that is not a dict, or has a key that is not an exact str,
 * is the Python form's. */
static PyObject *amqp_merge(PyObject *span, PyObject *headers) {
    int truth = given(headers);
    if (truth < 0) {
        return NULL;
    }
    if (truth) {
        if (!PyDict_CheckExact(headers)) {
            return PyObject_CallFunctionObjArgs(py_amqp_headers, span, headers, NULL);
        }
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(headers, &pos, &k, &v)) {
            if (!PyUnicode_CheckExact(k)) {
                return PyObject_CallFunctionObjArgs(py_amqp_headers, span, headers, NULL);
            }
        }
    }
    PyObject *injected = inject(span);
    if (injected == NULL || !truth) {
        return injected; /* no headers of the caller's: the span's new dict is the table */
    }
    PyObject *out = PyDict_New();
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    int ok = out != NULL;
    /* No Python code runs here either (exact str keys): the table cannot change under it. */
    while (ok && PyDict_Next(headers, &pos, &k, &v)) {
        int own = PySet_Contains(own_headers, k);
        ok = own == 0 ? PyDict_SetItem(out, k, v) == 0 : own == 1;
    }
    ok = ok && PyDict_Update(out, injected) == 0;
    Py_DECREF(injected);
    if (!ok) {
        Py_XDECREF(out);
        return NULL;
    }
    return out;
}

/* The producer span of a message (op, peer = broker, the mq.* values), tagged, and its new
 * headers: ``attach(span, arg)``, or the Kafka merge of ``arg`` when ``attach`` is NULL.
 * (None, None) outside a trace, inside an exit span, past the span limit, or when a step
 * failed (logged once, the span finished). */
static PyObject *send_span(PyObject *op, PyObject *peer, PyObject *component, PyObject *topic, PyObject *queue,
                           PyObject *attach, PyObject *arg) {
    PyObject *exit_args[4] = {op, peer, component, layer};
    PyObject *span = swmp_new_exit(exit_args);
    if (span == NULL) {
        return give_up(component, NULL);
    }
    int recorded = Py_IS_TYPE(span, span_class) ? 1 : PyObject_IsInstance(span, (PyObject *)span_class);
    if (recorded <= 0) { /* a span that is not recorded: nothing to finish */
        Py_DECREF(span);
        return recorded < 0 ? give_up(component, NULL) : none_pair();
    }
    if (swmp_mq_tags(span, peer, topic, queue) < 0) {
        goto broken;
    }
    PyObject *attach_args[2] = {span, arg};
    PyObject *headers = attach != NULL ? PyObject_Vectorcall(attach, attach_args, 2, NULL) : kafka_merge(span, arg);
    if (headers == NULL) {
        goto broken;
    }
    PyObject *out = swmp_pair(span, headers);
    Py_DECREF(headers);
    if (out == NULL) {
        goto broken;
    }
    Py_DECREF(span);
    return out;
broken:;
    PyObject *r = give_up(component, span);
    Py_DECREF(span);
    return r;
}

static int ready(void) {
    return span_class != NULL;
}

int swmp_mq_ready(void) {
    return ready();
}

PyObject *swmp_kafka_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!ready() || kwnames != NULL || nargs < 3 || nargs > 4 || !PyUnicode_CheckExact(args[0]) ||
        !PyUnicode_CheckExact(args[1])) {
        return ready() ? PyObject_Vectorcall(py_kafka_send, args, nargsf, kwnames)
                       : (PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_mq() was not called"), NULL);
    }
    PyObject *topic = args[0], *brokers = args[1];
    PyObject *values[2] = {brokers, topic};
    int fit = swmp_mq_fit(values, 2);
    if (fit <= 0) {
        return fit < 0 ? NULL : PyObject_Vectorcall(py_kafka_send, args, nargsf, kwnames);
    }
    static SwmpJoinMemo memo;
    PyObject *parts[3] = {s_kafka, topic, s_producer};
    PyObject *op = swmp_join_memo(&memo, parts, 3);
    if (op == NULL) {
        return NULL;
    }
    PyObject *merge = nargs == 4 && args[3] != Py_None ? args[3] : NULL;
    PyObject *out = send_span(op, brokers, kafka_component, topic, NULL, merge, args[2]);
    Py_DECREF(op);
    return out;
}

PyObject *swmp_amqp_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!ready() || kwnames != NULL || nargs != 5 || !PyUnicode_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1]) ||
        !PyUnicode_CheckExact(args[2])) {
        return ready() ? PyObject_Vectorcall(py_amqp_send, args, nargsf, kwnames)
                       : (PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_mq() was not called"), NULL);
    }
    PyObject *exchange = args[0], *routing_key = args[1], *peer = args[2];
    PyObject *values[3] = {peer, exchange, routing_key};
    int fit = swmp_mq_fit(values, 3);
    if (fit <= 0) {
        return fit < 0 ? NULL : PyObject_Vectorcall(py_amqp_send, args, nargsf, kwnames);
    }
    static SwmpJoinMemo memo;
    PyObject *parts[5] = {s_rabbitmq, exchange, s_queue, routing_key, s_producer};
    PyObject *op = swmp_join_memo(&memo, parts, 5);
    if (op == NULL) {
        return NULL;
    }
    PyObject *out = send_span(op, peer, amqp_component, exchange, routing_key, args[3], args[4]);
    Py_DECREF(op);
    return out;
}

PyObject *swmp_amqp_merge(PyObject *span, PyObject *headers) {
    return amqp_merge(span, headers);
}

/* The merges on their own (confluent-kafka's and pika's / aiormq's own attach functions call
 * them), with the Python form's signature. */
static PyObject *merge_call(PyObject *const *args, Py_ssize_t nargs, PyObject *(*merge)(PyObject *, PyObject *),
                            const char *name) {
    if (!ready()) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_mq() was not called");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(span, headers) takes 2 arguments (%zd given)", name, nargs);
        return NULL;
    }
    return merge(args[0], args[1]);
}

PyObject *swmp_kafka_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    return merge_call(args, nargs, kafka_merge, "kafka_headers");
}

PyObject *swmp_amqp_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    return merge_call(args, nargs, amqp_merge, "amqp_headers");
}
