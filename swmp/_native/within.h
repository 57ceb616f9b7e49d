/* swmp._spancore.within (within.c), registered by the module in spancore.c. */
#ifndef SWMP_WITHIN_H
#define SWMP_WITHIN_H
#include <Python.h>
extern PyTypeObject swmp_WithinType;
extern PyTypeObject swmp_AwaitingCallType;
PyObject *swmp_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* The lazy form's opener: the span of ``owner``'s call with these arguments (not entered,
 * a new reference), or NULL without an error to leave the call to the Python fallback, or
 * NULL with an error that is not an Exception (raised). */
typedef PyObject *(*swmp_within_opener)(PyObject *owner, PyObject *const *args, size_t nargsf, PyObject *kwnames);
/* The lazy form (see within.c): an awaitable that opens the span and calls ``orig(*args,
 * **kwargs)`` at its first send, or ``fallback(...)`` when ``open`` declines. */
PyObject *swmp_within_lazy(swmp_within_opener open, PyObject *owner, PyObject *orig, PyObject *fallback,
                           PyObject *const *args, size_t nargsf, PyObject *kwnames);
/* An opener that may also give the call new arguments: ``*argv`` (the positional values,
 * then the keywords') and ``*kwnames`` (NULL: none) may be replaced (the old references
 * released). It returns the span, NULL as the plain opener does, or None: no span, the
 * call made as it came. */
typedef PyObject *(*swmp_within_rewriter)(PyObject *owner, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs);
PyObject *swmp_within_rewriting(swmp_within_rewriter rewrite, PyObject *owner, PyObject *orig, PyObject *fallback,
                                PyObject *const *args, size_t nargsf, PyObject *kwnames);
#endif
