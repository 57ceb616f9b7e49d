/* Strs joined without a format to parse (join.c). */
#ifndef SWMP_JOIN_H
#define SWMP_JOIN_H
#include <Python.h>
/* The concatenation of ``n`` strs (what an f-string of them makes), without a format to parse. */
PyObject *swmp_join(PyObject *const *parts, int n);
/* swmp_join remembered for the last parts it was given, at one call site (a static memo):
 * a message client sends to and reads from the same exchange and routing key, or topic,
 * message after message, and their operation name then needs no new string. */
#define SWMP_JOIN_MEMO_PARTS 5
typedef struct {
    int n;
    PyObject *parts[SWMP_JOIN_MEMO_PARTS];
    PyObject *joined;
} SwmpJoinMemo;
/* A new reference to the join of ``parts`` (exact strs, n <= SWMP_JOIN_MEMO_PARTS), or NULL
 * with an error. */
PyObject *swmp_join_memo(SwmpJoinMemo *memo, PyObject *const *parts, int n);
#endif
