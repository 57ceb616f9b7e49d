#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "wsgi.h"

/* WSGIMethod(fallback, orig, component, collect_params, params_limit): what the frameworks'
 * WSGI entry *method* (Flask.wsgi_app, Django's WSGIHandler.__call__, Falcon's, Pyramid's,
 * Bottle's) is patched with: ``obj.method(environ, start_response)`` runs ``orig`` bound to
 * ``obj`` through wsgi_call. Why: the Python method in between (swmp/instrument/wsgi.py's
 * traced_wsgi_method, kept as ``fallback``) was a frame and a bound method on every request.
 * It binds like the function it replaces (itself from the class, a bound method from an
 * instance; Py_TPFLAGS_METHOD_DESCRIPTOR lets ``obj.method(...)`` skip the bound method) and
 * has a ``__dict__`` for functools.update_wrapper and the patcher's attributes. A call of
 * another shape (keywords, another count of arguments) is the fallback's. */
typedef struct {
    PyObject_HEAD
    PyObject *fallback;
    PyObject *orig;
    PyObject *component;
    PyObject *collect;
    PyObject *limit;
    PyObject *dict;
    vectorcallfunc vectorcall;
} WSGIMethod;

static PyObject *method_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    WSGIMethod *m = (WSGIMethod *)callable;
    if (PyVectorcall_NARGS(nargsf) != 3 || kwnames != NULL || !swmp_wsgi_set_up()) {
        return PyObject_Vectorcall(m->fallback, args, nargsf, kwnames);
    }
    PyObject *bound = PyMethod_New(m->orig, args[0]); /* _bind(orig, self) */
    if (bound == NULL) {
        return NULL;
    }
    PyObject *call[6] = {bound, args[1], args[2], m->component, m->collect, m->limit};
    PyObject *result = swmp_wsgi_call(NULL, call, 6, NULL);
    Py_DECREF(bound);
    return result;
}

static PyObject *method_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *fallback, *orig, *component, *collect, *limit;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "WSGIMethod() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "WSGIMethod", 5, 5, &fallback, &orig, &component, &collect, &limit)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback) || !PyCallable_Check(orig)) {
        PyErr_SetString(PyExc_TypeError, "WSGIMethod(fallback, orig, ...): fallback and orig must be callable");
        return NULL;
    }
    WSGIMethod *m = (WSGIMethod *)type->tp_alloc(type, 0);
    if (m == NULL) {
        return NULL;
    }
    m->fallback = Py_NewRef(fallback);
    m->orig = Py_NewRef(orig);
    m->component = Py_NewRef(component);
    m->collect = Py_NewRef(collect);
    m->limit = Py_NewRef(limit);
    m->dict = NULL;
    m->vectorcall = method_vectorcall;
    return (PyObject *)m;
}

static int method_traverse(WSGIMethod *m, visitproc visit, void *arg) {
    Py_VISIT(m->fallback);
    Py_VISIT(m->orig);
    Py_VISIT(m->component);
    Py_VISIT(m->collect);
    Py_VISIT(m->limit);
    Py_VISIT(m->dict);
    return 0;
}

static int method_clear(WSGIMethod *m) {
    Py_CLEAR(m->fallback);
    Py_CLEAR(m->orig);
    Py_CLEAR(m->component);
    Py_CLEAR(m->collect);
    Py_CLEAR(m->limit);
    Py_CLEAR(m->dict);
    return 0;
}

static void method_dealloc(WSGIMethod *m) {
    PyObject_GC_UnTrack(m);
    method_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *method_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *method_repr(WSGIMethod *m) {
    return PyUnicode_FromFormat("<swmp WSGI entry of %R>", m->orig);
}

static PyGetSetDef method_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject swmp_WSGIMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.WSGIMethod",
    .tp_basicsize = sizeof(WSGIMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "WSGIMethod(fallback, orig, component, collect_params, params_limit): a WSGI entry method run "
              "in its entry span (wsgi_call with orig bound to the instance).",
    .tp_new = method_new,
    .tp_dealloc = (destructor)method_dealloc,
    .tp_traverse = (traverseproc)method_traverse,
    .tp_clear = (inquiry)method_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(WSGIMethod, vectorcall),
    .tp_descr_get = method_get,
    .tp_dictoffset = offsetof(WSGIMethod, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_repr = (reprfunc)method_repr,
    .tp_getset = method_getset,
};
