/* The SEGMENT record's JSON (json.c), orjson's bytes for the values it takes. */
#ifndef SWMP_JSON_H
#define SWMP_JSON_H
#include <Python.h>
/* ``value`` as JSON bytes; NULL with no error set when it holds something only orjson
 * decides (a float, a dict, an integer past 64 bits, a lone surrogate, deep nesting). */
PyObject *swmp_json_dump(PyObject *value);
/* ``[head..., [row, row, ...]]`` where each row is ``width`` consecutive values of
 * ``rows``: the SEGMENT record without building its lists. NULL as swmp_json_dump. */
PyObject *swmp_json_record(PyObject *const *head, Py_ssize_t nhead, PyObject *const *rows, Py_ssize_t nrows,
                           Py_ssize_t width);
#endif
