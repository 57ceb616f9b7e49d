/* swmp._spancore.Gate: a patched method that costs one C call outside any trace.
 *
 * Why: most instrumented calls of a data store or client are made inside a trace, but many
 * are not (start-up, background jobs, health checks), and there the wrapper must cost next
 * to nothing (issue 10: <= 0.2 us). A Python wrapper pays a frame and, for ``*args,
 * **kwargs`` pass-through, a tuple and a dict per call: redis-py's ``execute_command(*args,
 * keys=[...])`` cost ~3,200 instructions outside a trace that way. A Gate reads the
 * current-span context variable in C and, when no span is current, hands the caller's
 * arguments to the original unchanged (vectorcall: no tuple, no dict, no frame of ours);
 * otherwise it calls the traced Python function with the same arguments.
 *
 * An optional ``passes`` predicate, called with the same arguments while a span is current,
 * sends the call to the original too when it answers true (or raises: what it could not
 * decide is left untraced). Given a C function (threads.c), the whole "nothing to do here"
 * path stays in C: a pool's worker thread started inside a request (Django under ASGI
 * starts two per request), a work item that runs in a copy of its caller's context.
 *
 * It behaves like the function it replaces: a method descriptor (bound on instance access,
 * itself on class access; Py_TPFLAGS_METHOD_DESCRIPTOR lets ``obj.method(...)`` skip the
 * bound method), with a ``__dict__`` for functools.update_wrapper and the patcher's
 * ``__swmp_original__``. Exceptions, return values and coroutines are the callee's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "gate.h"

typedef struct {
    PyObject_HEAD
    PyObject *var;    /* the current-span ContextVar: None or unset outside any trace */
    PyObject *orig;   /* called outside any trace */
    PyObject *traced; /* called when a span is current */
    PyObject *passes; /* NULL, or: called when a span is current; true -> orig after all */
    PyObject *dict;
    vectorcallfunc vectorcall;
} Gate;

static PyObject *gate_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Gate *g = (Gate *)callable;
    PyObject *value = NULL;
    if (PyContextVar_Get(g->var, NULL, &value) < 0) {
        return NULL; /* not expected (the variable is a ContextVar): raised like a failed call */
    }
    PyObject *target = value == NULL || value == Py_None ? g->orig : g->traced;
    Py_XDECREF(value);
    if (target == g->traced && g->passes != NULL) {
        PyObject *answer = PyObject_Vectorcall(g->passes, args, nargsf, kwnames);
        int passed = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (passed < 0) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL; /* KeyboardInterrupt, SystemExit: the process's, raised */
            }
            PyErr_Clear(); /* undecided: left untraced, the caller's call unchanged */
        }
        if (passed != 0) {
            target = g->orig;
        }
    }
    return PyObject_Vectorcall(target, args, nargsf, kwnames);
}

static PyObject *gate_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *var, *orig, *traced, *passes = Py_None;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Gate() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Gate", 3, 4, &var, &orig, &traced, &passes)) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "Gate(var, orig, traced): var must be a ContextVar");
        return NULL;
    }
    if (!PyCallable_Check(orig) || !PyCallable_Check(traced) || (passes != Py_None && !PyCallable_Check(passes))) {
        PyErr_SetString(PyExc_TypeError, "Gate(var, orig, traced, passes=None): orig, traced and passes must be callable");
        return NULL;
    }
    Gate *g = (Gate *)type->tp_alloc(type, 0);
    if (g == NULL) {
        return NULL;
    }
    g->var = Py_NewRef(var);
    g->orig = Py_NewRef(orig);
    g->traced = Py_NewRef(traced);
    g->passes = passes == Py_None ? NULL : Py_NewRef(passes);
    g->dict = NULL;
    g->vectorcall = gate_vectorcall;
    return (PyObject *)g;
}

static int gate_traverse(Gate *g, visitproc visit, void *arg) {
    Py_VISIT(g->var);
    Py_VISIT(g->orig);
    Py_VISIT(g->traced);
    Py_VISIT(g->passes);
    Py_VISIT(g->dict);
    return 0;
}

static int gate_clear(Gate *g) {
    Py_CLEAR(g->var);
    Py_CLEAR(g->orig);
    Py_CLEAR(g->traced);
    Py_CLEAR(g->passes);
    Py_CLEAR(g->dict);
    return 0;
}

static void gate_dealloc(Gate *g) {
    PyObject_GC_UnTrack(g);
    gate_clear(g);
    Py_TYPE(g)->tp_free((PyObject *)g);
}

/* A function's binding: itself from the class, a bound method from an instance. */
static PyObject *gate_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *gate_repr(Gate *g) {
    return PyUnicode_FromFormat("<swmp gate of %R>", g->orig);
}

static PyObject *gate_orig(Gate *g, void *closure) {
    return Py_NewRef(g->orig);
}

static PyObject *gate_traced(Gate *g, void *closure) {
    return Py_NewRef(g->traced);
}

static PyGetSetDef gate_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"orig", (getter)gate_orig, NULL, "What is called outside any trace.", NULL},
    {"traced", (getter)gate_traced, NULL, "What is called when a span is current.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject swmp_GateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Gate(var, orig, traced, passes=None): calls orig(...) when var holds no span or passes(...) "
              "is true, else traced(...).",
    .tp_new = gate_new,
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Gate, vectorcall),
    .tp_descr_get = gate_get,
    .tp_dictoffset = offsetof(Gate, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_repr = (reprfunc)gate_repr,
    .tp_getset = gate_getset,
};
