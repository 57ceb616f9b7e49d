/* The incoming carrier (carrier.c): what start.c's swmp_entry_sw8 and entry_root read of it. */
#ifndef SWMP_CARRIER_H
#define SWMP_CARRIER_H
#include <Python.h>
/* A ContextCarrier's fields, in the order of its slots' offsets kept by setup_carrier() and
 * of the reference's items after its kind (CF_TRACE_ID..CF_ADDRESS). */
enum {
    CF_TRACE_ID,
    CF_SEGMENT_ID,
    CF_SPAN_ID,
    CF_SERVICE,
    CF_INSTANCE,
    CF_ENDPOINT,
    CF_ADDRESS,
    CF_SAMPLED,
    CF_CORRELATION,
    CF_SKIP_ANALYSIS,
    CF_COUNT
};
/* Set by setup_carrier(): the ContextCarrier class. The reference's kind, known from
 * segment.cross_process_ref's first answer (NULL until then). */
extern PyTypeObject *swmp_carrier_class;
extern PyObject *swmp_ref_kind;
/* segment.cross_process_ref(carrier): a new reference, or NULL with an error. */
PyObject *swmp_caller_ref(PyObject *carrier);
PyObject *swmp_setup_carrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_decode_carrier(PyObject *module, PyObject *value);
#endif
