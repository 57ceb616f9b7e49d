/* KafkaSend(orig, fallback, mark): aiokafka's ``AIOKafkaProducer.send`` while a span is
 * current, without the instrumentation's Python coroutine (swmp/instrument/aiokafka.py's
 * ``send``, the reference and the fallback):
 *
 *     async def send(self, topic, value=None, key=None, partition=None, timestamp_ms=None,
 *                    headers=None):
 *         if getattr(self, mark, False):
 *             return await orig(self, topic, value, key, partition, timestamp_ms, headers)
 *         if headers is not None and headers.__class__ is not list:
 *             return await orig(self, topic, value, key, partition, timestamp_ms, headers)
 *         span, traced = kafka_send_span(topic, _brokers(self.client), headers)
 *         if span is None:
 *             return await orig(self, topic, value, key, partition, timestamp_ms, headers)
 *         with span:
 *             return await orig(self, topic, value, key, partition, timestamp_ms, traced)
 *
 * Why: that coroutine's frame was made for every traced send and resumed at each of the
 * send's waits (the metadata, the accumulator's room), with a Python call for the brokers
 * string on top (docs/performance.md, "aiokafka's send without a coroutine of the agent's").
 *
 * The call returns within.c's lazy awaitable (a ``collections.abc.Coroutine``, which
 * ``create_task`` takes): at its first send, in the awaiting task, the steps above run in
 * their order; with a span ``orig`` is called as above, the seven arguments by position
 * and the traced headers among them, and without one (the agent's own producer, no span
 * made) with the caller's arguments as they came. A call whose arguments the signature above would not
 * bind as they are (too many or too few, an unknown or repeated keyword) is the fallback's,
 * which binds or refuses it when it is made, as the Python form does; so is one whose steps
 * raise an ``Exception`` before the span exists (the Python form meets it again). If the
 * arguments cannot be rebuilt once the span exists (no memory), the record goes out with
 * the caller's arguments inside its span. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "kafka_send.h"
#include "mq.h"
#include "spancore.h"
#include "within.h"

/* getattr(obj, name) without raising (and so without making) the AttributeError of a missing
 * attribute, as ``getattr(obj, name, default)`` does: 1 found (*out a new reference), 0
 * missing, -1 with an error. The producer's mark is missing on every application producer. */
#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

/* The parameters after ``self``, in the signature's order: ``names[i]`` is position i + 1. */
enum { TOPIC, VALUE, KEY, PARTITION, TIMESTAMP_MS, HEADERS, NPARAMS };
static PyObject *names[NPARAMS];
static PyObject *s_client = NULL, *s_bootstrap_servers = NULL, *s_semicolon = NULL, *empty = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *orig, *fallback, *mark;
    vectorcallfunc vectorcall;
} KafkaSend;

/* The position of keyword ``k`` (1 to NPARAMS), or 0 for a name the signature lacks. */
static Py_ssize_t param_of(PyObject *k) {
    for (Py_ssize_t i = 0; i < NPARAMS; i++) {
        if (swmp_is_name(k, names[i])) {
            return i + 1;
        }
    }
    return 0;
}

/* Whether the call binds to the signature as it is: ``self`` and ``topic`` given, at most
 * the seven positions, each keyword a parameter given once and not also by position. The
 * interpreter has already refused a keyword repeated among the keywords themselves. */
static int binds(Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int topic = nargs > 1 + TOPIC;
    if (nargs < 1 || nargs > 1 + NPARAMS) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        Py_ssize_t at = param_of(PyTuple_GET_ITEM(kwnames, i));
        if (at < nargs) { /* not a parameter (0), or given by position already */
            return 0;
        }
        topic |= at == 1 + TOPIC;
    }
    return topic;
}

/* The index in the call's values of parameter ``param`` (a position or a keyword), or -1
 * when the caller left it to its default. */
static Py_ssize_t index_of(Py_ssize_t param, Py_ssize_t nargs, PyObject *kwnames) {
    if (param < nargs) {
        return param;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (swmp_is_name(PyTuple_GET_ITEM(kwnames, i), names[param - 1])) {
            return nargs + i;
        }
    }
    return -1;
}

