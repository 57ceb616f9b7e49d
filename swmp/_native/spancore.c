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
 * Segment.closed would: a native segment by ``emit_fast`` below (Segment.emit's steps in C),
 * any other by its ``emit()``.
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
#include <structmember.h>
#include <string.h>
#include <time.h>

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

typedef struct {
    PyObject_HEAD
    PyObject *segment;
    PyObject *span_id;
    PyObject *parent_id;
    PyObject *start;
    PyObject *end;
    PyObject *op;
    PyObject *peer;
    PyObject *kind;
    PyObject *layer;
    PyObject *component;
    PyObject *is_error;
    PyObject *tags;
    PyObject *logs;
    PyObject *refs;
    PyObject *prev; /* _prev: the span that was current when this one was entered */
} SpanCore;

typedef struct {
    PyObject_HEAD
    PyObject *trace_id;
    PyObject *segment_id;
    PyObject *finished;  /* spans in the order they finished */
    Py_ssize_t next_id;  /* the next span's id (0 is the first span's): see SpanIds */
    PyObject *open;      /* one token per open span */
    PyObject *token;     /* [True]: the right to emit, taken once */
    PyObject *first;
    PyObject *size_limited;
    PyObject *skip_analysis;
    PyObject *encoded;
    PyObject *correlation;
    PyObject *profile;
    PyObject *ended_op; /* the first span's operation name once the segment is emitted */
} SegmentCore;
static PyTypeObject SegmentCoreType;
static int emit_segment(PyObject *seg);

/* A list or object field of a segment: the struct's own for ours, by attribute otherwise
 * (a pure-Python segment). New reference. */
#define SEG_FIELD(seg, member, name) \
    (PyObject_TypeCheck((seg), &SegmentCoreType) ? Py_NewRef(((SegmentCore *)(seg))->member) \
                                                  : PyObject_GetAttr((seg), (name)))

/* Set once by setup(): the context variable of the current span, the shared "nothing yet"
 * tuple of tags/logs/refs, and the function counting a lost span (stats.spans_lost). */
static PyObject *current_var = NULL;
static PyObject *empty = NULL;
static PyObject *count_lost = NULL;
/* For exit_child(): the Python class of recorded spans, the exit kind, the span limits. */
static PyTypeObject *span_class = NULL;
static PyObject *exit_kind = NULL;
static PyObject *limits = NULL;

static PyObject *s_enter_method, *s_exit_method, *s_finished, *s_open, *s_token, *s_emit, *s_error, *s_interrupted, *s_profile, *s_stop, *s_end, *s_prev,
    *s_ids, *s_span_limit, *s_op, *empty_op;
static PyTypeObject SpanCoreType;

static PyObject *now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the clock of time.time_ns() */
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static int check_setup(void) {
    if (current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup() was not called");
        return -1;
    }
    return 0;
}

/* A span of ``type`` with its start time now; steals ``span_id`` (the others are borrowed). */
static PyObject *make_span(PyTypeObject *type, PyObject *segment, PyObject *span_id, PyObject *parent_id,
                           PyObject *op, PyObject *kind, PyObject *layer, PyObject *component, PyObject *peer) {
    PyObject *start = now_ms();
    if (start == NULL) {
        Py_DECREF(span_id);
        return NULL;
    }
    SpanCore *self = (SpanCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(span_id);
        Py_DECREF(start);
        return NULL;
    }
    self->segment = Py_NewRef(segment);
    self->span_id = span_id;
    self->parent_id = Py_NewRef(parent_id);
    self->op = Py_NewRef(op);
    self->kind = Py_NewRef(kind);
    self->layer = Py_NewRef(layer);
    self->component = Py_NewRef(component);
    self->peer = Py_NewRef(peer);
    self->start = start;
    self->end = PyLong_FromLong(0);
    self->is_error = Py_NewRef(Py_False);
    self->tags = Py_NewRef(empty);
    self->logs = Py_NewRef(empty);
    self->refs = Py_NewRef(empty);
    self->prev = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static PyObject *spancore_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (check_setup() < 0) {
        return NULL;
    }
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Span() takes positional arguments only");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) != 8) {
        PyErr_Format(PyExc_TypeError, "Span() takes 8 positional arguments (%zd given)", PyTuple_GET_SIZE(args));
        return NULL;
    }
    /* (segment, span_id, parent_id, op, kind, layer, component, peer) */
#define ARG(i) PyTuple_GET_ITEM(args, i)
    return make_span(type, ARG(0), Py_NewRef(ARG(1)), ARG(2), ARG(3), ARG(4), ARG(5), ARG(6), ARG(7));
#undef ARG
}

static int spancore_init(PyObject *self, PyObject *args, PyObject *kwds) {
    return 0; /* everything is done by __new__ (a subclass's __init__ may add more) */
}

static int spancore_traverse(SpanCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->segment);
    Py_VISIT(self->span_id);
    Py_VISIT(self->parent_id);
    Py_VISIT(self->start);
    Py_VISIT(self->end);
    Py_VISIT(self->op);
    Py_VISIT(self->peer);
    Py_VISIT(self->kind);
    Py_VISIT(self->layer);
    Py_VISIT(self->component);
    Py_VISIT(self->is_error);
    Py_VISIT(self->tags);
    Py_VISIT(self->logs);
    Py_VISIT(self->refs);
    Py_VISIT(self->prev);
    return 0;
}

static int spancore_clear(SpanCore *self) {
    Py_CLEAR(self->segment);
    Py_CLEAR(self->span_id);
    Py_CLEAR(self->parent_id);
    Py_CLEAR(self->start);
    Py_CLEAR(self->end);
    Py_CLEAR(self->op);
    Py_CLEAR(self->peer);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->layer);
    Py_CLEAR(self->component);
    Py_CLEAR(self->is_error);
    Py_CLEAR(self->tags);
    Py_CLEAR(self->logs);
    Py_CLEAR(self->refs);
    Py_CLEAR(self->prev);
    return 0;
}

