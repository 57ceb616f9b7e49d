/* amqp_consuming(exchange, routing_key, headers, peer): the entry span of one delivered
 * RabbitMQ message, current inside ``with`` (swmp/instrument/_mq.py ``amqp_consuming`` and
 * its ``Consuming``, the Python form: the reference and the fallback). And
 * kafka_consumed(topic, group, headers, brokers): the entry span of one Kafka record that
 * the library returns to its caller, recorded and finished (``_mq.kafka_consumed``).
 *
 * Why: around every pika / aiormq consumer callback the Python form ran seven frames of the
 * agent's (the helper, the context manager's three methods, the headers table's carrier,
 * the sw8 decoding, the tags), ~7,000 of the ~31,000 instructions a consumed message added,
 * with the CPU caches cold after the wait for the broker. The same reasoning as mq.c.
 *
 * The common case, every step as the Python form takes it: exact strs within the tag limit
 * (else the Python form, decided before anything changes); the span current around the call
 * set aside (a consumer loop inside a request is not the message's parent) and given back
 * on exit; from a plain dict table holding only ``sw8`` of the three headers, a plain header
 * of a known caller read by the span core's ``swmp_sw8_read`` (``decode_carrier``'s steps)
 * and the span made from its parts (``swmp_entry_sw8``: no ContextCarrier unless entry_root's
 * way must decide), else ``decode_sw8``'s carrier (the Python ``table_carrier``'s for a table
 * with correlation or extension headers, or another kind of table) and the span from
 * ``entry_root``, else the Python ``decide_entry_span``; the span tagged and entered. An
 * ``Exception`` while setting up is the Python form's ``except``: logged once by ``failed``;
 * a span already made but not entered is finished, and the callback runs untraced. The
 * callback's exception marks the span and passes on unchanged. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "consume.h"
#include "join.h"
#include "mq.h"
#include "spancore.h"

/* Set by setup_consume(): see its docstring in spancore.c's method table. The tags and the
 * tag limit are mq.c's (setup_mq() comes first). */
static PyTypeObject *span_class = NULL;
static PyObject *py_consuming = NULL, *table_carrier = NULL, *decode_sw8 = NULL,
                *decide_entry = NULL, *failed = NULL, *current = NULL, *layer = NULL, *component = NULL,
                *h_sw8 = NULL, *h_correlation = NULL, *h_x = NULL;
static PyObject *s_rabbitmq, *s_queue, *s_consumer, *s_exit, *s_finish;

PyObject *swmp_setup_consume(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyType_Check(args[0]) || !PyContextVar_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_consume(span_class: type, amqp_consuming, table_carrier, decode_sw8, "
                        "decide_entry_span, current: ContextVar, failed, layer, component, sw8, sw8_correlation, "
                        "sw8_x)");
        return NULL;
    }
    if (s_finish == NULL && ((s_rabbitmq = PyUnicode_InternFromString("RabbitMQ/Topic/")) == NULL ||
                             (s_queue = PyUnicode_InternFromString("/Queue/")) == NULL ||
                             (s_consumer = PyUnicode_InternFromString("/Consumer")) == NULL ||
                             (s_exit = PyUnicode_InternFromString("__exit__")) == NULL ||
                             (s_finish = PyUnicode_InternFromString("finish")) == NULL)) {
        return NULL;
    }
    PyObject **slots[] = {(PyObject **)&span_class, &py_consuming, &table_carrier, &decode_sw8,
                          &decide_entry, &current, &failed, &layer, &component, &h_sw8, &h_correlation, &h_x};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    return Py_NewRef(Py_None);
}

typedef struct {
    PyObject_HEAD
    PyObject *span;  /* the entered span, or NULL (nothing recorded) */
    PyObject *token; /* the context variable's token when a span was set aside, else NULL */
    int done;        /* __exit__ has run */
} Consuming;

static int consuming_traverse(Consuming *c, visitproc visit, void *arg) {
    Py_VISIT(c->span);
    Py_VISIT(c->token);
    return 0;
}

static int consuming_clear(Consuming *c) {
    Py_CLEAR(c->span);
    Py_CLEAR(c->token);
    return 0;
}

