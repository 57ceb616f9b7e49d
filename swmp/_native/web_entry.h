/* What the web entries share (web_entry.c). */
#ifndef SWMP_WEB_ENTRY_H
#define SWMP_WEB_ENTRY_H
#include <Python.h>
/* What the common case of swmp/instrument/_http.py's request_tags reads, and the function
 * itself for the other cases. */
typedef struct {
    PyObject *request_tags, *limits, *no_tags, *tag_method, *tag_url;
} SwmpRequestTags;
/* request_tags(span, method, url): ``http.method`` / ``http.url`` as one list when they are
 * the span's first tags and need no clipping, else by the Python function. 0, or -1 with an
 * error. */
int swmp_request_tags(const SwmpRequestTags *parts, PyObject *span, PyObject *method, PyObject *url);
/* Whether the ignore rules may ignore a request by its method (then the Python entry asks
 * them): 1, 0, or -1 with an error. ``policy``: swmp.tracing.context.policy. */
int swmp_methods_ignored(PyObject *policy);
/* The span of a web request with the ContextCarrier ``carrier`` (None without one):
 * entry_root, else the Python ``decide_entry`` (``entry``: op, component, layer). New
 * reference, or NULL with an error. */
PyObject *swmp_carrier_span(PyObject *const *entry, PyObject *decide_entry, PyObject *carrier);
/* The span of a web request whose only propagation header is the sw8 ``text`` (an exact
 * str), when the span core reads it as a plain header of a known caller: made from its parts
 * (swmp_entry_sw8), or where that declines, swmp_carrier_span with the carrier made of
 * them; what from_headers' carrier (decode_carrier's) gives, without the Python call, the
 * carrier and decode_sw8 (the cost an incoming sw8 added to each request, docs/performance.md).
 * 1 with the span in ``*span``, 0 when from_headers must decide (nothing held), -1 with an
 * error. */
int swmp_sw8_span(PyObject *const *entry, PyObject *decide_entry, PyObject *text, PyObject **span);
#endif
