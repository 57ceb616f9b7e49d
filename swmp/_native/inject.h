/* The outgoing sw8 header (inject.c): Span.inject and sw8_header. */
#ifndef SWMP_INJECT_H
#define SWMP_INJECT_H
#include <Python.h>

#include "span.h"
PyObject *swmp_spancore_inject(SpanCore *self, PyObject *unused);
PyObject *swmp_setup_inject(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_sw8_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int swmp_inject_init(void);
#endif
