/* What the web entries (wsgi.c, asgi.c) share: the ignore rules' method check, the
 * ``http.method`` / ``http.url`` tags, and the entry span made from an incoming carrier or a
 * plain sw8. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attrcache.h"
#include "spancore.h"
#include "web_entry.h"

static PyObject *s_rules, *s_methods;

int swmp_methods_ignored(PyObject *policy) {
    if (s_rules == NULL && ((s_rules = PyUnicode_InternFromString("rules")) == NULL ||
                            (s_methods = PyUnicode_InternFromString("_methods")) == NULL)) {
        return -1;
    }
    /* The agent's own plain objects (__slots__ classes: read through slot caches, see
     * attrcache.c): reading them runs no application code. */
    static swmp_AttrCache at_rules, at_methods;
    PyObject *rules = swmp_slot_attr(policy, s_rules, &at_rules);
    if (rules == NULL) {
        return -1;
    }
    PyObject *methods = swmp_slot_attr_optional(rules, s_methods, &at_methods);
    Py_DECREF(rules);
    if (methods == NULL && PyErr_Occurred()) {
        return -1;
    }
    int ignoring = methods == NULL ? 1 : PyObject_IsTrue(methods); /* getattr(rules, "_methods", True) */
    Py_XDECREF(methods);
    return ignoring;
}

int swmp_request_tags(const SwmpRequestTags *parts, PyObject *span, PyObject *method, PyObject *url) {
    Py_ssize_t lim = swmp_tag_limit(parts->limits);
    if (lim < 0 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *tags = swmp_tags_of(span);
    if (tags == NULL) {
        return -1;
    }
    int done = -1;
    if (tags == parts->no_tags && PyUnicode_GET_LENGTH(method) <= lim && PyUnicode_GET_LENGTH(url) <= lim) {
        PyObject *list = PyList_New(4);
        if (list != NULL) {
            PyList_SET_ITEM(list, 0, Py_NewRef(parts->tag_method));
            PyList_SET_ITEM(list, 1, Py_NewRef(method));
            PyList_SET_ITEM(list, 2, Py_NewRef(parts->tag_url));
            PyList_SET_ITEM(list, 3, Py_NewRef(url));
            done = swmp_set_tags_of(span, list);
        }
    } else {
        PyObject *call[3] = {span, method, url};
        PyObject *r = PyObject_Vectorcall(parts->request_tags, call, 3, NULL);
        done = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(tags);
    return done;
}

PyObject *swmp_carrier_span(PyObject *const *entry, PyObject *decide_entry, PyObject *carrier) {
    PyObject *call[4] = {entry[0], entry[1], entry[2], carrier};
    PyObject *span = swmp_entry_root(call);
    if (span == Py_None) {
        Py_DECREF(span);
        PyObject *decide[4] = {entry[0], carrier, entry[1], entry[2]};
        span = PyObject_Vectorcall(decide_entry, decide, 4, NULL);
    }
    return span;
}

int swmp_sw8_span(PyObject *const *entry, PyObject *decide_entry, PyObject *text, PyObject **span) {
    SwmpSw8 parts;
    int plain = swmp_sw8_read(text, &parts);
    if (plain <= 0) {
        return plain;
    }
    *span = swmp_entry_sw8(entry, &parts);
    if (*span == Py_None) {
        Py_DECREF(*span);
        PyObject *carrier = swmp_sw8_carrier(&parts);
        *span = carrier == NULL ? NULL : swmp_carrier_span(entry, decide_entry, carrier);
        Py_XDECREF(carrier);
    }
    swmp_sw8_clear(&parts);
    return *span == NULL ? -1 : 1;
}
