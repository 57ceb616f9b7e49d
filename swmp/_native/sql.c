/* sql_span(op, address, component, db_type, instance, statement, params=None, many=False):
 * swmp/instrument/_datastore.py's ``sql_span`` in C: the exit span of one SQL call, tagged
 * ``db.type`` / ``db.instance`` / ``db.statement`` (and ``db.sql.parameters`` when enabled).
 *
 * Why: every traced query of every SQL driver (psycopg2, psycopg, asyncpg, PyMySQL,
 * mysqlclient, aiomysql) ran it as a Python frame of its own (~35 bytecodes) between the
 * driver's round trips, where the CPU caches are cold and each bytecode, code object and
 * global costs its cache lines (docs/performance.md, "Where the real-server and end-to-end
 * gap comes from").
 *
 * The same steps as the Python function, with the same results: the span from
 * new_exit_span (spancore.c); a recorded span (of the Span class itself) gets the statement
 * as text (the Python ``text`` for anything but a str), the three tags as one list when
 * they are its first tags and the statement needs no clipping, else through ``Span.tag``;
 * the parameters through ``params_text`` and ``Span.tag`` when the setting asks for them,
 * an ``Exception`` there ignored as in Python. A call of another shape (keywords, another
 * count of arguments) is the Python function's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "spancore.h"
#include "sql.h"

/* Set by setup_sql(): see its docstring in spancore.c's method table. */
static PyObject *py_sql_span = NULL, *no_tags = NULL, *limits = NULL, *settings = NULL, *text = NULL,
                *params_text = NULL, *layer = NULL, *tag_type = NULL, *tag_instance = NULL, *tag_statement = NULL,
                *tag_parameters = NULL;
static PyTypeObject *span_class = NULL;
static PyObject *s_tags, *s_tag, *s_tag_value_max, *s_params_max;

PyObject *swmp_setup_sql(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyCallable_Check(args[0]) || !PyType_Check(args[1]) || !PyCallable_Check(args[5]) ||
        !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_sql(py_sql_span, span_class: type, no_tags, limits, settings, text, params_text, "
                        "layer, tag_type, tag_instance, tag_statement, tag_parameters)");
        return NULL;
    }
    if (s_tags == NULL && ((s_tags = PyUnicode_InternFromString("tags")) == NULL ||
                           (s_tag = PyUnicode_InternFromString("tag")) == NULL ||
                           (s_tag_value_max = PyUnicode_InternFromString("tag_value_max")) == NULL ||
                           (s_params_max = PyUnicode_InternFromString("params_max")) == NULL)) {
        return NULL;
    }
    PyObject **slots[] = {&py_sql_span, (PyObject **)&span_class, &no_tags, &limits, &settings, &text,
                          &params_text, &layer, &tag_type, &tag_instance, &tag_statement, &tag_parameters};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

/* span.tag(key, value) */
static int tag(PyObject *span, PyObject *key, PyObject *value) {
    PyObject *call[3] = {span, key, value};
    PyObject *r = PyObject_VectorcallMethod(s_tag, call, 3, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The three tags of the query: one list when they are the span's first and the statement
 * fits the tag limit, else one Span.tag call each (which clips). */
static int tag_query(PyObject *span, PyObject *db_type, PyObject *instance, PyObject *statement) {
    statement = PyUnicode_CheckExact(statement) ? Py_NewRef(statement) : PyObject_CallOneArg(text, statement);
    if (statement == NULL) {
        return -1;
    }
    PyObject *tags = PyObject_GetAttr(span, s_tags);
    PyObject *lim_obj = tags == NULL ? NULL : PyObject_GetAttr(limits, s_tag_value_max);
    Py_ssize_t lim = lim_obj == NULL ? -1 : PyLong_AsSsize_t(lim_obj);
    int r = -1;
    if (lim_obj != NULL && !(lim == -1 && PyErr_Occurred())) {
        if (tags == no_tags && PyUnicode_Check(statement) && PyUnicode_GET_LENGTH(statement) <= lim) {
            PyObject *list = PyList_New(6);
            if (list != NULL) {
                PyObject *items[6] = {tag_type, db_type, tag_instance, instance, tag_statement, statement};
                for (int i = 0; i < 6; i++) {
                    PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
                }
                r = PyObject_SetAttr(span, s_tags, list);
                Py_DECREF(list);
            }
        } else if (tag(span, tag_type, db_type) == 0 && tag(span, tag_instance, instance) == 0) {
            r = tag(span, tag_statement, statement);
        }
    }
    Py_XDECREF(lim_obj);
    Py_XDECREF(tags);
    Py_DECREF(statement);
    return r;
}

/* ``db.sql.parameters`` when ``params`` is given and the setting asks for them; an
 * Exception while making the text or tagging is ignored (the query matters more). */
static int tag_parameters_of(PyObject *span, PyObject *params, PyObject *many) {
    if (params == Py_None) {
        return 0;
    }
    PyObject *max = PyObject_GetAttr(settings, s_params_max);
    int wanted = max == NULL ? -1 : PyObject_IsTrue(max);
    Py_XDECREF(max);
    if (wanted <= 0) {
        return wanted;
    }
    PyObject *call[2] = {params, many};
    PyObject *value = PyObject_Vectorcall(params_text, call, 2, NULL);
    int r = value == NULL ? -1 : tag(span, tag_parameters, value);
    Py_XDECREF(value);
    if (r < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear(); /* an exotic parameter container: as the Python code's ``except Exception`` */
        r = 0;
    }
    return r;
}

PyObject *swmp_sql_span(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (py_sql_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_sql() was not called");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 6 || nargs > 8) {
        return PyObject_Vectorcall(py_sql_span, args, nargsf, kwnames);
    }
    PyObject *exit_args[4] = {args[0], args[1], args[2], layer};
    PyObject *span = swmp_new_exit(exit_args);
    if (span == NULL || !Py_IS_TYPE(span, span_class)) {
        return span; /* not recorded (or the error new_exit_span raised): as it is */
    }
    if (tag_query(span, args[3], args[4], args[5]) < 0 ||
        tag_parameters_of(span, nargs > 6 ? args[6] : Py_None, nargs > 7 ? args[7] : Py_False) < 0) {
        Py_DECREF(span);
        return NULL;
    }
    return span;
}
