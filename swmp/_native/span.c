/* swmp._spancore's SpanCore (see spancore.c): a span's fields, its construction and the
 * type; its life in the context and its end are finish.c's, inject() is inject.c's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "finish.h"
#include "inject.h"
#include "span.h"

/* Set once by setup(): the context variable of the current span, the shared "nothing yet"
 * tuple of tags/logs/refs, and the function counting a lost span (stats.spans_lost). */
PyObject *swmp_current_var = NULL;
static PyObject *empty = NULL;
PyObject *swmp_count_lost = NULL;
long long swmp_last_ms = -1;
PyObject *swmp_last_ms_int = NULL;

static int check_setup(void) {
    if (swmp_current_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup() was not called");
        return -1;
    }
    return 0;
}

PyObject *swmp_make_span(PyTypeObject *type, PyObject *segment, PyObject *span_id, PyObject *parent_id,
                         PyObject *op, PyObject *kind, PyObject *layer, PyObject *component, PyObject *peer) {
    PyObject *start = swmp_now_ms();
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
    return swmp_make_span(type, ARG(0), Py_NewRef(ARG(1)), ARG(2), ARG(3), ARG(4), ARG(5), ARG(6), ARG(7));
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

static PyMethodDef spancore_methods[] = {
    {"__enter__", (PyCFunction)swmp_spancore_enter, METH_NOARGS, "Make this span the current one."},
    {"inject", (PyCFunction)swmp_spancore_inject, METH_NOARGS,
     "Headers that make a downstream service continue this trace with this span as parent."},
    {"__exit__", (PyCFunction)(void (*)(void))swmp_spancore_exit, METH_FASTCALL,
     "Record the exception if any, and finish."},
    {"finish", (PyCFunction)(void (*)(void))swmp_spancore_finish, METH_FASTCALL | METH_KEYWORDS,
     "finish(end_ms=None): finish the span (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static int spancore_setattro(PyObject *self, PyObject *name, PyObject *value) {
    return swmp_refuse_field_deletion(self, name, value, &swmp_SpanCoreType);
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

PyTypeObject swmp_SpanCoreType = {
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

PyObject *swmp_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "setup(current_span: ContextVar, empty: tuple, count_lost: callable)");
        return NULL;
    }
    if (!PyContextVar_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup(): current_span must be a ContextVar");
        return NULL;
    }
    Py_XSETREF(swmp_current_var, Py_NewRef(args[0]));
    Py_XSETREF(empty, Py_NewRef(args[1]));
    Py_XSETREF(swmp_count_lost, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}
