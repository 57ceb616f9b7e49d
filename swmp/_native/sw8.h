/* The sw8 header's text both ways (sw8.c): split_sw8 parses an incoming one (registered by
 * the module in spancore.c), swmp_b64_text and swmp_sw8_join build an outgoing one. */
#ifndef SWMP_SW8_H
#define SWMP_SW8_H
#include <Python.h>
void swmp_sw8_init(void);
PyObject *swmp_split_sw8(PyObject *module, PyObject *value);
/* split_sw8's parse without the tuple: 1 with new references in *trace_id and *segment_id
 * and, in *tail_at, where the caller's four fields start in ``value`` (ASCII: an index is
 * a byte offset); 0 (nothing set) when the header is not plain. Never raises. */
int swmp_sw8_parts(PyObject *value, int *sampled, PyObject **trace_id, PyObject **segment_id, long long *span_id,
                   Py_ssize_t *tail_at);
/* Standard padded base64 of a str's UTF-8 bytes, as an ASCII str; NULL with no error set
 * when the text is not strictly encodable (a lone surrogate: the Python path decides). */
PyObject *swmp_b64_text(PyObject *text);
/* "1-<trace>-<segment>-<span id>-<service>-<instance>-<endpoint>-<peer>" from the base64
 * fields (ASCII strs) and the span id; NULL with no error set when a field is not ASCII
 * text or the span id is negative. */
PyObject *swmp_sw8_join(PyObject *trace, PyObject *segment, long long span_id, PyObject *service,
                        PyObject *instance, PyObject *endpoint, PyObject *peer);
#endif
