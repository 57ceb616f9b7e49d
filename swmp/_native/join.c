/* Strs joined without a format to parse: what an f-string of them makes, and the same
 * remembered for the last parts at one call site (web entries' URLs and peers, message
 * clients' operation names). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "join.h"

/* The concatenation of ``n`` strs: what an f-string of them makes (PyUnicode_FromFormat
 * parses its format on every call: ~1,400 instructions a request for the URL and peer). */
PyObject *swmp_join(PyObject *const *parts, int n) {
    Py_ssize_t length = 0;
    Py_UCS4 maxchar = 127;
    for (int i = 0; i < n; i++) {
        length += PyUnicode_GET_LENGTH(parts[i]);
        Py_UCS4 m = PyUnicode_MAX_CHAR_VALUE(parts[i]);
        maxchar = m > maxchar ? m : maxchar;
    }
    PyObject *out = PyUnicode_New(length, maxchar);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t at = 0;
    for (int i = 0; i < n; i++) {
        Py_ssize_t k = PyUnicode_GET_LENGTH(parts[i]);
        if (PyUnicode_CopyCharacters(out, at, parts[i], 0, k) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        at += k;
    }
    return out;
}

/* Equal parts, the same objects first (constants and a client's own exchange/topic strings
 * usually are): ~20 instructions against ~850 for a new join of five. */
static int same_parts(const SwmpJoinMemo *memo, PyObject *const *parts, int n) {
    if (memo->joined == NULL || memo->n != n) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        PyObject *a = memo->parts[i], *b = parts[i];
        if (a != b && (PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) || PyUnicode_Compare(a, b) != 0)) {
            return 0; /* exact strs: no comparison error is possible */
        }
    }
    return 1;
}

PyObject *swmp_join_memo(SwmpJoinMemo *memo, PyObject *const *parts, int n) {
    if (n > SWMP_JOIN_MEMO_PARTS) {
        return swmp_join(parts, n);
    }
    if (same_parts(memo, parts, n)) {
        return Py_NewRef(memo->joined);
    }
    PyObject *joined = swmp_join(parts, n);
    if (joined == NULL) {
        return NULL;
    }
    for (int i = 0; i < memo->n; i++) {
        Py_CLEAR(memo->parts[i]);
    }
    for (int i = 0; i < n; i++) {
        memo->parts[i] = Py_NewRef(parts[i]);
    }
    memo->n = n;
    Py_XSETREF(memo->joined, Py_NewRef(joined));
    return joined;
}
