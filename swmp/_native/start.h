/* The spans start.c starts in C (exit_child, new_exit_span, entry_root), and what it sets up
 * that the span core's other sources read. */
#ifndef SWMP_START_H
#define SWMP_START_H
#include <Python.h>
/* Set by setup_exit(): the Python class of recorded spans. By setup_entry(): the entry
 * kind, the profiling gate (its board is attached and detached at run time), and
 * segment.cross_process_ref (carrier.c's caller_ref falls back on it). The int 0. */
extern PyTypeObject *swmp_span_class;
extern PyObject *swmp_entry_kind, *swmp_profile_gate, *swmp_cross_process_ref, *swmp_zero;
PyObject *swmp_setup_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_exit_child(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_new_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_new_exit_span(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *swmp_entry_root_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int swmp_start_init(void);
#endif
