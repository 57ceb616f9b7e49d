/* What spancore.c offers the module's other sources (asgi.c, wsgi.c, sql.c). */
#ifndef SWMP_SPANCORE_H
#define SWMP_SPANCORE_H
#include <Python.h>
/* entry_root(op, component, layer, carrier): a new reference (a span or None). */
PyObject *swmp_entry_root(PyObject *const *args);
/* new_exit_span(op, peer, component, layer): a new reference (a span or a span that is not
 * recorded), or NULL with an error. */
PyObject *swmp_new_exit(PyObject *const *args);
#endif