/* ``_brokers(client)`` of swmp/instrument/aiokafka.py (a new reference, or NULL with an
 * error):
 *
 *     servers = getattr(client, "_bootstrap_servers", "") or ""
 *     try:
 *         return servers if isinstance(servers, str) else ";".join(servers)
 *     except TypeError:
 *         return str(servers)
 */
static PyObject *brokers_of(PyObject *client) {
    PyObject *servers;
    int found = lookup_attr(client, s_bootstrap_servers, &servers);
    if (found <= 0) {
        return found < 0 ? NULL : Py_NewRef(empty);
    }
    PyObject *out = NULL;
    if (PyUnicode_CheckExact(servers)) { /* aiokafka's default, and what most configure */
        out = Py_NewRef(servers);        /* "" or "": the same text */
    } else {
        int truth = PyObject_IsTrue(servers);
        if (truth <= 0) {
            out = truth < 0 ? NULL : Py_NewRef(empty);
        } else if (PyUnicode_Check(servers)) {
            out = Py_NewRef(servers);
        } else {
            out = PyUnicode_Join(s_semicolon, servers); /* what str.join is */
            if (out == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                out = PyObject_Str(servers);
            }
        }
    }
    Py_DECREF(servers);
    return out;
}

/* ``*argv`` / ``*kwnames`` made the seven arguments by position, the headers ``traced``, as
 * the Python form calls ``orig(self, topic, value, key, partition, timestamp_ms, traced)``:
 * one tuple and no keywords for the function to match. 0, or -1 with an error (nothing
 * replaced). */
static int as_positional(PyObject **argv, PyObject **kwnames, Py_ssize_t nargs, PyObject *traced) {
    PyObject *values = PyTuple_New(1 + NPARAMS);
    if (values == NULL) {
        return -1;
    }
    PyTuple_SET_ITEM(values, 0, Py_NewRef(PyTuple_GET_ITEM(*argv, 0)));
    for (Py_ssize_t param = 1; param <= NPARAMS; param++) {
        Py_ssize_t at = param == 1 + HEADERS ? -1 : index_of(param, nargs, *kwnames);
        PyTuple_SET_ITEM(values, param, Py_NewRef(param == 1 + HEADERS ? traced
                                                  : at >= 0              ? PyTuple_GET_ITEM(*argv, at)
                                                                         : Py_None));
    }
    Py_SETREF(*argv, values);
    Py_CLEAR(*kwnames);
    return 0;
}

/* The steps before the span, in the Python form's order: None (the producer is the agent's
 * own, or no span is made: the send as it came), the pair of ``kafka_send_span``, or NULL
 * with the error. */
static PyObject *send_pair(KafkaSend *k, PyObject *producer, PyObject *topic, PyObject *headers) {
    PyObject *mark;
    int found = lookup_attr(producer, k->mark, &mark);
    if (found < 0) {
        return NULL;
    }
    int internal = found ? PyObject_IsTrue(mark) : 0;
    Py_XDECREF(mark);
    if (internal != 0) {
        return internal < 0 ? NULL : Py_NewRef(Py_None);
    }
    if (headers != Py_None && !PyList_CheckExact(headers)) {
        /* aiokafka's record builder takes an exact list: anything else is its TypeError, which
         * a merged plain list would turn into a sent record. The send as it came, no span. */
        return Py_NewRef(Py_None);
    }
    PyObject *client = PyObject_GetAttr(producer, s_client);
    PyObject *brokers = client == NULL ? NULL : brokers_of(client);
    Py_XDECREF(client);
    if (brokers == NULL) {
        return NULL;
    }
    PyObject *call[3] = {topic, brokers, headers};
    PyObject *pair = swmp_kafka_send_span(NULL, call, 3, NULL);
    Py_DECREF(brokers);
    if (pair != NULL && (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_TypeError, "kafka_send_span did not return a pair");
        return NULL;
    }
    return pair;
}

