/* swmp._spancore's WSGI request (wsgi.c) and the frameworks' WSGI entry method that runs it
 * (wsgi_method.c), registered by the module in spancore.c. */
#ifndef SWMP_WSGI_H
#define SWMP_WSGI_H
#include <Python.h>
extern PyTypeObject swmp_WSGIMethodType;
PyObject *swmp_setup_wsgi(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_setup_wsgi_file(PyObject *module, PyObject *fn);
PyObject *swmp_wsgi_call(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames);
/* Has setup_wsgi() run (else a WSGIMethod calls its Python fallback)? */
int swmp_wsgi_set_up(void);
#endif