static void consuming_dealloc(Consuming *c) {
    PyObject_GC_UnTrack(c);
    consuming_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* The producer's context from an ``sw8`` value: the parts of a plain header from a known
 * caller into ``*parts`` (1: the span is made from them, a carrier only if entry_root's way
 * must decide), else decode_sw8's carrier into ``*carrier`` (0), or -1 with an error: the
 * steps of decode_carrier, then of decode_sw8. ``text`` is the value as an exact str, or
 * NULL when it is not one; decode_sw8 is given ``value``. */
static int context_of_value(PyObject *text, PyObject *value, SwmpSw8 *parts, PyObject **carrier) {
    int r = text == NULL ? 0 : swmp_sw8_read(text, parts);
    if (r != 0) {
        return r;
    }
    *carrier = PyObject_CallOneArg(decode_sw8, value);
    return *carrier == NULL ? -1 : 0;
}

/* The producer's context from the headers table, table_carrier's steps, as context_of_value
 * answers (``*carrier`` None for a table without ``sw8``). */
static int context_of(PyObject *headers, SwmpSw8 *parts, PyObject **carrier) {
    if (headers == Py_None) {
        *carrier = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyDict_CheckExact(headers)) {
        *carrier = PyObject_CallOneArg(table_carrier, headers);
        return *carrier == NULL ? -1 : 0;
    }
    /* Held at once: the look-ups below may compare other keys with ``__eq__`` (Python code
     * that could change the table). */
    PyObject *sw8 = Py_XNewRef(PyDict_GetItemWithError(headers, h_sw8));
    if (sw8 == NULL) {
        *carrier = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        return *carrier == NULL ? -1 : 0;
    }
    /* A table holding sw8 alone (what a traced publisher sends) has neither of the other
     * two: their look-ups (a miss each, the table's keys read again) are skipped. */
    PyObject *only = NULL, *only_value;
    Py_ssize_t pos = 0;
    int alone = PyDict_GET_SIZE(headers) == 1 && PyDict_Next(headers, &pos, &only, &only_value) &&
                (only == h_sw8 || (PyUnicode_CheckExact(only) && PyUnicode_Compare(only, h_sw8) == 0));
    PyObject *correlation = alone ? NULL : PyDict_GetItemWithError(headers, h_correlation);
    PyObject *x = alone || (correlation != NULL || PyErr_Occurred()) ? NULL : PyDict_GetItemWithError(headers, h_x);
    if (PyErr_Occurred() || correlation != NULL || x != NULL) {
        Py_DECREF(sw8);
        *carrier = PyErr_Occurred() ? NULL : PyObject_CallOneArg(table_carrier, headers);
        return *carrier == NULL ? -1 : 0;
    }
    int r = context_of_value(PyUnicode_CheckExact(sw8) ? sw8 : NULL, sw8, parts, carrier);
    Py_DECREF(sw8);
    return r;
}

/* A consumed message's entry span (entry_root, else the Python decide_entry_span) of
 * ``comp``: a new reference to a recorded span, Py_None (nothing recorded), or NULL. */
static PyObject *message_span(PyObject *op, PyObject *comp, PyObject *carrier) {
    PyObject *args[4] = {op, comp, layer, carrier};
    PyObject *span = swmp_entry_root(args);
    if (span == Py_None) {
        Py_DECREF(span);
        PyObject *dargs[4] = {op, carrier, comp, layer};
        span = PyObject_Vectorcall(decide_entry, dargs, 4, NULL);
    }
    if (span == NULL || Py_IS_TYPE(span, span_class)) {
        return span;
    }
    int recorded = PyObject_IsInstance(span, (PyObject *)span_class);
    if (recorded <= 0) { /* not recorded: nothing to enter or finish */
        Py_DECREF(span);
        return recorded < 0 ? NULL : Py_NewRef(Py_None);
    }
    return span;
}

/* message_span for the parts of a plain header (released here): the span made straight from
 * them, else, where swmp_entry_sw8 declines, message_span with the carrier made of them. */
static PyObject *message_span_sw8(PyObject *op, PyObject *comp, SwmpSw8 *parts) {
    PyObject *args[3] = {op, comp, layer};
    PyObject *span = swmp_entry_sw8(args, parts);
    if (span == Py_None) {
        Py_DECREF(span);
        PyObject *carrier = swmp_sw8_carrier(parts);
        span = carrier == NULL ? NULL : message_span(op, comp, carrier);
        Py_XDECREF(carrier);
    }
    swmp_sw8_clear(parts);
    return span;
}

/* ``span.finish()`` with the error set now kept (a span made and then given up on counts as
 * open in its segment until finished). Steals ``span``; returns -1. */
static int finish_given_up(PyObject *span) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *done = PyObject_CallMethodNoArgs(span, s_finish);
    Py_XDECREF(done);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    Py_DECREF(span);
    return -1;
}

