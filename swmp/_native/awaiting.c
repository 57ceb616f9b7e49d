#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#include "within.h"

/* AwaitingCall(open, owner, orig, fallback): a callable whose call ``(*args, **kwargs)``
 * is the lazy form above with ``open(owner, *args, **kwargs)`` as its opener (a C
 * function called without a Python frame: aiormq's ``aiormq_consuming(channel, message)``
 * in deliver.c) and an ``Exception`` from it declining the call to ``fallback``. What
 *
 *     async def call(*args, **kwargs):
 *         try:
 *             cm = open(owner, *args, **kwargs)
 *         except Exception:
 *             return await fallback(*args, **kwargs)
 *         with cm:
 *             return await orig(*args, **kwargs)
 *
 * does. Why: aiormq runs each delivery's callback in a task of its own, through this
 * wrapper; as a Python coroutine its frame was resumed at every await of the callback. */
typedef struct {
    PyObject_HEAD
    PyObject *open, *owner, *orig, *fallback;
    PyObject *dict; /* attributes the Python side gives it (see aiormq.py's _on_message) */
    vectorcallfunc vectorcall;
} AwaitingCall;

#define AWAITING_STACK 8

static PyObject *awaiting_open(PyObject *callable, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                               swmp_within_after *after) {
    AwaitingCall *c = (AwaitingCall *)callable;
    PyObject *const *args = &PyTuple_GET_ITEM(*argv, 0);
    Py_ssize_t total = PyTuple_GET_SIZE(*argv);
    PyObject *stack[AWAITING_STACK];
    PyObject **call = total < AWAITING_STACK ? stack : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    PyObject *cm = NULL;
    if (call == NULL) {
        PyErr_NoMemory(); /* an Exception: cleared below, the fallback runs */
    } else {
        call[0] = c->owner;
        memcpy(call + 1, args, (size_t)total * sizeof(PyObject *));
        cm = PyObject_Vectorcall(c->open, call, (size_t)(nargs + 1), *kwnames);
        if (call != stack) {
            PyMem_Free(call);
        }
    }
    if (cm == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
    }
    return cm;
}

static PyObject *awaiting_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    AwaitingCall *c = (AwaitingCall *)callable;
    return swmp_within_lazy(awaiting_open, callable, c->orig, c->fallback, args, nargsf, kwnames);
}

static PyObject *awaiting_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *open, *owner, *orig, *fallback;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) ||
        !PyArg_ParseTuple(args, "OOOO:AwaitingCall", &open, &owner, &orig, &fallback) || !PyCallable_Check(open) ||
        !PyCallable_Check(orig) || !PyCallable_Check(fallback)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "AwaitingCall(open, owner, orig, fallback): three callables and an owner");
        }
        return NULL;
    }
    AwaitingCall *c = (AwaitingCall *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    c->open = Py_NewRef(open);
    c->owner = Py_NewRef(owner);
    c->orig = Py_NewRef(orig);
    c->fallback = Py_NewRef(fallback);
    c->vectorcall = awaiting_vectorcall;
    return (PyObject *)c;
}

static int awaiting_traverse(AwaitingCall *c, visitproc visit, void *arg) {
    Py_VISIT(c->open);
    Py_VISIT(c->owner);
    Py_VISIT(c->orig);
    Py_VISIT(c->fallback);
    Py_VISIT(c->dict);
    return 0;
}

static int awaiting_clear(AwaitingCall *c) {
    Py_CLEAR(c->open);
    Py_CLEAR(c->owner);
    Py_CLEAR(c->orig);
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->dict);
    return 0;
}

static void awaiting_dealloc(AwaitingCall *c) {
    PyObject_GC_UnTrack(c);
    awaiting_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* ``__wrapped__``: the callable run inside the span. The rest of what a function offers
 * (``__code__``, ``__name__``, ...) the Python side may set in the instance's dict. */
static PyMemberDef awaiting_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(AwaitingCall, orig), READONLY, "The callable run inside the span."},
    {NULL},
};

static PyGetSetDef awaiting_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL},
};

PyTypeObject swmp_AwaitingCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.AwaitingCall",
    .tp_basicsize = sizeof(AwaitingCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AwaitingCall(open, owner, orig, fallback): call(*a, **kw) awaits orig(*a, **kw) inside "
              "open(owner, *a, **kw), made at the first send; fallback(*a, **kw) when open raises.",
    .tp_new = awaiting_new,
    .tp_dealloc = (destructor)awaiting_dealloc,
    .tp_traverse = (traverseproc)awaiting_traverse,
    .tp_clear = (inquiry)awaiting_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AwaitingCall, vectorcall),
    .tp_members = awaiting_members,
    .tp_dictoffset = offsetof(AwaitingCall, dict),
    .tp_getset = awaiting_getset,
};
