/* swmp._spancore's ASGI entry (asgi.c), registered by the module in spancore.c. */
#ifndef SWMP_ASGI_H
#define SWMP_ASGI_H
#include <Python.h>
PyObject *swmp_setup_asgi(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_asgi_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
