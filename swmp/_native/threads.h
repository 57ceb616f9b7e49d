/* The thread instrumentation's "nothing to do" checks (threads.c), registered by the module
 * in spancore.c and used as Gate predicates by swmp/instrument/threads.py. */
#ifndef SWMP_THREADS_H
#define SWMP_THREADS_H
#include <Python.h>
PyObject *swmp_setup_threads(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_thread_skipped(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames);
PyObject *swmp_runs_in_own_context(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames);
#endif