/* The message's span (entered, tagged) into ``c->span``: 0, or -1 with an error set. */
static int open_span(Consuming *c, PyObject *op, PyObject *exchange, PyObject *routing_key, PyObject *headers,
                     PyObject *peer) {
    SwmpSw8 parts;
    PyObject *carrier = NULL;
    int plain = context_of(headers, &parts, &carrier);
    if (plain < 0) {
        return -1;
    }
    PyObject *span = plain ? message_span_sw8(op, component, &parts) : message_span(op, component, carrier);
    Py_XDECREF(carrier);
    if (span == NULL || span == Py_None) {
        Py_XDECREF(span);
        return span == NULL ? -1 : 0;
    }
    if (swmp_mq_tags(span, peer, exchange, routing_key) < 0 || swmp_span_enter(span) < 0) {
        return finish_given_up(span);
    }
    c->span = span;
    return 0;
}

/* Gives the context back as it was: the token reset, or the current span cleared again. */
static int give_back(Consuming *c) {
    if (c->token != NULL) {
        PyObject *token = c->token;
        c->token = NULL;
        int r = PyContextVar_Reset(current, token);
        Py_DECREF(token);
        return r;
    }
    PyObject *cur = NULL;
    if (PyContextVar_Get(current, NULL, &cur) < 0) {
        return -1;
    }
    int some = cur != NULL && cur != Py_None;
    Py_XDECREF(cur);
    if (!some) {
        return 0;
    }
    PyObject *t = PyContextVar_Set(current, Py_None);
    Py_XDECREF(t);
    return t == NULL ? -1 : 0;
}


