/* swmp._spancore's Celery publish (celery.c), registered by the module in spancore.c. */
#ifndef SWMP_CELERY_H
#define SWMP_CELERY_H
#include <Python.h>
PyObject *swmp_setup_celery(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_CelerySendType;
#endif
