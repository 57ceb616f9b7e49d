/* swmp._spancore.within (within.c), registered by the module in spancore.c. */
#ifndef SWMP_WITHIN_H
#define SWMP_WITHIN_H
#include <Python.h>
extern PyTypeObject swmp_WithinType;
PyObject *swmp_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
