/* A segment's SEGMENT record and its emission (emit.c). */
#ifndef SWMP_EMIT_H
#define SWMP_EMIT_H
#include <Python.h>
/* seg.emit(): in C when the segment is ours and its class still has Segment.emit; 0 or -1. */
int swmp_emit_segment(PyObject *seg);
PyObject *swmp_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_set_emit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_set_direct_sink(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int swmp_emit_init(void);
#endif
