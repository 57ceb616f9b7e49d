/* swmp._spancore's SQL exit span and SqlCall (sql.c), registered by the module in spancore.c. */
#ifndef SWMP_SQL_H
#define SWMP_SQL_H
#include <Python.h>
PyObject *swmp_setup_sql(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_sql_span(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames);
extern PyTypeObject swmp_SqlCallType;
#endif
