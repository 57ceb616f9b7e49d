/* swmp._spancore.wsgi_body (body.c), registered by the module in spancore.c. */
#ifndef SWMP_BODY_H
#define SWMP_BODY_H
#include <Python.h>
extern PyTypeObject swmp_BodyType;
PyObject *swmp_wsgi_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_wsgi_body(PyObject *module, PyObject *fn);
/* failed_first(span, exc) (the Python ``_failed_first``, once set): a response that failed
 * before any of it was sent is the server's 500. Errors cleared; the caller's error state
 * (fetched, to be restored) is untouched. */
void swmp_failed_first(PyObject *span, PyObject *exc);
#endif
