/* swmp._spancore.wsgi_body (body.c), registered by the module in spancore.c. */
#ifndef SWMP_BODY_H
#define SWMP_BODY_H
#include <Python.h>
extern PyTypeObject swmp_BodyType;
PyObject *swmp_wsgi_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_wsgi_body(PyObject *module, PyObject *fn);
#endif
