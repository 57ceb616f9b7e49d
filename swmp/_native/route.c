/* A routed request's entry span named after its route (see spancore.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "route.h"
#include "segment.h"
#include "span.h"
#include "start.h"

/* name_request(template): swmp/instrument/_route.py's ``name_request`` when the request's
 * entry span is the current span (what every route hook finds: the framework routes
 * before the view opens spans of its own), Span.set_operation's steps done here; any other
 * case by the Python function (``setup_route``). Why: the rename ran ~75 bytecodes in
 * three Python frames on every routed request of every framework. */
static PyObject *py_name_request = NULL, *s_by_endpoint = NULL, *s_consider = NULL;

PyObject *swmp_setup_route(PyObject *module, PyObject *fallback) {
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
    if (swmp_span_class == NULL || swmp_entry_kind == NULL || Py_TYPE(cur) != swmp_span_class) {
        return 0;
    }
    SpanCore *span = (SpanCore *)cur;
    if (!PyObject_TypeCheck(span->segment, &swmp_SegmentCoreType)) {
        return 0;
    }
    int entry = PyObject_RichCompareBool(span->kind, swmp_entry_kind, Py_EQ);
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
    if (!PyUnicode_CheckExact(template) || PyUnicode_GET_LENGTH(template) == 0 || swmp_profile_gate == NULL) {
        return PyObject_CallOneArg(py_name_request, template);
    }
    PyObject *cur = swmp_get_current();
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
    int first = PyObject_RichCompareBool(span->span_id, swmp_zero, Py_EQ);
    PyObject *board = first > 0 ? PyObject_GetAttr(swmp_profile_gate, s_by_endpoint) : NULL;
    int waiting = board == NULL ? (first < 0 || PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(board);
    Py_XDECREF(board);
    PyObject *done = waiting > 0 ? PyObject_CallMethodOneArg(swmp_profile_gate, s_consider, cur) : NULL;
    Py_DECREF(cur);
    if (waiting < 0 || (waiting > 0 && done == NULL)) {
        return NULL;
    }
    Py_XDECREF(done);
    Py_RETURN_NONE;
}

/* As the Python function's callers expect: never raises into the framework's routing. */
PyObject *swmp_name_request(PyObject *module, PyObject *template) {
    PyObject *r = name_request(module, template);
    if (r == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return r;
}
