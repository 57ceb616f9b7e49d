/* swmp._spancore.copy_slots (slots.c), registered by the module in spancore.c. */
#ifndef SWMP_SLOTS_H
#define SWMP_SLOTS_H
#include <Python.h>
PyObject *swmp_copy_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