PyObject *swmp_amqp_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (span_class == NULL || !swmp_mq_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_mq() and setup_consume() were not called");
        return NULL;
    }
    if (nargs != 4 || !PyUnicode_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1]) ||
        !PyUnicode_CheckExact(args[3])) {
        return PyObject_Vectorcall(py_consuming, args, nargs, NULL);
    }
    PyObject *exchange = args[0], *routing_key = args[1], *headers = args[2], *peer = args[3];
    PyObject *values[3] = {peer, exchange, routing_key};
    int fit = swmp_mq_fit(values, 3);
    if (fit <= 0) { /* a value to clip (or the limit unreadable): the Python form's */
        return fit < 0 ? NULL : PyObject_Vectorcall(py_consuming, args, nargs, NULL);
    }
    static SwmpJoinMemo memo;
    PyObject *parts[5] = {s_rabbitmq, exchange, s_queue, routing_key, s_consumer};
    PyObject *op = swmp_join_memo(&memo, parts, 5);
    if (op == NULL) {
        return NULL;
    }
    Consuming *c = PyObject_GC_New(Consuming, &swmp_ConsumingType);
    if (c == NULL) {
        Py_DECREF(op);
        return NULL;
    }
    c->span = NULL;
    c->token = NULL;
    c->done = 0;
    PyObject_GC_Track(c);
    PyObject *cur = NULL;
    if (PyContextVar_Get(current, NULL, &cur) < 0) {
        Py_DECREF(op);
        Py_DECREF(c);
        return NULL;
    }
    int inside = cur != NULL && cur != Py_None;
    Py_XDECREF(cur);
    if (inside) { /* a consumer loop inside a trace: not the parent */
        c->token = PyContextVar_Set(current, Py_None);
    }
    if ((inside && c->token == NULL) || open_span(c, op, exchange, routing_key, headers, peer) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            /* Raised as the Python form raises it, the context as it was: the interrupt kept
             * aside while the context is given back, and kept over any error of that. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            Py_DECREF(op);
            if (give_back(c) < 0) {
                PyErr_Clear();
            }
            Py_DECREF(c);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        swmp_report_handled(failed, NULL, 0);
    }
    Py_DECREF(op);
    return (PyObject *)c;
}

static PyObject *consuming_enter(Consuming *c, PyObject *unused) {
    return Py_NewRef(c);
}

static PyObject *consuming_exit(Consuming *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (c->done) {
        Py_RETURN_FALSE;
    }
    c->done = 1;
    int ok = 1;
    PyObject *span = c->span;
    c->span = NULL;
    if (span != NULL) {
        if (Py_IS_TYPE(span, span_class)) {
            ok = swmp_span_exit(span, args[1] == Py_None ? NULL : args[1]) == 0;
        } else {
            PyObject *call[4] = {span, args[0], args[1], args[2]};
            PyObject *r = PyObject_VectorcallMethod(s_exit, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            ok = r != NULL;
            Py_XDECREF(r);
        }
        Py_DECREF(span);
    }
    /* ``finally``: the context given back whatever the span's exit did. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (give_back(c) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return NULL;
    }
    PyErr_Restore(type, value, tb);
    if (!ok) {
        return NULL;
    }
    Py_RETURN_FALSE;
}

PyObject *swmp_cm_enter(PyObject *cm, PyObject *name) {
    return Py_IS_TYPE(cm, &swmp_ConsumingType) ? consuming_enter((Consuming *)cm, NULL)
                                               : PyObject_CallMethodNoArgs(cm, name);
}

PyObject *swmp_cm_exit(PyObject *const *args, PyObject *name) {
    return Py_IS_TYPE(args[0], &swmp_ConsumingType)
               ? consuming_exit((Consuming *)args[0], args + 1, 3)
               : PyObject_VectorcallMethod(name, (PyObject **)args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyMethodDef consuming_methods[] = {
    {"__enter__", (PyCFunction)consuming_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))consuming_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject swmp_ConsumingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.Consuming",
    .tp_basicsize = sizeof(Consuming),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The entry span of one delivered message, current inside ``with`` (see amqp_consuming).",
    .tp_dealloc = (destructor)consuming_dealloc,
    .tp_traverse = (traverseproc)consuming_traverse,
    .tp_clear = (inquiry)consuming_clear,
    .tp_methods = consuming_methods,
};

/* -- kafka_consumed --------------------------------------------------------------------- */

/* Set by setup_kafka_consumed(): the Python form, the failure logger, the component. */
static PyObject *py_kafka_consumed = NULL, *delivery_failed = NULL, *kafka_component = NULL;
static PyObject *s_kafka, *s_consumer_of;

PyObject *swmp_setup_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_kafka_consumed(kafka_consumed, failed, component)");
        return NULL;
    }
    if (s_consumer_of == NULL && ((s_kafka = PyUnicode_InternFromString("Kafka/")) == NULL ||
                                  (s_consumer_of = PyUnicode_InternFromString("/Consumer/")) == NULL)) {
        return NULL;
    }
    Py_XSETREF(py_kafka_consumed, Py_NewRef(args[0]));
    Py_XSETREF(delivery_failed, Py_NewRef(args[1]));
    Py_XSETREF(kafka_component, Py_NewRef(args[2]));
    return Py_NewRef(Py_None);
}

/* The value of the record's last ``sw8`` header (borrowed), or NULL without one; -1 (the
 * Python form's) when the headers are of another shape or carry the correlation or
 * extension header. */
static int record_sw8(PyObject *headers, PyObject **sw8) {
    *sw8 = NULL;
    if (headers == Py_None) {
        return 0;
    }
    if (!PyList_CheckExact(headers) && !PyTuple_CheckExact(headers)) {
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i];
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) < 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(h, 0))) {
            return -1;
        }
        PyObject *name = PyTuple_GET_ITEM(h, 0);
        if (PyUnicode_Compare(name, h_sw8) == 0) {
            *sw8 = PyTuple_GET_ITEM(h, 1);
        } else if (PyUnicode_Compare(name, h_correlation) == 0 || PyUnicode_Compare(name, h_x) == 0) {
            return -1;
        }
    }
    return 0;
}

/* The producer's context from an sw8 header value (bytes from a Kafka record), as
 * context_of_value answers: the span core's decoder for ASCII text, decode_sw8 for whatever
 * it declines (a record without the header: ``*carrier`` None). */
