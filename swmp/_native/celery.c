/* CelerySend(fallback, orig, last): what ``Celery.send_task`` is patched with: the publish
 * wrapper of swmp/instrument/celery.py (``_wrap_send_task``'s ``send_task``) with its common
 * case in C.
 *
 * Why: every task published (``delay``, ``apply_async``, canvas, retries, beat) ran the
 * Python wrapper, ~70 bytecodes in a frame of its own plus the calls it makes (the span's
 * methods, the message's arm and disarm), between Celery's own publish work, which is ~100x
 * larger and leaves the CPU caches cold: each bytecode, code object and dict entry the
 * wrapper touched cost its cache lines, and a publish in a request added ~5.4 us where the
 * same wrapper in a warm loop added ~2.3 (issue 11's target: <= 5 us).
 *
 * What it does is exactly the Python wrapper's: ``celery/<name>`` as the exit span's
 * operation, the peer and ``mq.broker`` tag of the app's broker, the span from
 * new_exit_span (start.c); a recorded span entered, tagged (one list when the tag is its
 * first and fits the tag limit, else ``Span.tag``), its ``inject()`` headers armed for the
 * task message Celery builds (swmp/instrument/_celery_message.py: the same ContextVar and
 * box), the original called with the caller's arguments unchanged, the span finished with
 * the caller's exception (passed on unchanged) or after the message was built, and an armed
 * box nobody took reported as the Python code does (``not_consumed``). A failure while
 * tagging or injecting is an ``Exception`` logged once (``failed``: warn_once, with the
 * exception as the one being handled) and the task goes without the trace, as in Python.
 *
 * Everything else is the Python function's (``fallback``), called with the same arguments
 * before any span is made: an app that is not the last one seen (its broker is looked up
 * there, and ``last`` updated), an app whose messages are not Celery's own (``sw8`` goes as
 * the ``headers`` option), a caller's own ``headers`` option (merged there), the
 * parameters tag enabled, a task name that is not a str, a keyword naming a parameter the
 * call already gives positionally (the Python binding's TypeError, before any span). A span
 * that is not recorded runs the original directly (NOOP) or in ``send_in``'s ``with span:``
 * (an IgnoredSpan). One deliberate difference: if finishing the span fails while the
 * original raised, the caller still gets its own exception (the Python ``__exit__`` call
 * would replace it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "celery.h"
#include "spancore.h"

/* Set by setup_celery(): see its docstring in spancore.c's method table. */
static PyObject *noop = NULL, *no_tags = NULL, *limits = NULL, *settings = NULL, *component = NULL, *layer = NULL,
                *tag_broker = NULL, *armed = NULL, *failed = NULL, *not_consumed = NULL, *send_in = NULL;
static PyTypeObject *span_class = NULL;
static PyObject *s_tag, *s_params_length, *prefix, *k_self, *k_name, *k_args, *k_kwargs, *k_headers;

PyObject *swmp_setup_celery(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyType_Check(args[0]) || !PyUnicode_CheckExact(args[7]) ||
        !PyContextVar_CheckExact(args[8]) || !PyCallable_Check(args[9]) || !PyCallable_Check(args[10]) ||
        !PyCallable_Check(args[11])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_celery(span_class: type, noop, no_tags, limits, settings, component, layer, "
                        "tag_broker: str, armed: ContextVar, failed, not_consumed, send_in)");
        return NULL;
    }
    if (s_tag == NULL) {
#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) { \
        return NULL;                                        \
    }
        INTERN(s_tag, "tag");
        INTERN(s_params_length, "params_length");
        INTERN(prefix, "celery/");
        INTERN(k_self, "self");
        INTERN(k_name, "name");
        INTERN(k_args, "args");
        INTERN(k_kwargs, "kwargs");
        INTERN(k_headers, "headers");
#undef INTERN
    }
    PyObject **slots[] = {(PyObject **)&span_class, &noop, &no_tags, &limits, &settings, &component,
                          &layer, &tag_broker, &armed, &failed, &not_consumed, &send_in};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

/* The call's keywords leave the C path nothing to do with them: no ``headers`` (the
 * caller's, merged by the Python code) and none the Python binding would refuse. */
static int plain_keywords(PyObject *kwnames, Py_ssize_t nargs) {
    if (kwnames == NULL) {
        return 1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (swmp_is_name(k, k_headers) || swmp_is_name(k, k_self) || swmp_is_name(k, k_name) ||
            (nargs > 2 && swmp_is_name(k, k_args)) || (nargs > 3 && swmp_is_name(k, k_kwargs))) {
            return 0;
        }
    }
    return 1;
}

