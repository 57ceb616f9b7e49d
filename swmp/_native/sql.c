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
 * new_exit_span (start.c); a recorded span (of the Span class itself) gets the statement
 * as text (the Python ``text`` for anything but a str), the three tags as one list when
 * they are its first tags and the statement needs no clipping, else through ``Span.tag``;
 * the parameters through ``params_text`` and ``Span.tag`` when the setting asks for them,
 * an ``Exception`` there ignored as in Python. A call of another shape (keywords, another
 * count of arguments) is the Python function's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "spancore.h"
#include "sql.h"
#include "within.h"

/* Set by setup_sql(): see its docstring in spancore.c's method table. */
static PyObject *py_sql_span = NULL, *no_tags = NULL, *limits = NULL, *settings = NULL, *text = NULL,
                *params_text = NULL, *layer = NULL, *tag_type = NULL, *tag_instance = NULL, *tag_statement = NULL,
                *tag_parameters = NULL;
static PyTypeObject *span_class = NULL;
static PyObject *s_tag, *s_params_max, *s_where;

PyObject *swmp_setup_sql(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12 || !PyCallable_Check(args[0]) || !PyType_Check(args[1]) || !PyCallable_Check(args[5]) ||
        !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_sql(py_sql_span, span_class: type, no_tags, limits, settings, text, params_text, "
                        "layer, tag_type, tag_instance, tag_statement, tag_parameters)");
        return NULL;
    }
    if (s_tag == NULL && ((s_tag = PyUnicode_InternFromString("tag")) == NULL ||
                           (s_params_max = PyUnicode_InternFromString("params_max")) == NULL ||
                           (s_where = PyUnicode_InternFromString("_swmp_where")) == NULL)) {
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

/* The three tags of the query (``span`` of the recorded class): one list when they are the
 * span's first and the statement fits the tag limit, else one Span.tag call each (which
 * clips). */
static int tag_query(PyObject *span, PyObject *db_type, PyObject *instance, PyObject *statement) {
    statement = PyUnicode_CheckExact(statement) ? Py_NewRef(statement) : PyObject_CallOneArg(text, statement);
    if (statement == NULL) {
        return -1;
    }
    Py_ssize_t lim = swmp_tag_limit(limits);
    int r = -1;
    if (!(lim == -1 && PyErr_Occurred())) {
        if (swmp_span_tags(span) == no_tags && PyUnicode_Check(statement) && PyUnicode_GET_LENGTH(statement) <= lim) {
            PyObject *list = PyList_New(6);
            if (list != NULL) {
                PyObject *items[6] = {tag_type, db_type, tag_instance, instance, tag_statement, statement};
                for (int i = 0; i < 6; i++) {
                    PyList_SET_ITEM(list, i, Py_NewRef(items[i]));
                }
                swmp_span_set_tags(span, list);
                r = 0;
            }
        } else if (tag(span, tag_type, db_type) == 0 && tag(span, tag_instance, instance) == 0) {
            r = tag(span, tag_statement, statement);
        }
    }
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

/* The span of sql_span(op, address, component, db_type, instance, statement, params, many).
 * ``keep``: an Exception while tagging is cleared and the span returned as it is (SqlCall:
 * a span once made counts as open in its segment and must be run and finished); without
 * it the error is raised, as the Python function raises it. */
static PyObject *sql_exit(PyObject *const *args, PyObject *params, PyObject *many, int keep) {
    PyObject *exit_args[4] = {args[0], args[1], args[2], layer};
    PyObject *span = swmp_new_exit(exit_args);
    if (span == NULL || !Py_IS_TYPE(span, span_class)) {
        return span; /* not recorded (or the error new_exit_span raised): as it is */
    }
    if (tag_query(span, args[3], args[4], args[5]) < 0 || tag_parameters_of(span, params, many) < 0) {
        if (keep && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            return span;
        }
        Py_DECREF(span);
        return NULL;
    }
    return span;
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
    return sql_exit(args, nargs > 6 ? args[6] : Py_None, nargs > 7 ? args[7] : Py_False, 0);
}

/* SqlCall: a DB-API cursor's ``execute(query, params=None)`` run inside its exit span, called
 * by the Gate (gate.c) only while a span is current.
 *
 * Why: the Python form (``_datastore.cursor_method``'s ``straced``, psycopg2's
 * ``traced_execute``) is three Python frames per traced query (the wrapper, the connection's
 * ``(peer, database)`` memo, the guarded span start), run between the driver's round trips
 * with the CPU caches cold: each frame's bytecode, code object and globals cost their cache
 * lines there (docs/performance.md, "Where the real-server and end-to-end gap comes from").
 *
 * The common case only: ``(cursor, query)`` or ``(cursor, query, params)`` positionally (the
 * latter with any keywords, which go to the driver as they came), the query a str, the
 * cursor's connection (attribute ``conn_attr``) giving its ``(peer, database)`` either from its ``_swmp_where`` memo (kept there by the Python ``where`` the
 * first time: a pair, or with ``key_attr`` a ``(the connection's key attribute then, pair)``
 * that holds while that attribute is the same object) or from ``where(connection)`` (with
 * ``key_attr``, remembered here for the connection's ``key_attr`` object seen last: psycopg's
 * libpq connection, whose answer never changes). Every
 * other call, and a memo not made yet or out of date, goes to ``fallback`` (the Python form,
 * which makes the memo), as does an ``Exception`` before the span exists: the Python form
 * logs it once and runs the query untraced. (Once made, a span counts as open in its
 * segment: it is run and finished whatever happens while tagging it.) The driver's call
 * gets the caller's arguments unchanged; its result or exception reaches the caller
 * unchanged; the span's ``__exit__`` failing after the query is the agent's problem and is
 * cleared (the query happened: swmp_span_leave).
 *
 * ``awaiting`` (an async driver's ``execute``: aiomysql): the call returns the lazy
 * awaitable of within.c, which takes these steps at its first send, in the awaiting task,
 * as the Python ``async def`` form does, and runs the driver's coroutine inside the span. */
typedef struct {
    PyObject_HEAD
    PyObject *orig, *fallback, *op, *component, *db_type, *conn_attr, *where, *key_attr;
    PyObject *last; /* with ``where`` and ``key_attr``: the memo of where_remembered */
    int truthy;     /* params ``or None`` (cursor_method) rather than as given (psycopg2) */
    int awaiting;   /* an async driver's: the call is made at the awaitable's first send */
    vectorcallfunc vectorcall;
} SqlCall;

/* ``where(connection)`` remembered for the connection seen last, while its ``key_attr``
 * object is the one it had then. The memo is one tuple ``(connection, address of the key
 * object, pair)``, replaced at once: a thread never reads one key with another's pair. The
 * connection is held by a weak reference when it takes one, and the key by its address
 * only: a connection the application drops without closing it must be freed (and its server
 * session ended, psycopg's ``pgconn``) as without the agent, not kept by this memo. */
static int memo_matches(PyObject *last, PyObject *conn, PyObject *key) {
    PyObject *held = PyTuple_GET_ITEM(last, 0);
    int same = held == conn;
    if (PyWeakref_CheckRef(held)) {
#if PY_VERSION_HEX >= 0x030D0000 /* PyWeakref_GET_OBJECT is deprecated from 3.13 on */
        PyObject *was = NULL;
        if (PyWeakref_GetRef(held, &was) < 0) {
            PyErr_Clear();
        }
        same = was == conn;
        Py_XDECREF(was);
#else
        same = PyWeakref_GET_OBJECT(held) == conn; /* borrowed, compared only */
#endif
    }
    return same && PyLong_AsVoidPtr(PyTuple_GET_ITEM(last, 1)) == (void *)key;
}

static PyObject *where_remembered(SqlCall *c, PyObject *conn) {
    PyObject *key = swmp_optional_attr(conn, c->key_attr);
    if (key == NULL) {
        return NULL;
    }
    PyObject *last = Py_XNewRef(c->last), *pair = NULL;
    if (last != NULL && memo_matches(last, conn, key)) {
        pair = Py_NewRef(PyTuple_GET_ITEM(last, 2));
    }
    Py_XDECREF(last);
    if (pair == NULL) {
        pair = PyObject_CallOneArg(c->where, conn);
        if (pair != NULL && PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2) {
            PyObject *held = PyWeakref_NewRef(conn, NULL);
            if (held == NULL) {
                PyErr_Clear(); /* a connection without weak references: held as it is */
                held = Py_NewRef(conn);
            }
            PyObject *address = PyLong_FromVoidPtr(key);
            PyObject *memo = address == NULL ? NULL : PyTuple_Pack(3, held, address, pair);
            Py_DECREF(held);
            Py_XDECREF(address);
            if (memo == NULL) {
                PyErr_Clear(); /* not remembered: asked again next time */
            } else {
                Py_XSETREF(c->last, memo);
            }
        }
    }
    Py_DECREF(key);
    return pair;
}

/* ``(peer, database)`` of the cursor's connection as a new reference, NULL without an error
 * when the fallback must work it out, NULL with an error when that failed. */
static PyObject *where_of(SqlCall *c, PyObject *cursor) {
    PyObject *conn = PyObject_GetAttr(cursor, c->conn_attr);
    if (conn == NULL || conn == Py_None) {
        Py_XDECREF(conn);
        return NULL;
    }
    /* No memo yet (NULL without an error): the fallback makes it. */
    PyObject *pair = c->where == Py_None      ? swmp_optional_attr(conn, s_where)
                     : c->key_attr != Py_None ? where_remembered(c, conn)
                                              : PyObject_CallOneArg(c->where, conn);
    if (pair != NULL && c->where == Py_None && c->key_attr != Py_None) {
        PyObject *memo = pair, *key = NULL;
        pair = NULL;
        if (PyTuple_CheckExact(memo) && PyTuple_GET_SIZE(memo) == 2 &&
            (key = swmp_optional_attr(conn, c->key_attr)) != NULL && key == PyTuple_GET_ITEM(memo, 0)) {
            pair = Py_NewRef(PyTuple_GET_ITEM(memo, 1));
        }
        Py_XDECREF(key);
        Py_DECREF(memo);
    }
    Py_DECREF(conn);
    if (pair != NULL && !(PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2)) {
        Py_CLEAR(pair);
    }
    return pair;
}

static PyObject *sqlcall_fallback(SqlCall *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(c->fallback, args, nargsf, kwnames);
}

/* The span of this call (not entered), or NULL without an error when the call is the
 * fallback's, or NULL with an error that is not an Exception. */
static PyObject *sql_open(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    SqlCall *c = (SqlCall *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* Keywords only beside positional parameters (psycopg's ``Connection.execute`` passes
     * ``prepare=``): with the query and its parameters given by position, a keyword is the
     * driver's own option, not one this span reads. */
    if ((kwnames != NULL && nargs != 3) || nargs < 2 || nargs > 3 || !PyUnicode_CheckExact(args[1]) ||
        py_sql_span == NULL) {
        return NULL;
    }
    PyObject *params = nargs == 3 ? args[2] : Py_None;
    if (c->truthy && params != Py_None) {
        int truth = PyObject_IsTrue(params);
        if (truth < 0) {
            PyErr_Clear(); /* the Python form decides what to do with it */
            return NULL;
        }
        params = truth ? params : Py_None;
    }
    PyObject *pair = where_of(c, args[0]);
    if (pair == NULL) {
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear(); /* KeyboardInterrupt and the like stay: as the Python form lets them go */
        }
        return NULL;
    }
    PyObject *span_args[6] = {c->op, PyTuple_GET_ITEM(pair, 0), c->component, c->db_type, PyTuple_GET_ITEM(pair, 1),
                              args[1]};
    PyObject *span = sql_exit(span_args, params, Py_False, 1);
    Py_DECREF(pair);
    if (span == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear(); /* no span was made: the Python form meets it again and logs it once */
    }
    return span;
}

/* sql_open as within.c's lazy form calls it. */
static PyObject *sql_open_lazy(PyObject *callable, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                              swmp_within_after *after) {
    return sql_open(callable, &PyTuple_GET_ITEM(*argv, 0), (size_t)nargs, *kwnames);
}

static PyObject *sqlcall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    SqlCall *c = (SqlCall *)callable;
    if (c->awaiting) {
        return swmp_within_lazy(sql_open_lazy, callable, c->orig, c->fallback, args, nargsf, kwnames);
    }
    PyObject *span = sql_open(callable, args, nargsf, kwnames);
    if (span == NULL) {
        return PyErr_Occurred() ? NULL : sqlcall_fallback(c, args, nargsf, kwnames);
    }
    if (swmp_span_enter(span) < 0) { /* as ``span.__enter__()`` in the Python form: raised */
        Py_DECREF(span);
        return NULL;
    }
    PyObject *result = swmp_span_leave(span, PyObject_Vectorcall(c->orig, args, nargsf, kwnames));
    Py_DECREF(span);
    return result;
}

static PyObject *sqlcall_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *orig, *fallback, *op, *component, *db_type, *conn_attr, *where, *key_attr;
    int truthy, awaiting = 0;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "SqlCall() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOUOUUOOp|p:SqlCall", &orig, &fallback, &op, &component, &db_type,
                          &conn_attr, &where, &key_attr, &truthy, &awaiting)) {
        return NULL;
    }
    if (!PyCallable_Check(orig) || !PyCallable_Check(fallback) || (where != Py_None && !PyCallable_Check(where)) ||
        (key_attr != Py_None && !PyUnicode_Check(key_attr))) {
        PyErr_SetString(PyExc_TypeError,
                        "SqlCall(orig, fallback, op: str, component, db_type: str, conn_attr: str, where: callable | "
                        "None, key_attr: str | None, truthy: bool, awaiting: bool = False)");
        return NULL;
    }
    SqlCall *c = (SqlCall *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    PyObject **slots[] = {&c->orig, &c->fallback, &c->op, &c->component, &c->db_type, &c->conn_attr, &c->where,
                          &c->key_attr};
    PyObject *values[] = {orig, fallback, op, component, db_type, conn_attr, where, key_attr};
    for (int i = 0; i < 8; i++) {
        *slots[i] = Py_NewRef(values[i]);
    }
    c->truthy = truthy;
    c->awaiting = awaiting;
    c->vectorcall = sqlcall_vectorcall;
    return (PyObject *)c;
}

