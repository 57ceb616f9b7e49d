/* Small steps the module's other sources share (declared in spancore.h): a tag limit read,
 * an error reported as a handled exception, an optional attribute, a call with two objects
 * of ours in front. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "attrcache.h"
#include "spancore.h"

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
