/* The span core's own declarations, shared by the sources of SpanCore and SegmentCore
 * (span.c: the type; finish.c: the context and a span's end; segment.c, emit.c, start.c,
 * route.c, inject.c, carrier.c). What the module's other sources use is in spancore.h. */
#ifndef SWMP_SPAN_H
#define SWMP_SPAN_H
#include <Python.h>
#include <time.h>

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

extern PyTypeObject swmp_SpanCoreType;
/* Set once by setup() (span.c): the context variable of the current span, and the function
 * counting a lost span (stats.spans_lost). */
extern PyObject *swmp_current_var;
extern PyObject *swmp_count_lost;

/* A span of ``type`` with its start time now; steals ``span_id`` (the others are borrowed). */
PyObject *swmp_make_span(PyTypeObject *type, PyObject *segment, PyObject *span_id, PyObject *parent_id,
                         PyObject *op, PyObject *kind, PyObject *layer, PyObject *component, PyObject *peer);
PyObject *swmp_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* The last millisecond swmp_now_ms() made an int of, and that int (span.c). */
extern long long swmp_last_ms;
extern PyObject *swmp_last_ms_int;

/* Inline: each is on the path of every span (its start, its end, the context's switch). */
static inline PyObject *swmp_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* the clock of time.time_ns() */
    long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
#ifndef Py_GIL_DISABLED
    /* The same millisecond gives the same (immutable) int back: a short span's start and
     * end, and the spans of a busy worker, share one instead of each allocating, filling
     * and freeing its own (a time in ms does not fit the small ints CPython keeps). The
     * GIL keeps the two statics consistent. */
    if (ms == swmp_last_ms && swmp_last_ms_int != NULL) {
        return Py_NewRef(swmp_last_ms_int);
    }
    PyObject *v = PyLong_FromLongLong(ms);
    if (v != NULL) {
        Py_XSETREF(swmp_last_ms_int, Py_NewRef(v));
        swmp_last_ms = ms;
    }
    return v;
#else
    return PyLong_FromLongLong(ms);
#endif
}

/* -- the context: the current span, as a new reference; made current, 0 or -1 -- */

static inline PyObject *swmp_get_current(void) {
    PyObject *value = NULL;
    if (PyContextVar_Get(swmp_current_var, NULL, &value) < 0) {
        return NULL;
    }
    if (value == NULL) {
        value = Py_NewRef(Py_None);
    }
    return value; /* new reference */
}

static inline int swmp_set_current(PyObject *value) {
    PyObject *token = PyContextVar_Set(swmp_current_var, value);
    if (token == NULL) {
        return -1;
    }
    Py_DECREF(token);
    return 0;
}

/* Setting a field from Python as a slot's member descriptor does; deleting one of the core's
 * fields refused. Why: the C paths read the fields without a NULL check (a field is always
 * set from __new__ on), and ``del span.end`` on a span a user holds would otherwise leave a
 * NULL for them to crash on. Python code only ever sets them. Deleting anything else (an
 * attribute in a subclass's __dict__) goes on as usual. Stores from Python lose the
 * interpreter's STORE_ATTR_SLOT specialization (it wants the generic setattro): a few tens of
 * ns on the few fields Python code sets per span; loads keep theirs. */
static inline int swmp_refuse_field_deletion(PyObject *self, PyObject *name, PyObject *value, PyTypeObject *core) {
    if (value == NULL && PyUnicode_Check(name)) {
        PyObject *d = _PyType_Lookup(Py_TYPE(self), name); /* borrowed */
        if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) && PyDescr_TYPE(d) == core) {
            PyErr_Format(PyExc_AttributeError, "'%s' field '%U' cannot be deleted", core->tp_name, name);
            return -1;
        }
    }
    return PyObject_GenericSetAttr(self, name, value);
}

/* ``*var`` = the interned ``text``: 0, or -1 with an error (the sources' names, made once by
 * the module's init). */
static inline int swmp_intern(PyObject **var, const char *text) {
    *var = PyUnicode_InternFromString(text);
    return *var == NULL ? -1 : 0;
}
#endif
