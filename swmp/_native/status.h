/* swmp._spancore's WSGI and ASGI status recorders (status.c), registered by the module in spancore.c. */
#ifndef SWMP_STATUS_H
#define SWMP_STATUS_H
#include <Python.h>
extern PyTypeObject swmp_StatusRecorderType;
PyObject *swmp_setup_status(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_recorder(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_sender(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_status_recorder(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_status_sender(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