static int record_context(PyObject *value, SwmpSw8 *parts, PyObject **carrier) {
    if (value == NULL) {
        *carrier = Py_NewRef(Py_None);
        return 0;
    }
    PyObject *text = PyBytes_CheckExact(value) ? PyUnicode_DecodeASCII(PyBytes_AS_STRING(value),
                                                                       PyBytes_GET_SIZE(value), "strict")
                     : PyUnicode_CheckExact(value) ? Py_NewRef(value)
                                                   : NULL;
    PyErr_Clear(); /* not ASCII: decode_sw8 says what it is (None) */
    int r = context_of_value(text, value, parts, carrier);
    Py_XDECREF(text);
    return r;
}

/* The record's span (from the header's parts when ``plain``, else from ``carrier``): made,
 * tagged and finished (0), or -1 with an error (a span made is finished all the same).
 * Releases the parts. */
static int record_delivery(PyObject *op, int plain, SwmpSw8 *parts, PyObject *carrier, PyObject *brokers,
                           PyObject *topic) {
    PyObject *span =
        plain ? message_span_sw8(op, kafka_component, parts) : message_span(op, kafka_component, carrier);
    if (span == NULL || span == Py_None) {
        Py_XDECREF(span);
        return span == NULL ? -1 : 0;
    }
    if (swmp_mq_tags(span, brokers, topic, NULL) < 0) {
        return finish_given_up(span);
    }
    PyObject *done = PyObject_CallMethodNoArgs(span, s_finish);
    Py_DECREF(span);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

PyObject *swmp_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (span_class == NULL || py_kafka_consumed == NULL || !swmp_mq_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_mq(), setup_consume() and setup_kafka_consumed() were not called");
        return NULL;
    }
    PyObject *sw8 = NULL;
    if (nargs != 4 || !PyUnicode_CheckExact(args[0]) || !PyUnicode_CheckExact(args[1]) ||
        !PyUnicode_CheckExact(args[3]) || record_sw8(args[2], &sw8) < 0) {
        return PyObject_Vectorcall(py_kafka_consumed, args, nargs, NULL);
    }
    PyObject *topic = args[0], *group = args[1], *brokers = args[3];
    PyObject *values[2] = {brokers, topic};
    int fit = swmp_mq_fit(values, 2);
    if (fit <= 0) { /* a value to clip (or the limit unreadable): the Python form's */
        return fit < 0 ? NULL : PyObject_Vectorcall(py_kafka_consumed, args, nargs, NULL);
    }
    Py_XINCREF(sw8); /* the headers are the library's: keep the value while it is decoded */
    SwmpSw8 sw8_parts;
    PyObject *carrier = NULL;
    int plain = record_context(sw8, &sw8_parts, &carrier);
    Py_XDECREF(sw8);
    if (plain < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL;
        }
        swmp_report_handled(delivery_failed, NULL, 0);
        return Py_NewRef(Py_None);
    }
    static SwmpJoinMemo memo;
    PyObject *parts[4] = {s_kafka, topic, s_consumer_of, group};
    PyObject *op = swmp_join_memo(&memo, parts, 4);
    PyObject *cur = NULL;
    if (op == NULL || PyContextVar_Get(current, NULL, &cur) < 0) {
        Py_XDECREF(op);
        Py_XDECREF(carrier);
        if (plain) {
            swmp_sw8_clear(&sw8_parts);
        }
        return NULL;
    }
    int inside = cur != NULL && cur != Py_None;
    Py_XDECREF(cur);
    PyObject *token = inside ? PyContextVar_Set(current, Py_None) : NULL; /* not the record's parent */
    int r;
    if (inside && token == NULL) {
        r = -1;
        if (plain) {
            swmp_sw8_clear(&sw8_parts);
        }
    } else {
        r = record_delivery(op, plain, &sw8_parts, carrier, brokers, topic);
    }
    Py_DECREF(op);
    Py_XDECREF(carrier);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
        swmp_report_handled(delivery_failed, NULL, 0);
        r = 0;
    }
    if (token != NULL) { /* ``finally``: the context as it was */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        int reset = PyContextVar_Reset(current, token);
        Py_DECREF(token);
        if (reset < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        PyErr_Restore(type, value, tb);
    }
    return r < 0 ? NULL : Py_NewRef(Py_None);
}