/* A static base type: a Python subclass's own dealloc/traverse handle its type reference. */
static void spancore_dealloc(SpanCore *self) {
    PyObject_GC_UnTrack(self);
    spancore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- the context -------------------------------------------------------------------------- */

static PyObject *get_current(void) {
    PyObject *value = NULL;
    if (PyContextVar_Get(current_var, NULL, &value) < 0) {
        return NULL;
    }
    if (value == NULL) {
        value = Py_NewRef(Py_None);
    }
    return value; /* new reference */
}

static int set_current(PyObject *value) {
    PyObject *token = PyContextVar_Set(current_var, value);
    if (token == NULL) {
        return -1;
    }
    Py_DECREF(token);
    return 0;
}

/* ``obj.end`` is true: the fields of our own spans directly, other objects by attribute. */
static int has_ended(PyObject *obj) {
    if (PyObject_TypeCheck(obj, &SpanCoreType)) {
        return PyObject_IsTrue(((SpanCore *)obj)->end);
    }
    PyObject *end = PyObject_GetAttr(obj, s_end);
    if (end == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(end);
    Py_DECREF(end);
    return r;
}

static PyObject *prev_of(PyObject *obj) {
    if (PyObject_TypeCheck(obj, &SpanCoreType)) {
        return Py_NewRef(((SpanCore *)obj)->prev);
    }
    return PyObject_GetAttr(obj, s_prev);
}

/* If this span is current, the nearest ancestor that is still open becomes current. */
static int leave_context(SpanCore *self) {
    PyObject *cur = get_current();
    if (cur == NULL) {
        return -1;
    }
    int is_self = cur == (PyObject *)self;
    Py_DECREF(cur);
    if (!is_self) {
        return 0;
    }
    PyObject *prev = Py_NewRef(self->prev);
    while (prev != Py_None) {
        int ended = has_ended(prev);
        if (ended < 0) {
            Py_DECREF(prev);
            return -1;
        }
        if (!ended) {
            break;
        }
        PyObject *up = prev_of(prev);
        Py_DECREF(prev);
        if (up == NULL) {
            return -1;
        }
        prev = up;
    }
    int r = set_current(prev);
    Py_DECREF(prev);
    return r;
}

/* -- finishing -------------------------------------------------------------------------- */

static int lost(void) {
    PyObject *r = PyObject_CallNoArgs(count_lost);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* ``lst.pop()`` of a non-empty list, the result dropped: the size lowered in place for an
 * exact list (no resize: a segment's bookkeeping lists hold one or two items, and shrinking
 * them meant a realloc of their item array at every span's end), else PyList_SetSlice. */
static int pop_last(PyObject *lst) {
    Py_ssize_t n = PyList_GET_SIZE(lst);
    if (!PyList_CheckExact(lst)) {
        return PyList_SetSlice(lst, n - 1, n, NULL);
    }
    PyObject *item = PyList_GET_ITEM(lst, n - 1);
    PyList_SET_ITEM(lst, n - 1, NULL);
    Py_SET_SIZE(lst, n - 1);
    Py_DECREF(item); /* last: the list is whole again if this runs a finalizer */
    return 0;
}

/* Segment.closed(span): record the span as finished, give back its open token, and emit the
 * segment if it was the last one open and the emit token is still there. */
static int segment_closed(SpanCore *self) {
    PyObject *seg = self->segment;
    PyObject *finished = SEG_FIELD(seg, finished, s_finished);
    if (finished == NULL) {
        return -1;
    }
    int r = PyList_Check(finished) ? PyList_Append(finished, (PyObject *)self) : -1;
    Py_DECREF(finished);
    if (r < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "segment.finished is not a list");
        }
        return -1;
    }
    PyObject *open = SEG_FIELD(seg, open, s_open);
    if (open == NULL) {
        return -1;
    }
    if (!PyList_Check(open)) {
        Py_DECREF(open);
        PyErr_SetString(PyExc_TypeError, "segment._open is not a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(open);
    if (n == 0) {
        Py_DECREF(open);
        return lost();
    }
    r = pop_last(open);
    Py_ssize_t left = PyList_GET_SIZE(open);
    Py_DECREF(open);
    if (r < 0) {
        return -1;
    }
    if (left) {
        return 0;
    }
    PyObject *token = SEG_FIELD(seg, token, s_token);
    if (token == NULL) {
        return -1;
    }
    if (!PyList_Check(token)) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_TypeError, "segment._token is not a list");
        return -1;
    }
    n = PyList_GET_SIZE(token);
    if (n == 0) {
        /* Already emitted (a span that raced the segment's end): counted, not re-emitted. */
        Py_DECREF(token);
        return lost();
    }
    r = pop_last(token);
    Py_DECREF(token);
    if (r < 0) {
        return -1;
    }
    return emit_segment(seg);
}

/* ``parent_id`` of an exit span standing in for one dropped over the span limit
 * (swmp.tracing.span.UNRECORDED, the same value): not recorded, its end leaves the segment's
 * bookkeeping alone. */
#define UNRECORDED_PARENT (-2)

static int is_unrecorded(SpanCore *self) {
    int overflow = 0;
    return self->parent_id != NULL && PyLong_CheckExact(self->parent_id) &&
           PyLong_AsLongAndOverflow(self->parent_id, &overflow) == UNRECORDED_PARENT && overflow == 0;
}

/* The end of a span: profiling stopped first (no snapshot after the segment's end), the end
 * time, the context, the segment's bookkeeping. ``end_ms`` NULL or false: now. */
static int finish_span(SpanCore *self, PyObject *end_ms) {
    int ended = PyObject_IsTrue(self->end);
    if (ended != 0) {
        return ended < 0 ? -1 : 0;
    }
    int unrecorded = is_unrecorded(self);
    int overflow = 0;
    long id = PyLong_CheckExact(self->span_id) ? PyLong_AsLongAndOverflow(self->span_id, &overflow) : -1;
    if (id == 0 && overflow == 0 && !unrecorded) { /* an exact int: no error possible */
        PyObject *profile = SEG_FIELD(self->segment, profile, s_profile);
        if (profile == NULL) {
            return -1;
        }
        if (profile != Py_None) {
            PyObject *r = PyObject_CallMethodNoArgs(profile, s_stop);
            if (r == NULL) {
                Py_DECREF(profile);
                return -1;
            }
            Py_DECREF(r);
        }
        Py_DECREF(profile);
    }
    PyObject *end;
    int given = end_ms == NULL ? 0 : PyObject_IsTrue(end_ms);
    if (given < 0) {
        return -1;
    }
    end = given ? Py_NewRef(end_ms) : now_ms();
    if (end == NULL) {
        return -1;
    }
    Py_SETREF(self->end, end);
    if (leave_context(self) < 0) {
        return -1;
    }
    return unrecorded ? 0 : segment_closed(self); /* a stand-in is no part of its segment */
}

static PyObject *spancore_enter(SpanCore *self, PyObject *unused) {
    PyObject *cur = get_current();
    if (cur == NULL) {
        return NULL;
    }
    Py_SETREF(self->prev, cur);
    if (set_current((PyObject *)self) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *spancore_exit(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (args[1] != Py_None) {
        /* Only an Exception marks the span failed; a CancelledError, GeneratorExit,
         * KeyboardInterrupt or SystemExit is recorded by Span.interrupted (its docstring says
         * why), as PySpanCore.__exit__ does. */
        PyObject *r = PyObject_CallMethodOneArg(
            (PyObject *)self, PyObject_TypeCheck(args[1], (PyTypeObject *)PyExc_Exception) ? s_error : s_interrupted,
            args[1]);
        if (r == NULL) {
            /* Recording the exception failed (a subclass's error(), an object of the
             * application's that cannot be read): the span still ends, and the with
             * statement raises the application's exception, not this one. */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                int ended = finish_span(self, NULL);
                if (ended < 0) {
                    PyErr_Clear();
                }
                PyErr_Restore(type, value, tb);
                return NULL;
            }
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    if (finish_span(self, NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *spancore_finish(SpanCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *end_ms = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "finish() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        end_ms = args[0];
    } else if (nkw == 1) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "end_ms") != 0) {
            PyErr_SetString(PyExc_TypeError, "finish() got an unexpected keyword argument");
            return NULL;
        }
        end_ms = args[0];
    }
    if (finish_span(self, end_ms) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *spancore_inject(SpanCore *self, PyObject *unused); /* with sw8_header, below */

/* The span steps the other sources take: for a span of the recorded class the methods' own
 * code, without the method look-ups (Span adds no __enter__ / __exit__ of its own). */
int swmp_span_enter(PyObject *span) {
    PyObject *r = Py_TYPE(span) == span_class ? spancore_enter((SpanCore *)span, NULL)
                                               : PyObject_CallMethodNoArgs(span, s_enter_method);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

int swmp_span_exit(PyObject *span, PyObject *exc) {
    PyObject *args[3] = {exc != NULL ? (PyObject *)Py_TYPE(exc) : Py_None, exc != NULL ? exc : Py_None, Py_None};
    PyObject *r = spancore_exit((SpanCore *)span, args, 3);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

PyObject *swmp_span_inject(PyObject *span) {
    return spancore_inject((SpanCore *)span, NULL);
}

PyObject *swmp_span_tags(PyObject *span) {
    return ((SpanCore *)span)->tags;
}

void swmp_span_set_tags(PyObject *span, PyObject *tags) {
    Py_SETREF(((SpanCore *)span)->tags, tags);
}

static PyMethodDef spancore_methods[] = {
    {"__enter__", (PyCFunction)spancore_enter, METH_NOARGS, "Make this span the current one."},
    {"inject", (PyCFunction)spancore_inject, METH_NOARGS,
     "Headers that make a downstream service continue this trace with this span as parent."},
    {"__exit__", (PyCFunction)(void (*)(void))spancore_exit, METH_FASTCALL,
     "Record the exception if any, and finish."},
    {"finish", (PyCFunction)(void (*)(void))spancore_finish, METH_FASTCALL | METH_KEYWORDS,
     "finish(end_ms=None): finish the span (idempotent)."},
    {NULL, NULL, 0, NULL},
};

/* Setting a field from Python as a slot's member descriptor does; deleting one of the core's
 * fields refused. Why: the C paths read the fields without a NULL check (a field is always
 * set from __new__ on), and ``del span.end`` on a span a user holds would otherwise leave a
 * NULL for them to crash on. Python code only ever sets them. Deleting anything else (an
 * attribute in a subclass's __dict__) goes on as usual. Stores from Python lose the
 * interpreter's STORE_ATTR_SLOT specialization (it wants the generic setattro): a few tens of
 * ns on the few fields Python code sets per span; loads keep theirs. */
static int refuse_field_deletion(PyObject *self, PyObject *name, PyObject *value, PyTypeObject *core) {
    if (value == NULL && PyUnicode_Check(name)) {
        PyObject *d = _PyType_Lookup(Py_TYPE(self), name); /* borrowed */
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) && PyDescr_TYPE(d) == core) {
            PyErr_Format(PyExc_AttributeError, "'%s' field '%U' cannot be deleted", core->tp_name, name);
            return -1;
        }
    }
    return PyObject_GenericSetAttr(self, name, value);
}

static int spancore_setattro(PyObject *self, PyObject *name, PyObject *value) {
    return refuse_field_deletion(self, name, value, &SpanCoreType);
}

#define FIELD(name, member) {name, T_OBJECT_EX, offsetof(SpanCore, member), 0, NULL}
static PyMemberDef spancore_members[] = {
    FIELD("segment", segment),
    FIELD("span_id", span_id),
    FIELD("parent_id", parent_id),
    FIELD("start", start),
    FIELD("end", end),
    FIELD("op", op),
    FIELD("peer", peer),
    FIELD("kind", kind),
    FIELD("layer", layer),
    FIELD("component", component),
    FIELD("is_error", is_error),
    FIELD("tags", tags),
    FIELD("logs", logs),
    FIELD("refs", refs),
    FIELD("_prev", prev),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SpanCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SpanCore",
    .tp_basicsize = sizeof(SpanCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and life cycle of a span (see swmp.tracing.span).",
    .tp_new = spancore_new,
    .tp_init = spancore_init,
    .tp_dealloc = (destructor)spancore_dealloc,
    .tp_traverse = (traverseproc)spancore_traverse,
    .tp_clear = (inquiry)spancore_clear,
    .tp_methods = spancore_methods,
    .tp_members = spancore_members,
    .tp_setattro = spancore_setattro,
};

/* -- ids -------------------------------------------------------------------------------- */

/* set_ids(prefix, pid, pid_holder, pid_function, reseed): ``prefix`` and ``pid`` as drawn by
 * swmp.tracing.ids for this process; the current pid is ``pid_holder.pid`` (kept by the fork
 * hooks, no system call) or, when the holder is None, ``pid_function()``; ``reseed()`` draws
 * a new prefix (and calls set_ids) when they differ: after a fork. */
static PyObject *id_prefix = NULL;
static long long id_pid = -1;
static unsigned long long id_counter = 0;
static PyObject *pid_holder = NULL, *pid_function = NULL, *reseed_ids = NULL, *s_pid = NULL;

static PyObject *set_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1]) || !PyCallable_Check(args[3]) ||
        !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "set_ids(prefix: str, pid: int, pid_holder, pid_function, reseed)");
        return NULL;
    }
    long long pid = PyLong_AsLongLong(args[1]);
    if (pid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_XSETREF(id_prefix, Py_NewRef(args[0]));
    Py_XSETREF(pid_holder, Py_NewRef(args[2]));
    Py_XSETREF(pid_function, Py_NewRef(args[3]));
    Py_XSETREF(reseed_ids, Py_NewRef(args[4]));
    id_pid = pid;
    id_counter = 0;
    Py_RETURN_NONE;
}

/* ``holder.pid`` (kept by the fork hooks, no system call) or, with no holder, ``fn()``;
 * -1 with an error. */
static long long pid_of(PyObject *holder, PyObject *fn, swmp_AttrCache *cache) {
    PyObject *v = holder != Py_None ? swmp_slot_attr(holder, s_pid, cache) : PyObject_CallNoArgs(fn);
    if (v == NULL) {
        return -1;
    }
    long long pid = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return pid;
}

static long long current_pid(void) {
    static swmp_AttrCache at_pid;
    return pid_of(pid_holder, pid_function, &at_pid);
}

static PyObject *draw_id(void) {
    if (id_prefix == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.set_ids() was not called");
        return NULL;
    }
    long long pid = current_pid();
    if (pid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pid != id_pid) {
        PyObject *r = PyObject_CallNoArgs(reseed_ids); /* calls set_ids() */
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    /* The counter is safe under the GIL: nothing between the read and the store releases it. */
    unsigned long long n = ++id_counter;
    char digits[24];
    int len = 0;
    do { /* backwards: the id is built once, in one allocation */
        digits[sizeof digits - 1 - len++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    if (PyUnicode_KIND(id_prefix) != PyUnicode_1BYTE_KIND) { /* set_ids() got a non-ASCII prefix */
        PyObject *tail = PyUnicode_FromStringAndSize(digits + sizeof digits - len, len);
        PyObject *id = tail == NULL ? NULL : PyUnicode_Concat(id_prefix, tail);
        Py_XDECREF(tail);
        return id;
    }
    Py_ssize_t plen = PyUnicode_GET_LENGTH(id_prefix);
    PyObject *id = PyUnicode_New(plen + len, PyUnicode_MAX_CHAR_VALUE(id_prefix));
    if (id == NULL) {
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(id), PyUnicode_1BYTE_DATA(id_prefix), (size_t)plen);
    memcpy(PyUnicode_1BYTE_DATA(id) + plen, digits + sizeof digits - len, (size_t)len);
    return id;
}

static PyObject *new_id(PyObject *module, PyObject *unused) {
    return draw_id();
}

/* -- the segment ------------------------------------------------------------------------- */


/* set_segments(identity, no_correlation): what a new segment needs. */
static PyObject *seg_identity = NULL, *no_correlation = NULL, *one = NULL, *s_unbound = NULL, *s_bind = NULL;

static PyObject *set_segments(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_segments(identity, no_correlation)");
        return NULL;
    }
    Py_XSETREF(seg_identity, Py_NewRef(args[0]));
    Py_XSETREF(no_correlation, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *segcore_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (seg_identity == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.set_segments() was not called");
        return NULL;
    }
    PyObject *trace_id = Py_None;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || PyTuple_GET_SIZE(args) > 1) {
        PyErr_SetString(PyExc_TypeError, "Segment() takes at most one positional argument (trace_id)");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) == 1) {
        trace_id = PyTuple_GET_ITEM(args, 0);
    }
    /* The first segment of a process names it (its ring slot and instance) before anything
     * is built: its outgoing sw8 headers carry the instance name. */
    static swmp_AttrCache at_unbound;
    PyObject *unbound = swmp_slot_attr(seg_identity, s_unbound, &at_unbound);
    if (unbound == NULL) {
        return NULL;
    }
    int must_bind = PyObject_IsTrue(unbound);
    Py_DECREF(unbound);
    if (must_bind < 0) {
        return NULL;
    }
    if (must_bind) {
        PyObject *r = PyObject_CallMethodNoArgs(seg_identity, s_bind);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    int continues = PyObject_IsTrue(trace_id);
    if (continues < 0) {
        return NULL;
    }
    PyObject *sid = draw_id();
    if (sid == NULL) {
        return NULL;
    }
    SegmentCore *self = (SegmentCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(sid);
        return NULL;
    }
    /* A new trace reuses the segment's id as the trace id: both are unique ids. */
    self->trace_id = Py_NewRef(continues ? trace_id : sid);
    self->segment_id = sid;
    self->finished = PyList_New(2); /* the item array made with the segment, not at its end */
    self->next_id = 1;
    /* Room for an exit span's token from the start (appended without a resize). */
    self->open = PyList_New(2);
    self->token = PyList_New(1);
    self->first = Py_NewRef(Py_None);
    self->size_limited = Py_NewRef(Py_False);
    self->skip_analysis = Py_NewRef(Py_False);
    self->encoded = Py_NewRef(Py_None);
    self->correlation = Py_NewRef(no_correlation);
    self->profile = Py_NewRef(Py_None);
    self->ended_op = Py_NewRef(empty_op);
    if (self->finished == NULL || self->open == NULL || self->token == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyList_SET_ITEM(self->open, 0, Py_NewRef(Py_None)); /* the first span's token */
    Py_SET_SIZE(self->open, 1);
    Py_SET_SIZE(self->finished, 0);
    PyList_SET_ITEM(self->token, 0, Py_NewRef(Py_True));
    return (PyObject *)self;
}

static int segcore_init(PyObject *self, PyObject *args, PyObject *kwds) {
    return 0; /* everything is done by __new__ */
}

static int segcore_traverse(SegmentCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->trace_id);
    Py_VISIT(self->segment_id);
    Py_VISIT(self->finished);
    Py_VISIT(self->open);
    Py_VISIT(self->token);
    Py_VISIT(self->first);
    Py_VISIT(self->size_limited);
    Py_VISIT(self->skip_analysis);
    Py_VISIT(self->encoded);
    Py_VISIT(self->correlation);
    Py_VISIT(self->profile);
    Py_VISIT(self->ended_op);
    return 0;
}

static int segcore_clear(SegmentCore *self) {
    Py_CLEAR(self->trace_id);
    Py_CLEAR(self->segment_id);
    Py_CLEAR(self->finished);
    Py_CLEAR(self->open);
    Py_CLEAR(self->token);
    Py_CLEAR(self->first);
    Py_CLEAR(self->size_limited);
    Py_CLEAR(self->skip_analysis);
    Py_CLEAR(self->encoded);
    Py_CLEAR(self->correlation);
    Py_CLEAR(self->profile);
    Py_CLEAR(self->ended_op);
    return 0;
}

static void segcore_dealloc(SegmentCore *self) {
    PyObject_GC_UnTrack(self);
    segcore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int segcore_setattro(PyObject *self, PyObject *name, PyObject *value) {
    return refuse_field_deletion(self, name, value, &SegmentCoreType);
}

#define SEGFIELD(name, member) {name, T_OBJECT_EX, offsetof(SegmentCore, member), 0, NULL}
static PyMemberDef segcore_members[] = {
    SEGFIELD("trace_id", trace_id),
    SEGFIELD("segment_id", segment_id),
    SEGFIELD("finished", finished),
    SEGFIELD("_open", open),
    SEGFIELD("_token", token),
    SEGFIELD("first", first),
    SEGFIELD("size_limited", size_limited),
    SEGFIELD("skip_analysis", skip_analysis),
    SEGFIELD("encoded", encoded),
    SEGFIELD("correlation", correlation),
    SEGFIELD("profile", profile),
    SEGFIELD("ended_op", ended_op),
    {NULL, 0, 0, 0, NULL},
};

/* ``segment._ids``: the span-id counter as Python sees it (``next(seg._ids)``), an iterator
 * over the segment's ``next_id``. The C paths take ``next_id`` directly. Why not the
 * ``itertools.count(1)`` of the Python core: making one (a call of the type, its arguments
 * parsed) was ~600 instructions of every new segment, and a segment of one span (a task
 * published or a message consumed outside a request, a request with no exit span) never
 * draws an id from it. */
typedef struct {
    PyObject_HEAD
    SegmentCore *seg;
} SpanIds;

static int spanids_traverse(SpanIds *self, visitproc visit, void *arg) {
    Py_VISIT(self->seg);
    return 0;
}

static int spanids_clear(SpanIds *self) {
    Py_CLEAR(self->seg);
    return 0;
}

static void spanids_dealloc(SpanIds *self) {
    PyObject_GC_UnTrack(self);
    spanids_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *spanids_next(SpanIds *self) {
    if (self->seg == NULL) {
        return NULL;
    }
    return PyLong_FromSsize_t(self->seg->next_id++); /* atomic under the GIL, as count's is */
}

static PyTypeObject SpanIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SpanIds",
    .tp_basicsize = sizeof(SpanIds),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The span ids of a segment still to be drawn (next() gives the next one).",
    .tp_dealloc = (destructor)spanids_dealloc,
    .tp_traverse = (traverseproc)spanids_traverse,
    .tp_clear = (inquiry)spanids_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)spanids_next,
};

static PyObject *segcore_get_ids(SegmentCore *self, void *closure) {
    SpanIds *ids = PyObject_GC_New(SpanIds, &SpanIdsType);
    if (ids == NULL) {
        return NULL;
    }
    ids->seg = (SegmentCore *)Py_NewRef(self);
    PyObject_GC_Track(ids);
    return (PyObject *)ids;
}

static PyGetSetDef segcore_getset[] = {
    {"_ids", (getter)segcore_get_ids, NULL, "The span ids still to be drawn (id 0 is the first span's).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SegmentCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SegmentCore",
    .tp_basicsize = sizeof(SegmentCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and creation of a segment (see swmp.tracing.segment).",
    .tp_new = segcore_new,
    .tp_init = segcore_init,
    .tp_dealloc = (destructor)segcore_dealloc,
    .tp_traverse = (traverseproc)segcore_traverse,
    .tp_clear = (inquiry)segcore_clear,
    .tp_members = segcore_members,
    .tp_getset = segcore_getset,
    .tp_setattro = segcore_setattro,
};

/* -- the record -------------------------------------------------------------------------- */

/* rows(spans, skip_analysis): [[span_id, parent_id, start, end, op, peer, kind, layer,
 * component, is_error, skip_analysis, tags, logs, refs], ...], the SEGMENT record's spans. */
static PyObject *rows_of(PyObject *spans, PyObject *skip) {
    Py_ssize_t n = PyList_GET_SIZE(spans);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(spans, i);
        if (!PyObject_TypeCheck(item, &SpanCoreType)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "rows() takes spans of SpanCore");
            return NULL;
        }
        SpanCore *s = (SpanCore *)item;
        PyObject *row = PyList_New(14);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *fields[14] = {s->span_id, s->parent_id, s->start, s->end, s->op, s->peer, s->kind,
                                s->layer, s->component, s->is_error, skip, s->tags, s->logs, s->refs};
        for (int k = 0; k < 14; k++) {
            PyList_SET_ITEM(row, k, Py_NewRef(fields[k]));
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

static PyObject *rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rows(spans: list, skip_analysis)");
        return NULL;
    }
    return rows_of(args[0], args[1]);
}

/* -- emitting ---------------------------------------------------------------------------- */

/* set_emit(emit, identity, dumps, sink_namespace, stats, record_type): Segment.emit (the
 * Python method this replaces while a segment's class still has it) and what it uses. The
 * sink is read from swmp._sink's namespace (its ``_sink``, which set_sink() replaces): a
 * dict look-up where calling get_sink() was a Python frame per segment. */
static PyObject *e_emit = NULL, *e_identity = NULL, *e_dumps = NULL, *e_sink_ns = NULL, *e_stats = NULL,
                *e_rtype = NULL;
static PyObject *s_service, *s_instance, *s_write, *s_written, *s_dropped, *s_sink;

static PyObject *set_emit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[2]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "set_emit(emit, identity, dumps, sink_namespace: dict, stats, record_type)");
        return NULL;
    }
    Py_XSETREF(e_emit, Py_NewRef(args[0]));
    Py_XSETREF(e_identity, Py_NewRef(args[1]));
    Py_XSETREF(e_dumps, Py_NewRef(args[2]));
    Py_XSETREF(e_sink_ns, Py_NewRef(args[3]));
    Py_XSETREF(e_stats, Py_NewRef(args[4]));
    Py_XSETREF(e_rtype, Py_NewRef(args[5]));
    Py_RETURN_NONE;
}

/* set_direct_sink(write, pid_holder, pid_function): ``write`` is the sink method (the
 * agent's ProcessSink.write) whose every call, while ``sink._pid`` is this process's pid and
 * ``sink._writer`` is not None, is exactly ``sink._writer.write(rtype, payload)``; the pid is
 * ``pid_holder.pid`` (kept by the fork hooks) or, when the holder is None, ``pid_function()``:
 * swmp.lifecycle.current_pid, as write() itself reads it. emit_fast then calls the ring
 * writer itself, a Python frame (and its pid check's) less per segment; a sink of another
 * class, a subclass with its own write, or a sink in any other state goes through write(). */
static PyObject *d_write = NULL, *d_holder = NULL, *d_pid_fn = NULL, *s_sink_pid, *s_sink_writer;

static PyObject *set_direct_sink(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "set_direct_sink(write, pid_holder, pid_function)");
        return NULL;
    }
    Py_XSETREF(d_write, Py_NewRef(args[0]));
    Py_XSETREF(d_holder, Py_NewRef(args[1]));
    Py_XSETREF(d_pid_fn, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* The ring writer ``sink.write()`` would hand the record to, as a new reference; NULL (and
 * no error) when write() must decide: another class, another pid (a fork to notice, a first
 * claim), no ring (a master, a process without a slot), anything unexpected. */
static PyObject *direct_writer(PyObject *sink) {
    static swmp_AttrCache at_pid;
    if (d_write == NULL || _PyType_Lookup(Py_TYPE(sink), s_write) != d_write) {
        return NULL;
    }
    PyObject *bound = PyObject_GetAttr(sink, s_sink_pid);
    long long pid = bound == NULL ? -1 : PyLong_AsLongLong(bound); /* -1: not bound yet */
    Py_XDECREF(bound);
    int same = pid != -1 && pid == pid_of(d_holder, d_pid_fn, &at_pid);
    PyObject *writer = same ? PyObject_GetAttr(sink, s_sink_writer) : NULL;
    if (writer == Py_None) {
        Py_CLEAR(writer);
    }
    if (writer == NULL) {
        PyErr_Clear();
    }
    return writer;
}

/* ``stats.<name> += 1`` (``segments_written`` or ``segments_dropped``). For the tracing
 * core's Stats (a __slots__ class) the slot is updated where it lies, as the member
 * descriptor would, instead of two attribute look-ups on every emitted segment. */
static int count_stat(PyObject *name) {
    static swmp_AttrCache at_written, at_dropped;
    PyObject **slot = swmp_slot_ref(e_stats, name, name == s_written ? &at_written : &at_dropped);
    if (slot != NULL && *slot != NULL) {
        PyObject *nv = PyNumber_Add(*slot, one);
        if (nv == NULL) {
            return -1;
        }
        Py_SETREF(*slot, nv);
        return 0;
    }
    PyObject *v = PyObject_GetAttr(e_stats, name);
    PyObject *nv = v == NULL ? NULL : PyNumber_Add(v, one);
    int r = nv == NULL ? -1 : PyObject_SetAttr(e_stats, name, nv);
    Py_XDECREF(v);
    Py_XDECREF(nv);
    return r;
}

/* After its record is written (or given up) a segment lets go of its spans: it held them
 * in ``finished`` and ``first`` while each span holds its segment, a reference cycle per
 * traced request that only the garbage collector could free (its generation-0 passes were
 * ~5,000 instructions per request). The first span's name stays as ``ended_op`` for the
 * endpoint of late work that refers to this segment. Same as Segment._release in Python. */
static void release_spans(SegmentCore *seg) {
    PyObject *first = seg->first;
    if (first != Py_None) {
        PyObject *op = PyObject_TypeCheck(first, &SpanCoreType) ? Py_NewRef(((SpanCore *)first)->op)
                                                                : PyObject_GetAttr(first, s_op);
        if (op == NULL) {
            PyErr_Clear(); /* keeps the span: a cycle the collector frees, as before */
            return;
        }
        Py_SETREF(seg->ended_op, op);
        Py_SETREF(seg->first, Py_NewRef(Py_None));
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        PyErr_Clear();
        return;
    }
    Py_SETREF(seg->finished, fresh);
}

/* Segment.emit of a native segment, in C: the SEGMENT record (segment.py's to_record
 * layout), serialized, handed to the sink, counted. 1: done. 0: a step raised before
 * anything was written: the caller runs the Python emit, which does it again and counts and
 * logs the failure as it always has. -1: an error after the write (counting). */
/* The record's JSON written from the fields directly (json.c); NULL with no error set when
 * the writer declines (a value only orjson decides) or a span is not ours. */
#define ROW_WIDTH 14
#define STACK_SPANS 16

static PyObject *record_json(SegmentCore *seg, PyObject *service, PyObject *instance) {
    PyObject *spans = seg->finished;
    if (!PyList_Check(spans)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(spans);
    PyObject *stack[STACK_SPANS * ROW_WIDTH];
    PyObject **fields = n <= STACK_SPANS ? stack : PyMem_Malloc(sizeof(PyObject *) * ROW_WIDTH * (size_t)n);
    if (fields == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *out = NULL;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(spans, i);
        if (!PyObject_TypeCheck(item, &SpanCoreType)) {
            break;
        }
        SpanCore *s = (SpanCore *)item;
        /* Borrowed: the writer runs no Python code, so nothing can change under it. */
        PyObject *row[ROW_WIDTH] = {s->span_id, s->parent_id, s->start, s->end, s->op, s->peer, s->kind,
                                    s->layer, s->component, s->is_error, seg->skip_analysis, s->tags, s->logs,
                                    s->refs};
        memcpy(fields + i * ROW_WIDTH, row, sizeof row);
    }
    if (i == n) {
        PyObject *head[5] = {seg->trace_id, seg->segment_id, service, instance, seg->size_limited};
        out = swmp_json_record(head, 5, fields, n, ROW_WIDTH);
    }
    if (fields != stack) {
        PyMem_Free(fields);
    }
    return out;
}

/* The record built as lists and serialized by orjson (what the writer declined). */
static PyObject *record_orjson(SegmentCore *seg, PyObject *service, PyObject *instance) {
    PyObject *spans = rows_of(seg->finished, seg->skip_analysis);
    PyObject *rec = spans == NULL ? NULL : PyList_New(6);
    if (rec == NULL) {
        Py_XDECREF(spans);
        return NULL;
    }
    PyList_SET_ITEM(rec, 0, Py_NewRef(seg->trace_id));
    PyList_SET_ITEM(rec, 1, Py_NewRef(seg->segment_id));
    PyList_SET_ITEM(rec, 2, Py_NewRef(service));
    PyList_SET_ITEM(rec, 3, Py_NewRef(instance));
    PyList_SET_ITEM(rec, 4, Py_NewRef(seg->size_limited));
    PyList_SET_ITEM(rec, 5, spans);
    PyObject *payload = PyObject_CallOneArg(e_dumps, rec);
    Py_DECREF(rec);
    return payload;
}

static int emit_fast(SegmentCore *seg) {
    static swmp_AttrCache at_service, at_instance;
    PyObject *service = swmp_slot_attr(e_identity, s_service, &at_service);
    PyObject *instance = service == NULL ? NULL : swmp_slot_attr(e_identity, s_instance, &at_instance);
    PyObject *payload = NULL;
    if (instance != NULL) {
        payload = record_json(seg, service, instance);
        if (payload == NULL) {
            PyErr_Clear();
            payload = record_orjson(seg, service, instance);
        }
    }
    Py_XDECREF(service);
    Py_XDECREF(instance);
    PyObject *sink = payload == NULL ? NULL : Py_XNewRef(PyDict_GetItemWithError(e_sink_ns, s_sink));
    if (sink == NULL) {
        Py_XDECREF(payload);
        PyErr_Clear();
        return 0;
    }
    PyObject *res = NULL;
    PyObject *writer = direct_writer(sink);
    if (writer != NULL) {
        PyObject *call[3] = {writer, e_rtype, payload};
        res = PyObject_VectorcallMethod(s_write, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(writer);
        if (res == NULL) {
            PyErr_Clear(); /* refused before writing anything: write() decides, and counts */
        }
    }
    if (res == NULL) {
        PyObject *call[3] = {sink, e_rtype, payload};
        res = PyObject_VectorcallMethod(s_write, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(sink);
    Py_DECREF(payload);
    if (res == NULL) {
        PyErr_Clear(); /* a sink that raised wrote nothing (sinks never raise: see _sink.py) */
        return 0;
    }
    int ok = PyObject_IsTrue(res);
    Py_DECREF(res);
    release_spans(seg);
    if (ok < 0) {
        return -1;
    }
    return count_stat(ok ? s_written : s_dropped) < 0 ? -1 : 1;
}

/* seg.emit(): in C when the segment is ours and its class still has Segment.emit. */
static int emit_segment(PyObject *seg) {
    if (e_emit != NULL && PyObject_TypeCheck(seg, &SegmentCoreType) && _PyType_Lookup(Py_TYPE(seg), s_emit) == e_emit) {
        int r = emit_fast((SegmentCore *)seg);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
    }
    PyObject *res = PyObject_CallMethodNoArgs(seg, s_emit);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return 0;
}

/* A list attribute of the segment (borrowed checks, new reference). */
static PyObject *seg_list(PyObject *v, PyObject *name) {
    if (v != NULL && !PyList_Check(v)) {
        Py_DECREF(v);
        PyErr_Format(PyExc_TypeError, "segment.%U is not a list", name);
        return NULL;
    }
    return v;
}

static PyObject *exit_root(PyObject *const *args); /* with entry_root, below */

/* exit_child(op, peer, component, layer): the common cases of context.new_exit_span: a
 * child exit span of the current open span (not itself an exit span) whose segment is
 * still open and under the span limit, or, with no span current at all, the first span of
 * a new segment (exit_root). None in every other case: the caller then takes the general
 * path, which decides those (and counts what it must). */
static PyObject *exit_child(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "exit_child(op, peer, component, layer)");
        return NULL;
    }
    if (span_class == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *cur = get_current();
    if (cur == NULL) {
        return NULL;
    }
    if (cur == Py_None) {
        Py_DECREF(cur);
        return exit_root(args);
    }
    if (Py_TYPE(cur) != span_class) {
        Py_DECREF(cur);
        Py_RETURN_NONE;
    }
    SpanCore *parent = (SpanCore *)cur;
    int r = PyObject_IsTrue(parent->end);
    if (r == 0) {
        r = PyObject_RichCompareBool(parent->kind, exit_kind, Py_EQ);
    }
    if (r != 0) {
        Py_DECREF(cur);
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg = parent->segment;
    PyObject *token = seg_list(SEG_FIELD(seg, token, s_token), s_token);
    if (token == NULL) {
        Py_DECREF(cur);
        return NULL;
    }
    Py_ssize_t alive = PyList_GET_SIZE(token);
    Py_DECREF(token);
    if (!alive) {
        Py_DECREF(cur);
        Py_RETURN_NONE;
    }
    PyObject *n;
    if (PyObject_TypeCheck(seg, &SegmentCoreType)) {
        n = PyLong_FromSsize_t(((SegmentCore *)seg)->next_id++);
    } else {
        PyObject *ids = PyObject_GetAttr(seg, s_ids);
        n = ids == NULL ? NULL : PyIter_Next(ids);
        Py_XDECREF(ids);
    }
    static swmp_AttrCache at_span_limit;
    PyObject *limit = n == NULL ? NULL : swmp_slot_attr(limits, s_span_limit, &at_span_limit);
    r = limit == NULL ? -1 : PyObject_RichCompareBool(n, limit, Py_LT);
    Py_XDECREF(limit);
    if (r <= 0) {
        /* Over the limit (the general path counts it) or an error (none expected: raised). */
        Py_XDECREF(n);
        Py_DECREF(cur);
        if (r < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError, "segment span ids exhausted");
            }
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *open = seg_list(SEG_FIELD(seg, open, s_open), s_open);
    r = open == NULL ? -1 : PyList_Append(open, Py_None);
    if (r < 0) {
        Py_XDECREF(open);
        Py_DECREF(n);
        Py_DECREF(cur);
        return NULL;
    }
    PyObject *span = make_span(span_class, seg, n, parent->span_id, args[0], exit_kind, args[3], args[2], args[1]);
    if (span == NULL) {
        /* No span will finish and give the token back: left there, it would keep the segment
         * open (never emitted) for good. The tokens are all None: one off the end is ours. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_ssize_t k = PyList_GET_SIZE(open);
        if (k > 0 && PyList_SetSlice(open, k - 1, k, NULL) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(open);
    Py_DECREF(cur);
    return span;
}

/* new_exit_span(op, peer, component, layer, carrier=None): context.new_exit_span with its
 * common cases (exit_child's) taken here, without the Python frame every client call,
 * query and publish paid for them; with exactly four positional arguments the rest is
 * decide_exit_span's (Python: the cases exit_child declined), any other call goes to the
 * Python new_exit_span as it came (keywords, defaults, a carrier). */
static PyObject *py_new_exit_span = NULL, *py_decide_exit_span = NULL;

static PyObject *setup_new_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_new_exit(new_exit_span, decide_exit_span)");
        return NULL;
    }
    Py_XSETREF(py_new_exit_span, Py_NewRef(args[0]));
    Py_XSETREF(py_decide_exit_span, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *new_exit_span(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (py_new_exit_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_new_exit() was not called");
        return NULL;
    }
    if (nargs != 4 || kwnames != NULL) {
        return PyObject_Vectorcall(py_new_exit_span, args, (size_t)nargs, kwnames);
    }
    PyObject *span = exit_child(module, args, 4);
    if (span != Py_None) {
        return span; /* a span, or NULL with the error exit_child raised */
    }
    Py_DECREF(span);
    PyObject *call[5] = {args[0], args[1], args[2], args[3], Py_None};
    return PyObject_Vectorcall(py_decide_exit_span, call, 5, NULL);
}

/* ``limits.tag_value_max`` (swmp.tracing.limits' Limits: what every tag value is cut to),
 * read on each call (configure() replaces it): the value, or -1 with an error set. */
Py_ssize_t swmp_tag_limit(PyObject *limits) {
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("tag_value_max")) == NULL) {
        return -1;
    }
    static swmp_AttrCache at_tag_max;
    PyObject *v = swmp_slot_attr(limits, name, &at_tag_max);
    if (v == NULL) {
        return -1;
    }
    Py_ssize_t lim = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return lim;
}

/* The error set now handed to ``logger(*args)`` as the exception being handled (what
 * ``except Exception: warn_once(...)`` logs with its traceback), then cleared, as the
 * handled exception before it is put back. A logger that fails is ignored: the host's work
 * goes on all the same. */
void swmp_report_handled(PyObject *logger, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *old_type, *old_value, *old_tb;
    PyErr_GetExcInfo(&old_type, &old_value, &old_tb);
    PyErr_SetExcInfo(type, value, tb); /* steals */
    PyObject *r = PyObject_Vectorcall(logger, args, (size_t)nargs, NULL);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
    PyErr_SetExcInfo(old_type, old_value, old_tb); /* steals */
}

PyObject *swmp_optional_attr(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    return value;
}

PyObject *swmp_new_exit(PyObject *const *args) {
    return new_exit_span(NULL, args, 4, NULL);
}

PyObject *swmp_call_with_two(PyObject *callable, PyObject *first, PyObject *second, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject **call = PyMem_Malloc((size_t)(total + 2) * sizeof(PyObject *));
    if (call == NULL) {
        return PyErr_NoMemory();
    }
    call[0] = first;
    call[1] = second;
    if (total > 0) {
        memcpy(call + 2, args, (size_t)total * sizeof(PyObject *));
    }
    PyObject *result = PyObject_Vectorcall(callable, call, (size_t)(nargs + 2), kwnames);
    PyMem_Free(call);
    return result;
}

PyObject *swmp_span_leave(PyObject *span, PyObject *result) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(value, tb);
        }
    }
    int r;
    if (Py_TYPE(span) == span_class) {
        r = swmp_span_exit(span, value);
    } else {
        PyObject *call[4] = {span, type != NULL ? type : Py_None, value != NULL ? value : Py_None,
                             tb != NULL ? tb : Py_None};
        PyObject *done = PyObject_VectorcallMethod(s_exit_method, call, 4, NULL);
        r = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    if (r < 0) {
        PyErr_Clear();
    }
    if (result == NULL) {
        PyErr_Restore(type, value, tb);
    }
    return result;
}

/* entry_root(op, component, layer, carrier): the common case of context.new_entry_span, in
 * C: no span current, so a new segment whose first span is an entry span, in a new trace
 * or, with ``carrier`` (a ContextCarrier: the caller's decoded headers), in the caller's
 * with its cross-process reference; None when the ignore rules' cached decision, the
 * sampler (for a new trace), a caller's "not sampled" or a profiling board asks for more,
 * and the Python path decides, counts and fills the cache as it always has. Saves the
 * Python frames of _start_trace, the ignore check and the reference on every request. */
static PyTypeObject *segment_class = NULL;
static PyObject *entry_kind = NULL, *policy = NULL, *rules_type = NULL, *profile_gate = NULL, *carrier_type = NULL,
                *cross_process_ref = NULL, *zero = NULL, *minus_one = NULL, *s_rules = NULL, *s_sampling = NULL,
                *s_cache = NULL, *s_board = NULL, *s_sampled = NULL, *s_correlation = NULL, *s_skip_analysis = NULL,
                *s_trace_id = NULL;

/* The truth of ``obj.name``: 1, 0, or -1 with an error. */
static int attr_true(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyObject *v = swmp_slot_attr(obj, name, cache);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1: the rules and settings let this segment start here with no more checks; 0: ask Python. */
static int plain_start(PyObject *op, int new_trace) {
    if (new_trace) {
        static swmp_AttrCache at_sampling;
        int on = attr_true(policy, s_sampling, &at_sampling);
        if (on != 0) {
            return on < 0 ? -1 : 0;
        }
    }
    static swmp_AttrCache at_board, at_rules, at_cache;
    PyObject *board = swmp_slot_attr(profile_gate, s_board, &at_board);
    if (board == NULL) {
        return -1;
    }
    int attached = board != Py_None;
    Py_DECREF(board);
    if (attached) {
        return 0;
    }
    PyObject *rules = swmp_slot_attr(policy, s_rules, &at_rules);
    if (rules == NULL) {
        return -1;
    }
    if ((PyObject *)Py_TYPE(rules) != rules_type) {
        Py_DECREF(rules);
        return 0;
    }
    PyObject *cache = swmp_slot_attr(rules, s_cache, &at_cache);
    Py_DECREF(rules);
    if (cache == NULL) {
        return -1;
    }
    PyObject *decision = PyDict_Check(cache) ? PyDict_GetItemWithError(cache, op) : NULL; /* borrowed */
    int plain = decision == Py_False;
    Py_DECREF(cache);
    if (decision == NULL && PyErr_Occurred()) {
        return -1;
    }
    return plain;
}

static PyObject *caller_ref(PyObject *carrier); /* with the carrier's fields, below */

/* The caller's segment as the span's one reference, in segment.cross_process_ref's layout. */
static int add_caller_ref(SpanCore *span, PyObject *carrier) {
    PyObject *ref = caller_ref(carrier);
    PyObject *refs = ref == NULL ? NULL : PyList_New(1);
    if (refs == NULL) {
        Py_XDECREF(ref);
        return -1;
    }
    PyList_SET_ITEM(refs, 0, ref);
    Py_SETREF(span->refs, refs);
    return 0;
}

/* The caller's trace id, correlation and skip-analysis flag on a new segment. */
static int join_caller(SegmentCore *seg, PyObject *carrier) {
    static swmp_AttrCache at_correlation, at_skip;
    PyObject *corr = swmp_slot_attr(carrier, s_correlation, &at_correlation);
    if (corr == NULL) {
        return -1;
    }
    int has = PyObject_IsTrue(corr);
    if (has > 0) {
        Py_SETREF(seg->correlation, corr);
    } else {
        Py_DECREF(corr);
    }
    int skip = has < 0 ? -1 : attr_true(carrier, s_skip_analysis, &at_skip);
    if (skip > 0) {
        Py_SETREF(seg->skip_analysis, Py_NewRef(Py_True));
    }
    return skip < 0 ? -1 : 0;
}

static PyObject *entry_root(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "entry_root(op, component, layer, carrier)");
        return NULL;
    }
    PyObject *carrier = args[3];
    if (segment_class == NULL || span_class == NULL || !PyUnicode_CheckExact(args[0]) ||
        (carrier != Py_None && (PyObject *)Py_TYPE(carrier) != carrier_type)) {
        Py_RETURN_NONE;
    }
    PyObject *cur = get_current();
    if (cur == NULL) {
        return NULL;
    }
    int outside = cur == Py_None;
    Py_DECREF(cur);
    if (!outside) {
        Py_RETURN_NONE;
    }
    int r = plain_start(args[0], carrier == Py_None);
    if (r > 0 && carrier != Py_None) {
        static swmp_AttrCache at_sampled;
        r = attr_true(carrier, s_sampled, &at_sampled); /* not sampled: Python counts it */
    }
    if (r <= 0) {
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg;
    if (carrier == Py_None) {
        seg = PyObject_CallNoArgs((PyObject *)segment_class);
    } else {
        static swmp_AttrCache at_trace_id;
        PyObject *trace_id = swmp_slot_attr(carrier, s_trace_id, &at_trace_id);
        seg = trace_id == NULL ? NULL : PyObject_CallOneArg((PyObject *)segment_class, trace_id);
        Py_XDECREF(trace_id);
        if (seg != NULL && join_caller((SegmentCore *)seg, carrier) < 0) {
            Py_CLEAR(seg);
        }
    }
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        make_span(span_class, seg, Py_NewRef(zero), minus_one, args[0], entry_kind, args[2], args[1], empty_op);
    if (span != NULL && carrier != Py_None && add_caller_ref((SpanCore *)span, carrier) < 0) {
        Py_CLEAR(span);
    }
    if (span != NULL) {
        Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    }
    Py_DECREF(seg);
    return span;
}

PyObject *swmp_entry_root(PyObject *const *args) {
    return entry_root(NULL, args, 4);
}

/* name_request(template): swmp/instrument/_route.py's ``name_request`` when the request's
 * entry span is the current span (what every route hook finds: the framework routes
 * before the view opens spans of its own), Span.set_operation's steps done here; any other
 * case by the Python function (``setup_route``). Why: the rename ran ~75 bytecodes in
 * three Python frames on every routed request of every framework. */
static PyObject *py_name_request = NULL, *s_by_endpoint = NULL, *s_consider = NULL;

static PyObject *setup_route(PyObject *module, PyObject *fallback) {
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "setup_route(name_request: callable)");
        return NULL;
    }
    if (s_consider == NULL && ((s_by_endpoint = PyUnicode_InternFromString("by_endpoint")) == NULL ||
                                  (s_consider = PyUnicode_InternFromString("consider")) == NULL)) {
        return NULL;
    }
    Py_XSETREF(py_name_request, Py_NewRef(fallback));
    Py_RETURN_NONE;
}

/* 1 when ``cur`` is an open entry span of ours in a native segment, 0 when not, -1 on error. */
static int open_native_entry(PyObject *cur) {
    if (span_class == NULL || entry_kind == NULL || Py_TYPE(cur) != span_class) {
        return 0;
    }
    SpanCore *span = (SpanCore *)cur;
    if (!PyObject_TypeCheck(span->segment, &SegmentCoreType)) {
        return 0;
    }
    int entry = PyObject_RichCompareBool(span->kind, entry_kind, Py_EQ);
    if (entry <= 0) {
        return entry;
    }
    int ended = PyObject_IsTrue(span->end);
    return ended < 0 ? -1 : !ended;
}

static PyObject *name_request(PyObject *module, PyObject *template) {
    if (py_name_request == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_route() was not called");
        return NULL;
    }
    if (!PyUnicode_CheckExact(template) || PyUnicode_GET_LENGTH(template) == 0 || profile_gate == NULL) {
        return PyObject_CallOneArg(py_name_request, template);
    }
    PyObject *cur = get_current();
    if (cur == NULL) {
        return NULL;
    }
    int plain = open_native_entry(cur);
    if (plain <= 0) {
        Py_DECREF(cur);
        return plain < 0 ? NULL : PyObject_CallOneArg(py_name_request, template);
    }
    /* Span.set_operation: the new name; the segment's cached sw8 fields, whose endpoint is
     * its first span's name; a profiling task that waits for this endpoint. */
    SpanCore *span = (SpanCore *)cur;
    SegmentCore *seg = (SegmentCore *)span->segment;
    Py_SETREF(span->op, Py_NewRef(template));
    if (seg->encoded != Py_None && seg->first == cur) {
        Py_SETREF(seg->encoded, Py_NewRef(Py_None));
    }
    int first = PyObject_RichCompareBool(span->span_id, zero, Py_EQ);
    PyObject *board = first > 0 ? PyObject_GetAttr(profile_gate, s_by_endpoint) : NULL;
    int waiting = board == NULL ? (first < 0 || PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(board);
    Py_XDECREF(board);
    PyObject *done = waiting > 0 ? PyObject_CallMethodOneArg(profile_gate, s_consider, cur) : NULL;
    Py_DECREF(cur);
    if (waiting < 0 || (waiting > 0 && done == NULL)) {
        return NULL;
    }
    Py_XDECREF(done);
    Py_RETURN_NONE;
}

/* As the Python function's callers expect: never raises into the framework's routing. */
static PyObject *name_request_guarded(PyObject *module, PyObject *template) {
    PyObject *r = name_request(module, template);
    if (r == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return r;
}

/* exit_child's other common case, a span in no trace yet (a client call, a query or a
 * message sent outside any request: a worker's loop, a script, a scheduled job): a new
 * segment in a new trace whose first span is this exit span, what context._start_trace
 * makes; None when the ignore rules' cached decision, the sampler or a profiling board asks
 * for more, as for entry_root. ``args``: exit_child's (op, peer, component, layer). */
static PyObject *exit_root(PyObject *const *args) {
    if (segment_class == NULL || !PyUnicode_CheckExact(args[0])) {
        Py_RETURN_NONE;
    }
    int r = plain_start(args[0], 1);
    if (r <= 0) {
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg = PyObject_CallNoArgs((PyObject *)segment_class);
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        make_span(span_class, seg, Py_NewRef(zero), minus_one, args[0], exit_kind, args[3], args[2], args[1]);
    if (span != NULL) {
        Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    }
    Py_DECREF(seg);
    return span;
}

/* The last text encoded and its base64, for the peer and for the endpoint: a client calls
 * the same few peers over and over (often with the very same string object, e.g. a cached
 * broker address), and a process's segments start at the same few endpoints. */
typedef struct {
    PyObject *text, *b64;
} B64Memo;

static B64Memo last_peer, last_endpoint;

static PyObject *memo_b64(B64Memo *memo, PyObject *text) {
    PyObject *last = memo->text;
    if (last != NULL && (text == last || (PyUnicode_IS_COMPACT_ASCII(text) && PyUnicode_IS_COMPACT_ASCII(last) &&
                                          PyUnicode_GET_LENGTH(text) == PyUnicode_GET_LENGTH(last) &&
                                          memcmp(PyUnicode_1BYTE_DATA(text), PyUnicode_1BYTE_DATA(last),
                                                 (size_t)PyUnicode_GET_LENGTH(text)) == 0))) {
        return Py_NewRef(memo->b64);
    }
    PyObject *out = swmp_b64_text(text);
    if (out != NULL) {
        Py_XSETREF(memo->text, Py_NewRef(text));
        Py_XSETREF(memo->b64, Py_NewRef(out));
    }
    return out;
}

static PyObject *peer_b64(PyObject *peer) {
    return memo_b64(&last_peer, peer);
}

/* A segment's base64 trace id, segment id and endpoint (Segment.encode_ids: computed once,
 * kept in ``encoded``); NULL with no error set when the Python path must do it. */
static PyObject *encoded_ids(SegmentCore *seg) {
    PyObject *enc = seg->encoded;
    if (PyTuple_CheckExact(enc) && PyTuple_GET_SIZE(enc) == 3) {
        return Py_NewRef(enc);
    }
    PyObject *first = seg->first;
    PyObject *op = first == Py_None ? Py_NewRef(seg->ended_op)
                   : PyObject_TypeCheck(first, &SpanCoreType) ? Py_NewRef(((SpanCore *)first)->op)
                                                               : NULL;
    if (op == NULL || !PyUnicode_CheckExact(op) || !PyUnicode_CheckExact(seg->trace_id) ||
        !PyUnicode_CheckExact(seg->segment_id)) {
        Py_XDECREF(op);
        return NULL;
    }
    PyObject *sid = swmp_b64_text(seg->segment_id);
    PyObject *tid = sid == NULL                           ? NULL
                    : seg->trace_id == seg->segment_id    ? Py_NewRef(sid)
                                                          : swmp_b64_text(seg->trace_id);
    PyObject *ep = tid == NULL ? NULL : PyUnicode_GET_LENGTH(op) ? memo_b64(&last_endpoint, op) : Py_NewRef(empty_op);
    Py_DECREF(op);
    if (ep == NULL) {
        Py_XDECREF(sid);
        Py_XDECREF(tid);
        return NULL;
    }
    enc = PyTuple_Pack(3, tid, sid, ep);
    Py_DECREF(tid);
    Py_DECREF(sid);
    Py_DECREF(ep);
    if (enc != NULL) {
        Py_SETREF(seg->encoded, Py_NewRef(enc));
    }
    return enc;
}

/* The ``sw8`` value of ``span`` (a new reference), or NULL: with an error set, or without one
 * when the Python path must build it (a pure-Python segment, text it encodes its own way). */
static PyObject *build_sw8(PyObject *obj, PyObject *service_b64, PyObject *instance_b64) {
    if (!PyObject_TypeCheck(obj, &SpanCoreType)) {
        return NULL;
    }
    SpanCore *span = (SpanCore *)obj;
    if (span->segment == NULL || span->span_id == NULL || span->peer == NULL || /* deleted fields */
        !PyObject_TypeCheck(span->segment, &SegmentCoreType) || !PyLong_CheckExact(span->span_id) ||
        !PyUnicode_CheckExact(span->peer)) {
        return NULL;
    }
    int overflow = 0;
    long long span_id = PyLong_AsLongLongAndOverflow(span->span_id, &overflow);
    if (overflow || (span_id == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *enc = encoded_ids((SegmentCore *)span->segment);
    if (enc == NULL) {
        return NULL;
    }
    PyObject *peer = peer_b64(span->peer);
    PyObject *out = peer == NULL ? NULL
                                 : swmp_sw8_join(PyTuple_GET_ITEM(enc, 0), PyTuple_GET_ITEM(enc, 1), span_id,
                                                 service_b64, instance_b64, PyTuple_GET_ITEM(enc, 2), peer);
    Py_DECREF(enc);
    Py_XDECREF(peer);
    return out;
}

/* sw8_header(span, service_b64, instance_b64): the ``sw8`` value Span.inject sends, in C;
 * None (the Python path builds it) for a pure-Python segment or text it encodes its own
 * way. tests/test_propagation.py compares the two. */
static PyObject *sw8_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sw8_header(span, service_b64, instance_b64)");
        return NULL;
    }
    PyObject *out = build_sw8(args[0], args[1], args[2]);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

/* span.inject(): ``{"sw8": ...}`` built here for a native segment without correlation
 * data or skip_analysis (the common case); anything else goes to the Python reference
 * (setup_inject's fallback), which does what it always did. Why: the Python method, its
 * look-ups and its dict were ~40% of what propagating an exit span added (a Celery
 * publish, an HTTP or gRPC client call, a produced message). */
static PyObject *inject_fallback = NULL, *s_sw8 = NULL, *s_service_b64 = NULL, *s_instance_b64 = NULL;

static PyObject *setup_inject(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_inject(fallback: callable)");
        return NULL;
    }
    Py_XSETREF(inject_fallback, Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

/* The ``sw8`` value inject() puts in its dict, built here for a native segment without
 * correlation data or skip_analysis (a new reference); NULL with no error set for anything
 * else (the caller goes to inject(), whose fallback decides), NULL with an error set on
 * failure. */
static PyObject *plain_sw8(PyObject *span) {
    PyObject *seg = ((SpanCore *)span)->segment;
    PyObject *corr = seg != NULL && PyObject_TypeCheck(seg, &SegmentCoreType) ? ((SegmentCore *)seg)->correlation : NULL;
    if (seg_identity == NULL || corr == NULL || ((SegmentCore *)seg)->skip_analysis != Py_False ||
        !(corr == no_correlation || (PyDict_CheckExact(corr) && PyDict_GET_SIZE(corr) == 0))) {
        return NULL;
    }
    static swmp_AttrCache at_service_b64, at_instance_b64;
    PyObject *service = swmp_slot_attr(seg_identity, s_service_b64, &at_service_b64);
    PyObject *instance = service == NULL ? NULL : swmp_slot_attr(seg_identity, s_instance_b64, &at_instance_b64);
    /* Texts swmp_sw8_join cannot copy (not ASCII str) make build_sw8 decline: Python's. */
    PyObject *sw8 = instance == NULL ? NULL : build_sw8(span, service, instance);
    Py_XDECREF(service);
    Py_XDECREF(instance);
    return sw8;
}

PyObject *swmp_span_sw8(PyObject *span) {
    if (inject_fallback == NULL || !PyObject_TypeCheck(span, &SpanCoreType)) {
        return NULL;
    }
    return plain_sw8(span);
}

static PyObject *spancore_inject(SpanCore *self, PyObject *unused) {
    if (inject_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_inject() was not called");
        return NULL;
    }
    PyObject *sw8 = plain_sw8((PyObject *)self);
    if (sw8 != NULL) {
        PyObject *headers = PyDict_New();
        if (headers != NULL && PyDict_SetItem(headers, s_sw8, sw8) < 0) {
            Py_CLEAR(headers);
        }
        Py_DECREF(sw8);
        return headers;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyObject_CallOneArg(inject_fallback, (PyObject *)self);
}

/* -- the incoming carrier -------------------------------------------------------------------
 * decode_carrier(value): decode_sw8's common case whole, a plain header (split as split_sw8
 * does) from a caller whose four fields ``callers`` (swmp.propagation's cache of them)
 * already holds, as a ContextCarrier filled here the way its __init__ fills it (no
 * correlation, no skip_analysis); None for anything else, and decode_sw8 goes its own way.
 * Why: the carrier's Python __init__ (ten slot stores) and decode_sw8's frame were ~5,000
 * instructions of every consumed message, task run and request with a caller, twice what
 * the split costs. The slots are written at the offsets their descriptors give. */
enum {
    CF_TRACE_ID,
    CF_SEGMENT_ID,
    CF_SPAN_ID,
    CF_SERVICE,
    CF_INSTANCE,
    CF_ENDPOINT,
    CF_ADDRESS,
    CF_SAMPLED,
    CF_CORRELATION,
    CF_SKIP_ANALYSIS,
    CF_COUNT
};
static const char *const carrier_field_names[CF_COUNT] = {
    "trace_id", "segment_id", "span_id", "service", "instance", "endpoint", "address", "sampled", "correlation",
    "skip_analysis"};
static Py_ssize_t carrier_offsets[CF_COUNT];
static PyTypeObject *carrier_class = NULL;
static PyObject *known_callers = NULL;

static PyObject *setup_carrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_carrier(carrier_class: type, callers: dict)");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    Py_ssize_t offsets[CF_COUNT];
    for (int i = 0; i < CF_COUNT; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, carrier_field_names[i]);
        if (d == NULL) {
            return NULL;
        }
        int slot = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (slot) {
            offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        }
        Py_DECREF(d);
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "setup_carrier(): %s is not a __slots__ field", carrier_field_names[i]);
            return NULL;
        }
    }
    memcpy(carrier_offsets, offsets, sizeof(offsets));
    Py_XSETREF(carrier_class, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(known_callers, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* segment.cross_process_ref(carrier), the list of the kind and the caller's seven fields,
 * read from the carrier's slots: the Python function was a frame on every request, task
 * run or message that continues a caller. The kind (the list's first item) is the one the
 * Python function gave on its first call, which also covers anything unusual (another
 * carrier class, a slot never set). */
static PyObject *ref_kind = NULL;

static PyObject *caller_ref(PyObject *carrier) {
    if (ref_kind != NULL && carrier_class != NULL && Py_TYPE(carrier) == carrier_class) {
        PyObject *ref = PyList_New(1 + CF_ADDRESS + 1);
        if (ref == NULL) {
            return NULL;
        }
        PyList_SET_ITEM(ref, 0, Py_NewRef(ref_kind));
        int i = CF_TRACE_ID;
        for (; i <= CF_ADDRESS; i++) {
            PyObject *v = *(PyObject **)((char *)carrier + carrier_offsets[i]);
            if (v == NULL) {
                break;
            }
            PyList_SET_ITEM(ref, 1 + i, Py_NewRef(v));
        }
        if (i > CF_ADDRESS) {
            return ref;
        }
        Py_DECREF(ref); /* an unset slot: Python raises for it as it always did */
    }
    PyObject *ref = PyObject_CallOneArg(cross_process_ref, carrier);
    if (ref != NULL && ref_kind == NULL && PyList_CheckExact(ref) && PyList_GET_SIZE(ref) == 1 + CF_ADDRESS + 1) {
        ref_kind = Py_NewRef(PyList_GET_ITEM(ref, 0));
    }
    return ref;
}

/* The caller's four fields (a new reference to the cached tuple) for the tail of ``value``
 * from ``tail_at``, or NULL (an error set, or none: decode_sw8 decides). The last tail
 * and its fields are remembered: a consumer or server hears from the same few callers, and
 * comparing the bytes spares the tail's copy, its hash and the look-up. */
static PyObject *last_tail = NULL, *last_caller = NULL;

static PyObject *last_caller_fields(PyObject *value, Py_ssize_t tail_at) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(value) - tail_at;
    const Py_UCS1 *tail_bytes = PyUnicode_1BYTE_DATA(value) + tail_at;
    if (last_tail != NULL && PyUnicode_GET_LENGTH(last_tail) == n &&
        memcmp(PyUnicode_1BYTE_DATA(last_tail), tail_bytes, (size_t)n) == 0) {
        return Py_NewRef(last_caller);
    }
    PyObject *tail = PyUnicode_Substring(value, tail_at, PyUnicode_GET_LENGTH(value));
    if (tail == NULL) {
        return NULL;
    }
    PyObject *caller = PyDict_GetItemWithError(known_callers, tail); /* borrowed */
    if (caller == NULL || !PyTuple_CheckExact(caller) || PyTuple_GET_SIZE(caller) != 4) {
        Py_DECREF(tail);
        return NULL;
    }
    Py_XSETREF(last_tail, tail); /* compact ASCII, as a substring of ASCII text */
    Py_XSETREF(last_caller, Py_NewRef(caller));
    return Py_NewRef(caller);
}

int swmp_sw8_read(PyObject *value, SwmpSw8 *out) {
    if (carrier_class == NULL) {
        return 0;
    }
    Py_ssize_t tail_at;
    if (!swmp_sw8_parts(value, &out->sampled, &out->trace_id, &out->segment_id, &out->span_id, &tail_at)) {
        return 0;
    }
    out->caller = last_caller_fields(value, tail_at);
    if (out->caller == NULL) {
        Py_CLEAR(out->trace_id);
        Py_CLEAR(out->segment_id);
        return PyErr_Occurred() ? -1 : 0; /* not seen yet, or a bad caller: decode_sw8 decides */
    }
    return 1;
}

void swmp_sw8_clear(SwmpSw8 *p) {
    Py_CLEAR(p->trace_id);
    Py_CLEAR(p->segment_id);
    Py_CLEAR(p->caller);
}

PyObject *swmp_sw8_carrier(const SwmpSw8 *p) {
    PyObject *span = PyLong_FromLongLong(p->span_id);
    PyObject *correlation = span == NULL ? NULL : PyDict_New();
    PyObject *obj = correlation == NULL ? NULL : carrier_class->tp_alloc(carrier_class, 0);
    if (obj == NULL) {
        Py_XDECREF(span);
        Py_XDECREF(correlation);
        return NULL;
    }
    PyObject *fields[CF_COUNT] = {
        Py_NewRef(p->trace_id),
        Py_NewRef(p->segment_id),
        span,
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 0)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 1)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 2)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 3)),
        Py_NewRef(p->sampled ? Py_True : Py_False),
        correlation,
        Py_NewRef(Py_False),
    };
    for (int i = 0; i < CF_COUNT; i++) { /* the references move into the new object's slots */
        *(PyObject **)((char *)obj + carrier_offsets[i]) = fields[i];
    }
    return obj;
}

static PyObject *decode_carrier(PyObject *module, PyObject *value) {
    SwmpSw8 p;
    int r = swmp_sw8_read(value, &p);
    if (r <= 0) {
        return r < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *carrier = swmp_sw8_carrier(&p);
    swmp_sw8_clear(&p);
    return carrier;
}

/* entry_root(op, component, layer, decode_carrier(value)) for a value swmp_sw8_read took,
 * without the carrier: its steps in their order and with the same objects (the segment made
 * with the caller's trace id, which its reference shares; a carrier of decode_carrier's
 * has no correlation and no skip-analysis flag, so join_caller would set nothing), and the
 * reference as caller_ref lists it. Why: the carrier's allocation, its ten slots, its empty
 * correlation dict, the four slot reads entry_root made of it and its release were ~1,000
 * instructions of every consumed message with a caller. None (nothing changed) wherever
 * entry_root would answer None or ask Python, and also before caller_ref's first call (the
 * reference's kind is not known yet) and for a carrier class other than entry_root's: the
 * caller then makes the carrier (swmp_sw8_carrier) and goes entry_root's way. */
PyObject *swmp_entry_sw8(PyObject *const *args, const SwmpSw8 *p) {
    PyObject *op = args[0];
    if (segment_class == NULL || span_class == NULL || ref_kind == NULL || carrier_type != (PyObject *)carrier_class ||
        !PyUnicode_CheckExact(op)) {
        Py_RETURN_NONE;
    }
    PyObject *cur = get_current();
    if (cur == NULL) {
        return NULL;
    }
    int outside = cur == Py_None;
    Py_DECREF(cur);
    if (!outside) {
        Py_RETURN_NONE;
    }
    int r = plain_start(op, 0);
    if (r > 0 && !p->sampled) {
        r = 0; /* not sampled: Python counts it */
    }
    if (r <= 0) {
        return r < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *seg = PyObject_CallOneArg((PyObject *)segment_class, p->trace_id);
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        make_span(span_class, seg, Py_NewRef(zero), minus_one, op, entry_kind, args[2], args[1], empty_op);
    PyObject *span_id = span == NULL ? NULL : PyLong_FromLongLong(p->span_id);
    PyObject *ref = span_id == NULL ? NULL : PyList_New(1 + CF_ADDRESS + 1);
    PyObject *refs = ref == NULL ? NULL : PyList_New(1);
    if (refs == NULL) {
        Py_XDECREF(ref);
        Py_XDECREF(span_id);
        Py_XDECREF(span);
        Py_DECREF(seg);
        return NULL;
    }
    PyObject *items[1 + CF_ADDRESS + 1] = {ref_kind,
                                           p->trace_id,
                                           p->segment_id,
                                           NULL, /* span_id, whose reference moves in */
                                           PyTuple_GET_ITEM(p->caller, 0),
                                           PyTuple_GET_ITEM(p->caller, 1),
                                           PyTuple_GET_ITEM(p->caller, 2),
                                           PyTuple_GET_ITEM(p->caller, 3)};
    for (int i = 0; i < 1 + CF_ADDRESS + 1; i++) {
        PyList_SET_ITEM(ref, i, items[i] == NULL ? span_id : Py_NewRef(items[i]));
    }
    PyList_SET_ITEM(refs, 0, ref);
    Py_SETREF(((SpanCore *)span)->refs, refs);
    Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    Py_DECREF(seg);
    return span;
}

/* setup_entry(segment_class, entry_kind, policy, rules_type, profile_gate, carrier_type,
 * cross_process_ref): what entry_root() needs (context.policy, whose rules and sampling
 * configure() replaces, and the profiling gate, whose board is attached and detached at run
 * time, are read on every call). */
static PyObject *setup_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &SegmentCoreType) ||
        !PyType_Check(args[3]) || !PyType_Check(args[5]) || !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_entry(segment_class: type[SegmentCore], entry_kind, policy, rules_type: type, "
                        "profile_gate, carrier_type: type, cross_process_ref: callable)");
        return NULL;
    }
    Py_XSETREF(segment_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(entry_kind, Py_NewRef(args[1]));
    Py_XSETREF(policy, Py_NewRef(args[2]));
    Py_XSETREF(rules_type, Py_NewRef(args[3]));
    Py_XSETREF(profile_gate, Py_NewRef(args[4]));
    Py_XSETREF(carrier_type, Py_NewRef(args[5]));
    Py_XSETREF(cross_process_ref, Py_NewRef(args[6]));
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "setup(current_span: ContextVar, empty: tuple, count_lost: callable)");
        return NULL;
    }
    if (!PyContextVar_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup(): current_span must be a ContextVar");
        return NULL;
    }
    Py_XSETREF(current_var, Py_NewRef(args[0]));
    Py_XSETREF(empty, Py_NewRef(args[1]));
    Py_XSETREF(count_lost, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyObject *setup_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &SpanCoreType)) {
        PyErr_SetString(PyExc_TypeError, "setup_exit(span_class: type[SpanCore], exit_kind: int, limits)");
        return NULL;
    }
    Py_XSETREF(span_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(exit_kind, Py_NewRef(args[1]));
    Py_XSETREF(limits, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyObject *json_dumps(PyObject *module, PyObject *value) {
    PyObject *out = swmp_json_dump(value);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(current_span, empty, count_lost): what the spans share with swmp.tracing.span."},
    {"setup_exit", (PyCFunction)(void (*)(void))setup_exit, METH_FASTCALL,
     "setup_exit(span_class, exit_kind, limits): what exit_child() needs."},
    {"setup_entry", (PyCFunction)(void (*)(void))setup_entry, METH_FASTCALL,
     "setup_entry(segment_class, entry_kind, policy, rules_type, profile_gate, carrier_type, cross_process_ref)"},
    {"entry_root", (PyCFunction)(void (*)(void))entry_root, METH_FASTCALL,
     "entry_root(op, component, layer, carrier): a new segment's entry span, or None (Python decides)."},
    {"setup_new_exit", (PyCFunction)(void (*)(void))setup_new_exit, METH_FASTCALL,
     "setup_new_exit(new_exit_span, decide_exit_span): the Python paths new_exit_span() hands over to."},
    {"new_exit_span", (PyCFunction)(void (*)(void))new_exit_span, METH_FASTCALL | METH_KEYWORDS,
     "new_exit_span(op, peer, component, layer, carrier=None): context.new_exit_span, its common cases in C."},
    {"exit_child", (PyCFunction)(void (*)(void))exit_child, METH_FASTCALL,
     "exit_child(op, peer, component, layer): a child exit span of the current span, the first span of a "
     "new trace when none is current, or None."},
    {"setup_carrier", (PyCFunction)(void (*)(void))setup_carrier, METH_FASTCALL,
     "setup_carrier(carrier_class, callers): what decode_carrier() builds and the callers it knows."},
    {"decode_carrier", (PyCFunction)decode_carrier, METH_O,
     "decode_carrier(value): the ContextCarrier of a plain sw8 from a known caller, else None."},
    {"setup_inject", (PyCFunction)(void (*)(void))setup_inject, METH_FASTCALL,
     "setup_inject(fallback): what span.inject() calls when it does not build the headers itself."},
    {"rows", (PyCFunction)(void (*)(void))rows, METH_FASTCALL,
     "rows(spans, skip_analysis): the span lists of a SEGMENT record."},
    {"set_ids", (PyCFunction)(void (*)(void))set_ids, METH_FASTCALL,
     "set_ids(prefix, pid, pid_holder, pid_function, reseed): this process's id source."},
    {"new_id", (PyCFunction)new_id, METH_NOARGS, "new_id(): a unique id (prefix + counter)."},
    {"set_direct_sink", (PyCFunction)(void (*)(void))set_direct_sink, METH_FASTCALL,
     "set_direct_sink(write, pid_holder, pid_function): the sink method emit may go around."},
    {"set_emit", (PyCFunction)(void (*)(void))set_emit, METH_FASTCALL,
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
    {"sw8_header", (PyCFunction)(void (*)(void))sw8_header, METH_FASTCALL,
     "sw8_header(span, service_b64, instance_b64): the sw8 value Span.inject sends, or None."},
    {"json_dumps", (PyCFunction)json_dumps, METH_O,
     "json_dumps(value): the record writer's bytes for value (orjson's), or None where it declines."},
    {"split_sw8", (PyCFunction)swmp_split_sw8, METH_O,
     "split_sw8(value): (sampled, trace_id, segment_id, span_id, tail) of a plain sw8, else None."},
    {"setup_route", (PyCFunction)setup_route, METH_O,
     "setup_route(name_request): the Python name_request that name_request() hands other cases to."},
    {"name_request", (PyCFunction)name_request_guarded, METH_O,
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
    {"set_segments", (PyCFunction)(void (*)(void))set_segments, METH_FASTCALL,
     "set_segments(identity, no_correlation): what a new segment needs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef spancore_module = {
    PyModuleDef_HEAD_INIT, "swmp._spancore", "The native core of a span's life (see spancore.c).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__spancore(void) {
#define INTERN(var, text)                          \
    if ((var = PyUnicode_InternFromString(text)) == NULL) { \
        return NULL;                                \
    }
    INTERN(s_finished, "finished");
    INTERN(s_open, "_open");
    INTERN(s_enter_method, "__enter__");
    INTERN(s_exit_method, "__exit__");
    INTERN(s_token, "_token");
    INTERN(s_emit, "emit");
    INTERN(s_error, "error");
    INTERN(s_interrupted, "interrupted");
    INTERN(s_profile, "profile");
    INTERN(s_stop, "stop");
    INTERN(s_end, "end");
    INTERN(s_prev, "_prev");
    INTERN(s_ids, "_ids");
    INTERN(s_span_limit, "span_limit");
    INTERN(s_pid, "pid");
    INTERN(s_unbound, "unbound");
    INTERN(s_bind, "bind");
    INTERN(s_service, "service");
    INTERN(s_instance, "instance");
    INTERN(s_write, "write");
    INTERN(s_sink, "_sink");
    INTERN(s_sink_pid, "_pid");
    INTERN(s_sink_writer, "_writer");
    INTERN(s_written, "segments_written");
    INTERN(s_dropped, "segments_dropped");
    INTERN(s_op, "op");
    INTERN(empty_op, "");
    INTERN(s_rules, "rules");
    INTERN(s_sampling, "sampling");
    INTERN(s_cache, "_cache");
    INTERN(s_board, "board");
    INTERN(s_sampled, "sampled");
    INTERN(s_correlation, "correlation");
    INTERN(s_skip_analysis, "skip_analysis");
    INTERN(s_trace_id, "trace_id");
    INTERN(s_sw8, "sw8");
    INTERN(s_service_b64, "service_b64");
    INTERN(s_instance_b64, "instance_b64");
#undef INTERN
    swmp_sw8_init();
    if ((one = PyLong_FromLong(1)) == NULL || (zero = PyLong_FromLong(0)) == NULL ||
        (minus_one = PyLong_FromLong(-1)) == NULL) {
        return NULL;
    }
    if (PyType_Ready(&SpanCoreType) < 0 || PyType_Ready(&SegmentCoreType) < 0 || PyType_Ready(&SpanIdsType) < 0 ||
        PyType_Ready(&swmp_GateType) < 0 ||
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
    if (PyModule_AddObjectRef(m, "SpanCore", (PyObject *)&SpanCoreType) < 0 ||
        PyModule_AddObjectRef(m, "SegmentCore", (PyObject *)&SegmentCoreType) < 0 ||
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