/* ``settings.params_length > 0``: 1, 0, or -1 with an error. */
static int wants_parameters(void) {
    PyObject *length = PyObject_GetAttr(settings, s_params_length);
    if (length == NULL) {
        return -1;
    }
    int r;
    if (PyLong_CheckExact(length)) {
        int overflow;
        long n = PyLong_AsLongAndOverflow(length, &overflow);
        r = n == -1 && PyErr_Occurred() ? -1 : n > 0 || overflow > 0;
    } else {
        PyObject *zero = PyLong_FromLong(0);
        r = zero == NULL ? -1 : PyObject_RichCompareBool(length, zero, Py_GT);
        Py_XDECREF(zero);
    }
    Py_DECREF(length);
    return r;
}

/* The ``mq.broker`` tag (one list when it is the span's first and fits the tag limit, else
 * ``span.tag``) and the box holding ``span.inject()``: 0, or -1 with an error. */
static int tag_and_box(PyObject *span, PyObject *broker, PyObject **box) {
    int first = 0;
    if (swmp_span_tags(span) == no_tags && PyUnicode_Check(broker)) {
        Py_ssize_t lim = swmp_tag_limit(limits);
        if (lim == -1 && PyErr_Occurred()) {
            return -1;
        }
        first = PyUnicode_GET_LENGTH(broker) <= lim;
    }
    if (first) {
        PyObject *tags = PyList_New(2);
        if (tags == NULL) {
            return -1;
        }
        PyList_SET_ITEM(tags, 0, Py_NewRef(tag_broker));
        PyList_SET_ITEM(tags, 1, Py_NewRef(broker));
        swmp_span_set_tags(span, tags);
    } else {
        PyObject *call[3] = {span, tag_broker, broker};
        PyObject *r = PyObject_VectorcallMethod(s_tag, call, 3, NULL);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    PyObject *sw = swmp_span_inject(span);
    if (sw == NULL) {
        return -1;
    }
    *box = PyList_New(1);
    if (*box == NULL) {
        Py_DECREF(sw);
        return -1;
    }
    PyList_SET_ITEM(*box, 0, sw);
    return 0;
}

typedef struct {
    PyObject_HEAD
    PyObject *fallback; /* the Python send_task: every other case */
    PyObject *orig;     /* Celery's send_task */
    PyObject *last;     /* [(app, peer, broker, in_message)]: the Python wrapper's, shared */
    PyObject *dict;
    vectorcallfunc vectorcall;
} CelerySend;

/* The publish inside ``span`` (recorded, of span_class): the Python wrapper's steps. */
static PyObject *send_traced(CelerySend *s, PyObject *span, PyObject *peer, PyObject *broker, PyObject *const *args,
                             size_t nargsf, PyObject *kwnames) {
    if (swmp_span_enter(span) < 0) {
        return NULL; /* as ``span.__enter__()`` in Python: raised */
    }
    PyObject *box = NULL;
    if (tag_and_box(span, broker, &box) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL; /* as Python's ``except Exception``: anything else goes on up */
        }
        swmp_report_handled(failed, NULL, 0); /* logged once: the task goes on all the same */
    }
    PyObject *token = NULL;
    if (box != NULL && (token = PyContextVar_Set(armed, box)) == NULL) {
        Py_DECREF(box);
        return NULL; /* as ``_arm(box)`` in Python: raised */
    }
    PyObject *result = PyObject_Vectorcall(s->orig, args, nargsf, kwnames);
    if (result == NULL) {
        /* The span gets the exception (``__exit__(type(e), e, e.__traceback__)``), which
         * then reaches the caller as it was raised. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
        if (value != NULL && swmp_span_exit(span, value) < 0) {
            PyErr_Clear(); /* the caller's exception, not the agent's, goes on up */
        }
        if (token != NULL && PyContextVar_Reset(armed, token) < 0) {
            PyErr_Clear();
        }
        Py_XDECREF(token);
        Py_XDECREF(box);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    int r = 0;
    if (token != NULL) {
        r = PyContextVar_Reset(armed, token);
        Py_DECREF(token);
    }
    if (r == 0 && box != NULL && PyList_GET_SIZE(box) > 0) {
        /* Armed and not taken: this app builds its messages some other way. */
        PyObject *call[4] = {args[0], peer, broker, s->last};
        PyObject *done = PyObject_Vectorcall(not_consumed, call, 4, NULL);
        r = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    Py_XDECREF(box);
    if (r == 0) {
        r = swmp_span_exit(span, NULL);
    }
    if (r < 0) {
        Py_DECREF(result); /* as in Python: the agent's step raised after the send */
        return NULL;
    }
    return result;
}

/* ``send_in(span, orig, *args, **options)``: the original inside ``with span:``. */
static PyObject *send_unrecorded(CelerySend *s, PyObject *span, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    return swmp_call_with_two(send_in, span, s->orig, args, PyVectorcall_NARGS(nargsf), kwnames);
}

static PyObject *send_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    CelerySend *s = (CelerySend *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (span_class == NULL || nargs < 2 || !PyUnicode_CheckExact(args[1]) || !plain_keywords(kwnames, nargs) ||
        PyList_GET_SIZE(s->last) != 1) {
        return PyObject_Vectorcall(s->fallback, args, nargsf, kwnames);
    }
    PyObject *entry = PyList_GET_ITEM(s->last, 0);
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4 || PyTuple_GET_ITEM(entry, 0) != args[0] ||
        PyTuple_GET_ITEM(entry, 3) != Py_True) {
        return PyObject_Vectorcall(s->fallback, args, nargsf, kwnames);
    }
    int params = wants_parameters();
    if (params != 0) {
        PyErr_Clear(); /* the Python code reads the setting again, and raises what it raises */
        return PyObject_Vectorcall(s->fallback, args, nargsf, kwnames);
    }
    Py_INCREF(entry); /* its peer and broker are used while Python code may replace it */
    PyObject *peer = PyTuple_GET_ITEM(entry, 1), *broker = PyTuple_GET_ITEM(entry, 2);
    PyObject *op = PyUnicode_Concat(prefix, args[1]);
    PyObject *span = NULL;
    if (op != NULL) {
        PyObject *exit_args[4] = {op, peer, component, layer};
        span = swmp_new_exit(exit_args);
        Py_DECREF(op);
    }
    PyObject *result = NULL;
    if (span == NULL) {
        /* as in Python: new_exit_span's error raised */
    } else if (span == noop) {
        result = PyObject_Vectorcall(s->orig, args, nargsf, kwnames);
    } else if (!Py_IS_TYPE(span, span_class)) {
        result = send_unrecorded(s, span, args, nargsf, kwnames);
    } else {
        result = send_traced(s, span, peer, broker, args, nargsf, kwnames);
    }
    Py_XDECREF(span);
    Py_DECREF(entry);
    return result;
}