static int sqlcall_traverse(SqlCall *c, visitproc visit, void *arg) {
    Py_VISIT(c->orig);
    Py_VISIT(c->fallback);
    Py_VISIT(c->op);
    Py_VISIT(c->component);
    Py_VISIT(c->db_type);
    Py_VISIT(c->conn_attr);
    Py_VISIT(c->where);
    Py_VISIT(c->key_attr);
    Py_VISIT(c->last);
    return 0;
}

static int sqlcall_clear(SqlCall *c) {
    Py_CLEAR(c->orig);
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->op);
    Py_CLEAR(c->component);
    Py_CLEAR(c->db_type);
    Py_CLEAR(c->conn_attr);
    Py_CLEAR(c->where);
    Py_CLEAR(c->key_attr);
    Py_CLEAR(c->last);
    return 0;
}

static void sqlcall_dealloc(SqlCall *c) {
    PyObject_GC_UnTrack(c);
    sqlcall_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *sqlcall_repr(SqlCall *c) {
    return PyUnicode_FromFormat("<swmp SqlCall %U of %R>", c->op, c->orig);
}

PyTypeObject swmp_SqlCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SqlCall",
    .tp_basicsize = sizeof(SqlCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "SqlCall(orig, fallback, op, component, db_type, conn_attr, where, key_attr, truthy, awaiting=False): a "
              "cursor's execute(query, params=None) run in its SQL exit span; other calls go to fallback.",
    .tp_new = sqlcall_new,
    .tp_dealloc = (destructor)sqlcall_dealloc,
    .tp_traverse = (traverseproc)sqlcall_traverse,
    .tp_clear = (inquiry)sqlcall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SqlCall, vectorcall),
    .tp_repr = (reprfunc)sqlcall_repr,
};