/* within.c's opener: the span (the call's headers replaced by the traced ones), None (no
 * span: the send as it came), or NULL for the fallback (an error left set only when it is
 * not an Exception). */
static PyObject *send_open(PyObject *owner, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                           swmp_within_after *after) {
    KafkaSend *k = (KafkaSend *)owner;
    PyObject *const *items = &PyTuple_GET_ITEM(*argv, 0);
    Py_ssize_t at = index_of(1 + HEADERS, nargs, *kwnames);
    PyObject *topic = items[index_of(1 + TOPIC, nargs, *kwnames)]; /* there: binds() saw to it */
    PyObject *pair = send_pair(k, items[0], topic, at >= 0 ? items[at] : Py_None);
    if (pair == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
        }
        return NULL;
    }
    if (pair == Py_None) {
        return pair;
    }
    PyObject *span = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
    if (span != Py_None && as_positional(argv, kwnames, nargs, PyTuple_GET_ITEM(pair, 1)) < 0) {
        PyErr_Clear(); /* the span exists: the record goes out in it, untraced headers */
    }
    Py_DECREF(pair);
    return span;
}

static PyObject *send_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    KafkaSend *k = (KafkaSend *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!binds(nargs, kwnames)) {
        return PyObject_Vectorcall(k->fallback, args, nargsf, kwnames);
    }
    return swmp_within_lazy(send_open, callable, k->orig, k->fallback, args, nargsf, kwnames);
}

static int init_names(void) {
    static const char *params[NPARAMS] = {"topic", "value", "key", "partition", "timestamp_ms", "headers"};
    if (empty != NULL) {
        return 0;
    }
    for (int i = 0; i < NPARAMS; i++) {
        if ((names[i] = PyUnicode_InternFromString(params[i])) == NULL) {
            return -1;
        }
    }
    if ((s_client = PyUnicode_InternFromString("client")) == NULL ||
        (s_bootstrap_servers = PyUnicode_InternFromString("_bootstrap_servers")) == NULL ||
        (s_semicolon = PyUnicode_InternFromString(";")) == NULL || (empty = PyUnicode_InternFromString("")) == NULL) {
        return -1;
    }
    return 0;
}

static PyObject *send_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *orig, *fallback, *mark;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) || !PyArg_ParseTuple(args, "OOU:KafkaSend", &orig, &fallback, &mark) ||
        !PyCallable_Check(orig) || !PyCallable_Check(fallback)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "KafkaSend(orig, fallback, mark): two callables and a str");
        }
        return NULL;
    }
    if (init_names() < 0) {
        return NULL;
    }
    KafkaSend *k = (KafkaSend *)type->tp_alloc(type, 0);
    if (k == NULL) {
        return NULL;
    }
    k->orig = Py_NewRef(orig);
    k->fallback = Py_NewRef(fallback);
    k->mark = Py_NewRef(mark);
    k->vectorcall = send_vectorcall;
    return (PyObject *)k;
}

static int send_traverse(KafkaSend *k, visitproc visit, void *arg) {
    Py_VISIT(k->orig);
    Py_VISIT(k->fallback);
    Py_VISIT(k->mark);
    return 0;
}

static int send_clear(KafkaSend *k) {
    Py_CLEAR(k->orig);
    Py_CLEAR(k->fallback);
    Py_CLEAR(k->mark);
    return 0;
}

static void send_dealloc(KafkaSend *k) {
    PyObject_GC_UnTrack(k);
    send_clear(k);
    Py_TYPE(k)->tp_free((PyObject *)k);
}

PyTypeObject swmp_KafkaSendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.KafkaSend",
    .tp_basicsize = sizeof(KafkaSend),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "KafkaSend(orig, fallback, mark): aiokafka's send(producer, topic, value=None, key=None, "
              "partition=None, timestamp_ms=None, headers=None) in its exit span, opened when awaited; other "
              "calls go to fallback.",
    .tp_new = send_new,
    .tp_dealloc = (destructor)send_dealloc,
    .tp_traverse = (traverseproc)send_traverse,
    .tp_clear = (inquiry)send_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(KafkaSend, vectorcall),
};
