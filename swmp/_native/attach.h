/* swmp._spancore.amqp_attach (attach.c), registered by the module in spancore.c. */
#ifndef SWMP_ATTACH_H
#define SWMP_ATTACH_H
#include <Python.h>
PyObject *swmp_amqp_attach(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_AttachType;
#endif
