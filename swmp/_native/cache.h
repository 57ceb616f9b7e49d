/* swmp._spancore's CacheCall (cache.c), registered by the module in spancore.c. */
#ifndef SWMP_CACHE_H
#define SWMP_CACHE_H
#include <Python.h>
PyObject *swmp_setup_cache(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_CacheCallType;
#endif