static PyObject *send_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fallback, *orig, *last;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "CelerySend() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "CelerySend", 3, 3, &fallback, &orig, &last)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(orig) || !PyList_CheckExact(last)) {
        PyErr_SetString(PyExc_TypeError, "CelerySend(fallback, orig, last: list): fallback and orig must be callable");
        return NULL;
    }
    CelerySend *s = (CelerySend *)type->tp_alloc(type, 0);
    if (s == NULL) {
        return NULL;
    }
    s->fallback = Py_NewRef(fallback);
    s->orig = Py_NewRef(orig);
    s->last = Py_NewRef(last);
    s->dict = NULL;
    s->vectorcall = send_vectorcall;
    return (PyObject *)s;
}

static int send_traverse(CelerySend *s, visitproc visit, void *arg) {
    Py_VISIT(s->fallback);
    Py_VISIT(s->orig);
    Py_VISIT(s->last);
    Py_VISIT(s->dict);
    return 0;
}

static int send_clear(CelerySend *s) {
    Py_CLEAR(s->fallback);
    Py_CLEAR(s->orig);
    Py_CLEAR(s->last);
    Py_CLEAR(s->dict);
    return 0;
}

static void send_dealloc(CelerySend *s) {
    PyObject_GC_UnTrack(s);
    send_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* A function's binding: itself from the class, a bound method from an instance. */
static PyObject *send_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *send_repr(CelerySend *s) {
    return PyUnicode_FromFormat("<swmp Celery publish of %R>", s->orig);
}

static PyObject *send_fallback(CelerySend *s, void *closure) {
    return Py_NewRef(s->fallback);
}

static PyGetSetDef send_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"fallback", (getter)send_fallback, NULL, "The Python wrapper, which takes every other case.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject swmp_CelerySendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.CelerySend",
    .tp_basicsize = sizeof(CelerySend),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "CelerySend(fallback, orig, last): Celery.send_task in its exit span (swmp/instrument/celery.py's "
              "send_task, its common case in C; fallback takes the others).",
    .tp_new = send_new,
    .tp_dealloc = (destructor)send_dealloc,
    .tp_traverse = (traverseproc)send_traverse,
    .tp_clear = (inquiry)send_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CelerySend, vectorcall),
    .tp_descr_get = send_get,
    .tp_dictoffset = offsetof(CelerySend, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_repr = (reprfunc)send_repr,
    .tp_getset = send_getset,
};
