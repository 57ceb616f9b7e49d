/* What the span core (spancore.c and the sources it lists: start.c, finish.c, carrier.c,
 * inject.c, helpers.c) offers the module's other sources (asgi.c, wsgi.c, sql.c, cache.c,
 * celery.c, ...). */
#ifndef SWMP_SPANCORE_H
#define SWMP_SPANCORE_H
#include <Python.h>
/* ``(a, b)`` with new references: PyTuple_Pack's work without its variadic walk, a function
 * of its own whose code lines a message starting with cold caches pays for (the per-message
 * paths use this; tuples made once keep PyTuple_Pack). */
static inline PyObject *swmp_pair(PyObject *a, PyObject *b) {
    PyObject *t = PyTuple_New(2);
    if (t != NULL) {
        PyTuple_SET_ITEM(t, 0, Py_NewRef(a));
        PyTuple_SET_ITEM(t, 1, Py_NewRef(b));
    }
    return t;
}
/* entry_root(op, component, layer, carrier): a new reference (a span or None). */
PyObject *swmp_entry_root(PyObject *const *args);
/* An incoming ``sw8`` header's plain case from a caller already known (what decode_carrier
 * answers for), read without the ContextCarrier: the ids, the span id, the flag, and the
 * caller's (service, instance, endpoint, address) tuple. */
typedef struct {
    PyObject *trace_id, *segment_id, *caller;
    long long span_id;
    int sampled;
} SwmpSw8;
/* 1 with new references in ``out`` (swmp_sw8_clear releases them), 0 when decode_carrier
 * would answer None (nothing held), -1 with an error. */
int swmp_sw8_read(PyObject *value, SwmpSw8 *out);
void swmp_sw8_clear(SwmpSw8 *p);
/* The ContextCarrier decode_carrier makes of ``p``: a new reference, or NULL with an error. */
PyObject *swmp_sw8_carrier(const SwmpSw8 *p);
/* entry_root(op, component, layer, swmp_sw8_carrier(p)) without the carrier (``args``:
 * op, component, layer): a span, None (entry_root's way with the carrier decides), or NULL. */
PyObject *swmp_entry_sw8(PyObject *const *args, const SwmpSw8 *p);
/* new_exit_span(op, peer, component, layer): a new reference (a span or a span that is not
 * recorded), or NULL with an error. */
PyObject *swmp_new_exit(PyObject *const *args);
/* The end of a client call run inside ``span`` (entered): ``span.__exit__(None, None, None)``
 * after ``result``, or with the exception being raised when ``result`` is NULL (normalized,
 * with its traceback, as ``except ... as e`` sees it), which is raised again afterwards. A
 * failing ``__exit__`` is cleared: the call happened, its end is the agent's problem.
 * Returns ``result``. */
PyObject *swmp_span_leave(PyObject *span, PyObject *result);
/* ``span.__enter__()`` for any span (the recorded class's without a method look-up): 0 or -1. */
int swmp_span_enter(PyObject *span);
/* For a span of the recorded class (a SpanCore; the caller checks): __exit__ with ``exc``
 * (NULL: none), 0 or -1; inject(), a new reference; its ``tags`` (borrowed), and a new value
 * for them (stolen). */
int swmp_span_exit(PyObject *span, PyObject *exc);
PyObject *swmp_span_inject(PyObject *span);
/* The sw8 value of a recorded span's plain case (no correlation, no skip_analysis), or NULL:
 * with an error set, or without one when inject() must decide. */
PyObject *swmp_span_sw8(PyObject *span);
PyObject *swmp_span_tags(PyObject *span);
void swmp_span_set_tags(PyObject *span, PyObject *tags);
/* ``span.tags`` of any span (a new reference, or NULL with an error), and setting them
 * (``tags`` stolen; 0 or -1): a span core's in its struct, another kind by attribute. */
PyObject *swmp_tags_of(PyObject *span);
int swmp_set_tags_of(PyObject *span, PyObject *tags);
/* ``limits.tag_value_max``: the value, or -1 with an error set. */
Py_ssize_t swmp_tag_limit(PyObject *limits);
/* The error set now (an Exception) logged by ``logger(*args)`` as the exception being handled
 * (warn_once's ``exc_info``), then cleared. */
void swmp_report_handled(PyObject *logger, PyObject *const *args, Py_ssize_t nargs);
/* getattr(obj, name, NULL): a new reference, or NULL without an error when there is no such
 * attribute (NULL with the error for any other failure). */
PyObject *swmp_optional_attr(PyObject *obj, PyObject *name);
/* ``callable(first, second, *args, **kwargs)`` for a vectorcall's ``args`` / ``nargs`` /
 * ``kwnames``: a Python function handed a call with two objects of ours in front. */
PyObject *swmp_call_with_two(PyObject *callable, PyObject *first, PyObject *second, PyObject *const *args,
                             Py_ssize_t nargs, PyObject *kwnames);
/* Whether keyword ``k`` is ``name`` (an interned str): the same object for the interned
 * names of call sites, a comparison only for a name that is not interned (built at run
 * time, ``**options``). */
static inline int swmp_is_name(PyObject *k, PyObject *name) {
    if (k == name) {
        return 1;
    }
    if (!PyUnicode_Check(k) || PyUnicode_CHECK_INTERNED(k)) {
        return 0; /* two interned strs that are not the same object differ */
    }
    return PyUnicode_Compare(k, name) == 0;
}
#endif
