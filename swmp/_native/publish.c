/* AmqpPublish(orig, fallback, attach, peer): aiormq's ``Channel.basic_publish`` (and so
 * every aio-pika publish) while a span is current, without the instrumentation's Python
 * coroutine (swmp/instrument/aiormq.py's ``basic_publish``, the reference and the fallback):
 *
 *     async def basic_publish(self, body, *args, **kwargs):
 *         if args:
 *             return await orig(self, body, *args, **kwargs)
 *         span, traced = amqp_send_span(kwargs.get("exchange", ""), kwargs.get("routing_key", ""),
 *                                       peer(self), attach, kwargs.get("properties"))
 *         if span is None:
 *             return await orig(self, body, *args, **kwargs)
 *         with span:
 *             try:
 *                 return await orig(self, body, *args, **{**kwargs, "properties": traced})
 *             finally:
 *                 copy_back(kwargs.get("properties"), traced)
 *
 * Why: that coroutine's frame was made for every publish and resumed at each of the
 * publish's waits (the write, the broker's confirmation), in a process that waits for its
 * broker, where the CPU caches are cold.
 *
 * The body by position or by keyword (aio-pika's ``Exchange.publish`` passes it by keyword,
 * which the Python form turns into a positional argument; here the call keeps the caller's
 * form, which aiormq binds alike). The call returns within.c's lazy awaitable (a ``collections.abc.Coroutine``, which
 * ``create_task`` takes): at its first send, in the awaiting task, the steps above run in
 * their order (mq.c's ``amqp_send_span``, this channel's peer), and the publish's keywords
 * get the properties with the trace's headers. A call with positional options is the
 * fallback's; so is one whose steps raise an ``Exception`` before the span exists (the
 * Python form meets it again). If the keywords cannot be rebuilt once the span exists (no
 * memory), the message goes out with the caller's properties inside its span. When the
 * call is over, what aiormq wrote on the copy is given to the caller's properties
 * (``copy_back`` below, within.c's step for the end of the call). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "mq.h"
#include "publish.h"
#include "spancore.h"
#include "within.h"

static PyObject *s_exchange = NULL, *s_routing_key = NULL, *s_properties = NULL, *s_body = NULL, *empty = NULL,
                *s_message_id = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *orig, *fallback, *attach, *peer;
    vectorcallfunc vectorcall;
} AmqpPublish;

/* ``*argv`` / ``*kwnames`` with ``properties=traced``: in its place when the caller gave
 * properties (``at``), else added last, as ``{**kwargs, "properties": traced}`` orders them.
 * 0, or -1 with an error (nothing replaced). */
static int with_properties(PyObject **argv, PyObject **kwnames, Py_ssize_t at, PyObject *traced) {
    Py_ssize_t n = PyTuple_GET_SIZE(*argv), nkw = *kwnames == NULL ? 0 : PyTuple_GET_SIZE(*kwnames);
    PyObject *names = NULL, *values = PyTuple_New(at >= 0 ? n : n + 1);
    if (values == NULL) {
        return -1;
    }
    Py_ssize_t replaced = at >= 0 ? n - nkw + at : -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(values, i, Py_NewRef(i == replaced ? traced : PyTuple_GET_ITEM(*argv, i)));
    }
    if (at < 0) {
        PyTuple_SET_ITEM(values, n, Py_NewRef(traced));
        names = PyTuple_New(nkw + 1);
        if (names == NULL) {
            Py_DECREF(values);
            return -1;
        }
        for (Py_ssize_t i = 0; i < nkw; i++) {
            PyTuple_SET_ITEM(names, i, Py_NewRef(PyTuple_GET_ITEM(*kwnames, i)));
        }
        PyTuple_SET_ITEM(names, nkw, Py_NewRef(s_properties));
        Py_XSETREF(*kwnames, names);
    }
    Py_SETREF(*argv, values);
    return 0;
}

/* ``copy_back(properties, sent)`` of swmp/instrument/_props_copy.py for ``state`` =
 * ``(properties, sent)``: aiormq gives a message without a ``message_id`` one, written on the
 * properties it was given (the caller's object without the agent, the copy here), so the
 * caller's properties get it when they still have none:
 *
 *     if not properties.message_id and sent.message_id:
 *         properties.message_id = sent.message_id
 *
 * An ``Exception`` on the way is cleared (the agent's problem, never the caller's): 0; -1
 * with any other error. */
static int copy_back(PyObject *state) {
    PyObject *properties = PyTuple_GET_ITEM(state, 0), *sent = PyTuple_GET_ITEM(state, 1);
    PyObject *mine = PyObject_GetAttr(properties, s_message_id), *theirs = NULL;
    int ok = mine != NULL;
    int empty_mine = ok ? PyObject_Not(mine) : -1;
    ok = empty_mine >= 0;
    if (ok && empty_mine) {
        theirs = PyObject_GetAttr(sent, s_message_id);
        int set = theirs == NULL ? -1 : PyObject_IsTrue(theirs);
        ok = set >= 0 && (set == 0 || PyObject_SetAttr(properties, s_message_id, theirs) == 0);
    }
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    if (ok) {
        return 0;
    }
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* within.c's opener: the span (the call's keywords given the traced properties),
 * None (no span: the publish as it came), or NULL for the fallback (an error left set only
 * when it is not an Exception). */
