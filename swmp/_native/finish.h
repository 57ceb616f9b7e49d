/* A span's way through the context and its end (finish.c): the SpanCore methods span.c's
 * type lists. */
#ifndef SWMP_FINISH_H
#define SWMP_FINISH_H
#include <Python.h>

#include "span.h"
PyObject *swmp_spancore_enter(SpanCore *self, PyObject *unused);
PyObject *swmp_spancore_exit(SpanCore *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_spancore_finish(SpanCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
int swmp_finish_init(void);
#endif
