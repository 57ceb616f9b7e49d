/* swmp._spancore's ASGI entry (asgi.c), registered by the module in spancore.c. */
#ifndef SWMP_ASGI_H
#define SWMP_ASGI_H
#include <Python.h>
PyObject *swmp_setup_asgi(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_asgi_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* The concatenation of ``n`` strs (what an f-string of them makes), without a format to parse. */
PyObject *swmp_join(PyObject *const *parts, int n);
/* Whether the ignore rules may ignore a request by its method (then the Python entry asks
 * them): 1, 0, or -1 with an error. ``policy``: swmp.tracing.context.policy. */
int swmp_methods_ignored(PyObject *policy);
#endif