static PyObject *publish_open(PyObject *owner, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                              swmp_within_after *after) {
    AmqpPublish *p = (AmqpPublish *)owner;
    PyObject *const *items = &PyTuple_GET_ITEM(*argv, 0);
    Py_ssize_t nkw = *kwnames == NULL ? 0 : PyTuple_GET_SIZE(*kwnames), at = -1;
    PyObject *exchange = empty, *routing_key = empty, *properties = Py_None;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(*kwnames, i), *value = items[nargs + i];
        if (swmp_is_name(name, s_exchange)) {
            exchange = value;
        } else if (swmp_is_name(name, s_routing_key)) {
            routing_key = value;
        } else if (swmp_is_name(name, s_properties)) {
            properties = value;
            at = i;
        }
    }
    PyObject *peer = PyObject_CallOneArg(p->peer, items[0]);
    PyObject *pair = NULL;
    if (peer != NULL) {
        PyObject *call[5] = {exchange, routing_key, peer, p->attach, properties};
        pair = swmp_amqp_send_span(NULL, call, 5, NULL);
        Py_DECREF(peer);
    }
    if (pair == NULL || !PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_XDECREF(pair);
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
        }
        return NULL;
    }
    PyObject *span = Py_NewRef(PyTuple_GET_ITEM(pair, 0)), *traced = PyTuple_GET_ITEM(pair, 1);
    if (span != Py_None && properties != Py_None && traced != properties) {
        /* Taken before the call's arguments are replaced: ``properties`` is borrowed from
         * them, and they may be its only owner (aio-pika builds them for each publish). */
        after->state = swmp_pair(properties, traced);
        if (after->state == NULL) {
            PyErr_Clear(); /* no memory: the message goes out, the caller's message_id unset */
        } else {
            after->fn = copy_back;
        }
    }
    if (span != Py_None && with_properties(argv, kwnames, at, traced) < 0) {
        PyErr_Clear(); /* the span exists: the message goes out in it, untraced headers */
        after->fn = NULL; /* with the caller's own properties: nothing to give back */
        Py_CLEAR(after->state);
    }
    Py_DECREF(pair);
    return span;
}

/* Whether ``body`` is among the keywords (aio-pika passes every argument by keyword). */
static int body_by_keyword(PyObject *kwnames) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        if (swmp_is_name(PyTuple_GET_ITEM(kwnames, i), s_body)) {
            return 1;
        }
    }
    return 0;
}

static PyObject *publish_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    AmqpPublish *p = (AmqpPublish *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* The channel and the body, the body by position or by keyword; anything else (options
     * by position, no body, two bodies) is the Python form's, which binds or refuses it as
     * the call is made. */
    if (nargs < 1 || nargs + body_by_keyword(kwnames) != 2) {
        return PyObject_Vectorcall(p->fallback, args, nargsf, kwnames);
    }
    return swmp_within_lazy(publish_open, callable, p->orig, p->fallback, args, nargsf, kwnames);
}

static PyObject *publish_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *orig, *fallback, *attach, *peer;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) ||
        !PyArg_ParseTuple(args, "OOOO:AmqpPublish", &orig, &fallback, &attach, &peer) || !PyCallable_Check(orig) ||
        !PyCallable_Check(fallback) || !PyCallable_Check(attach) || !PyCallable_Check(peer)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "AmqpPublish(orig, fallback, attach, peer): four callables");
        }
        return NULL;
    }
    if (empty == NULL && ((s_exchange = PyUnicode_InternFromString("exchange")) == NULL ||
                          (s_routing_key = PyUnicode_InternFromString("routing_key")) == NULL ||
                          (s_properties = PyUnicode_InternFromString("properties")) == NULL ||
                          (s_body = PyUnicode_InternFromString("body")) == NULL ||
                          (s_message_id = PyUnicode_InternFromString("message_id")) == NULL ||
                          (empty = PyUnicode_InternFromString("")) == NULL)) {
        return NULL;
    }
    AmqpPublish *p = (AmqpPublish *)type->tp_alloc(type, 0);
    if (p == NULL) {
        return NULL;
    }
    p->orig = Py_NewRef(orig);
    p->fallback = Py_NewRef(fallback);
    p->attach = Py_NewRef(attach);
    p->peer = Py_NewRef(peer);
    p->vectorcall = publish_vectorcall;
    return (PyObject *)p;
}

static int publish_traverse(AmqpPublish *p, visitproc visit, void *arg) {
    Py_VISIT(p->orig);
    Py_VISIT(p->fallback);
    Py_VISIT(p->attach);
    Py_VISIT(p->peer);
    return 0;
}

static int publish_clear(AmqpPublish *p) {
    Py_CLEAR(p->orig);
    Py_CLEAR(p->fallback);
    Py_CLEAR(p->attach);
    Py_CLEAR(p->peer);
    return 0;
}

static void publish_dealloc(AmqpPublish *p) {
    PyObject_GC_UnTrack(p);
    publish_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

PyTypeObject swmp_AmqpPublishType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.AmqpPublish",
    .tp_basicsize = sizeof(AmqpPublish),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AmqpPublish(orig, fallback, attach, peer): aiormq's basic_publish(channel, body, **kw) in its "
              "exit span, opened when awaited; other calls go to fallback.",
    .tp_new = publish_new,
    .tp_dealloc = (destructor)publish_dealloc,
    .tp_traverse = (traverseproc)publish_traverse,
    .tp_clear = (inquiry)publish_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AmqpPublish, vectorcall),
};
