/* swmp._spancore.within (within.c) and AwaitingCall, the lazy form as a callable (awaiting.c),
 * registered by the module in spancore.c. */
#ifndef SWMP_WITHIN_H
#define SWMP_WITHIN_H
#include <Python.h>
extern PyTypeObject swmp_WithinType;
extern PyTypeObject swmp_AwaitingCallType;
PyObject *swmp_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* What an opener may leave to be done when its call is over (returned, raised, thrown into,
 * closed, or collected while running), just before the span exits, as a ``finally`` inside
 * the ``with span:`` would: ``fn(state)``, which returns 0, or -1 with an error that is not
 * an Exception (it clears those itself), which then replaces the call's outcome. ``state``
 * is a new reference the lazy form releases. Kept only when the opener returns a span. */
typedef struct {
    int (*fn)(PyObject *state);
    PyObject *state;
} swmp_within_after;
/* The lazy form's opener, run at the first send with the call's arguments: ``*argv`` (the
 * positional values, then the keywords') and ``*kwnames`` (NULL: none), which it may
 * replace (releasing the old references) to give the call new ones (the values not named
 * by the new keywords are the positional ones), and ``*after`` (empty),
 * which it may fill. It returns the span (not entered, a new reference); None: no span, the
 * call made as it is; NULL without an error: the call is the Python fallback's; NULL with an
 * error that is not an Exception: raised. */
typedef PyObject *(*swmp_within_opener)(PyObject *owner, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                                        swmp_within_after *after);
/* The lazy form (see within.c): an awaitable that opens the span and calls ``orig(*args,
 * **kwargs)`` at its first send, or ``fallback(...)`` when ``open`` declines. */
PyObject *swmp_within_lazy(swmp_within_opener open, PyObject *owner, PyObject *orig, PyObject *fallback,
                           PyObject *const *args, size_t nargsf, PyObject *kwnames);
#endif
