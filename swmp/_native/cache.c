/* CacheCall: one cache command (redis-py's ``execute_command``, a pymemcache ``Client``
 * method) run inside its exit span, called by the Gate (gate.c) only while a span is current.
 *
 * Why: the Python form is four to five Python frames per traced command (redis-py: the
 * wrapper, the command's memoized names, the pool's ``(peer, db)`` memo, ``cache_span``),
 * run between the client's round trips with the CPU caches cold: each frame's bytecode,
 * code object and globals cost their cache lines there (docs/performance.md, "Where the
 * real-server and end-to-end gap comes from"). The same reasoning as SqlCall in sql.c.
 *
 * The common case only, every step as the Python form takes it:
 *   - the command's ``(operation, cache.cmd, first tags)``: ``info`` itself (one pymemcache
 *     method), or ``info[args[1]]`` (redis-py's memo of the command names it has seen);
 *   - the peer and ``db.instance``: ``holder = getattr(args[0], holder_attr)`` (redis-py's
 *     connection pool, pymemcache's server), then either the pair the Python form keeps on
 *     the holder as ``_swmp_where`` (``addresses`` None) or ``(addresses[holder], "")``;
 *   - the key: ``args[key_index]`` when there is one (``key_required``: there must be) and
 *     keys are collected, a str;
 *   - the tags as the one list ``cache_span`` builds when they are the span's first and
 *     every value fits the tag limit.
 * Anything else (a name or holder not memoized yet, a key that is not a str, a value over
 * the limit, too few arguments) goes to ``fallback``, the Python form, which also makes the
 * memos; so does an ``Exception`` while working the span out (the Python form logs it once
 * and runs the command untraced). The client gets the caller's arguments and keywords
 * unchanged; its result or exception reaches the caller unchanged; the span's ``__exit__``
 * failing after the command ran is the agent's problem and is cleared.
 *
 * ``awaiting`` (redis.asyncio): the call returns within.c's lazy awaitable, which takes
 * these steps at its first send, in the awaiting task, as the Python ``async def`` form
 * does, and runs the client's coroutine inside the span. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "cache.h"
#include "spancore.h"
#include "within.h"

/* Set by setup_cache(): see its docstring in spancore.c's method table. */
static PyObject *no_tags = NULL, *limits = NULL, *settings = NULL, *layer = NULL, *tag_key = NULL,
                *tag_instance = NULL, *empty = NULL;
static PyTypeObject *span_class = NULL;
static PyObject *s_collect_keys, *s_where;

PyObject *swmp_setup_cache(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyType_Check(args[0]) || !PyUnicode_Check(args[5]) || !PyUnicode_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_cache(span_class: type, no_tags, limits, settings, layer, tag_key: str, "
                        "tag_instance: str)");
        return NULL;
    }
    if (empty == NULL && ((s_collect_keys = PyUnicode_InternFromString("collect_keys")) == NULL ||
                           (s_where = PyUnicode_InternFromString("_swmp_where")) == NULL ||
                           (empty = PyUnicode_InternFromString("")) == NULL)) {
        return NULL;
    }
    PyObject **slots[] = {(PyObject **)&span_class, &no_tags, &limits, &settings, &layer, &tag_key, &tag_instance};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *orig, *fallback, *component, *cache_type, *info, *holder_attr, *addresses;
    Py_ssize_t key_index;
    int key_required; /* a call without args[key_index] is the fallback's (a key by keyword) */
    int awaiting;     /* an async client's (redis.asyncio): made at the awaitable's first send */
    vectorcallfunc vectorcall;
} CacheCall;

/* An attribute read for the common case: a new reference, or NULL with no error left (the
 * fallback decides) unless the error is not an Exception (KeyboardInterrupt...). */
static PyObject *attr_or_null(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
    }
    return v;
}

/* ``(operation, cache.cmd, first tags)`` of this call as a new reference; NULL: the
 * fallback's. A new reference because the memo dict it comes from is the tuple's only owner
 * and is emptied when full (redis.py's ``_command_info``): any Python code run before the span
 * is tagged (an attribute read of the client, another thread taking the GIL, a finalizer)
 * could otherwise free it under us. */
static PyObject *info_of(CacheCall *c, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *info = c->info;
    if (PyDict_CheckExact(info)) {
        if (nargs < 2) {
            return NULL;
        }
        info = PyDict_GetItemWithError(info, args[1]); /* borrowed */
        if (info == NULL) {
            PyErr_Clear(); /* not seen yet, or unhashable: the Python form memoizes it */
            return NULL;
        }
    }
    if (!PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(info, 1)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(info, 2))) {
        return NULL;
    }
    return Py_NewRef(info);
}

/* ``(peer, db.instance)`` as a new reference; NULL: the fallback's (an error is left set
 * only when it is not an Exception). */
static PyObject *where_of(CacheCall *c, PyObject *client) {
    PyObject *holder = attr_or_null(client, c->holder_attr);
    if (holder == NULL) {
        return NULL;
    }
    PyObject *pair = NULL;
    if (c->addresses == Py_None) {
        pair = attr_or_null(holder, s_where);
        if (pair != NULL && !(PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 &&
                              PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) && PyUnicode_Check(PyTuple_GET_ITEM(pair, 1)))) {
            Py_CLEAR(pair);
        }
    } else if (PyTuple_CheckExact(holder)) { /* the Python form memoizes tuples only this way */
        PyObject *address = PyDict_GetItemWithError(c->addresses, holder);
        if (address == NULL) {
            PyErr_Clear();
        } else if (PyUnicode_Check(address)) {
            pair = PyTuple_Pack(2, address, empty);
        }
    }
    Py_DECREF(holder);
    return pair;
}

/* Whether every tag value fits the tag limit (cache_span's common case): 1, 0, -1 error.
 * Decided before the span exists: a span once made is in its segment's count of open spans
 * and must be finished, so the fallback cannot be chosen after it. */
static int tags_fit(PyObject *head, PyObject *key, PyObject *instance) {
    Py_ssize_t lim = swmp_tag_limit(limits);
    if (lim == -1 && PyErr_Occurred()) {
        return -1;
    }
    PyObject *cmd = PyTuple_GET_SIZE(head) >= 4 ? PyTuple_GET_ITEM(head, 3) : NULL;
    return cmd != NULL && PyUnicode_Check(cmd) && PyUnicode_GET_LENGTH(cmd) <= lim &&
           (key == NULL || PyUnicode_GET_LENGTH(key) <= lim) && PyUnicode_GET_LENGTH(instance) <= lim;
}

/* The span's tags (``span`` of the recorded class) as the one list cache_span builds: the
 * command's first tags, the key, the instance (when not empty). */
static int set_tags(PyObject *span, PyObject *head, PyObject *key, PyObject *instance) {
    Py_ssize_t nhead = PyTuple_GET_SIZE(head);
    Py_ssize_t has_instance = PyUnicode_GET_LENGTH(instance) > 0;
    PyObject *list = PyList_New(nhead + (key != NULL ? 2 : 0) + 2 * has_instance);
    if (list == NULL) {
        return -1;
    }
    Py_ssize_t i = 0;
    for (; i < nhead; i++) {
        PyList_SET_ITEM(list, i, Py_NewRef(PyTuple_GET_ITEM(head, i)));
    }
    if (key != NULL) {
        PyList_SET_ITEM(list, i++, Py_NewRef(tag_key));
        PyList_SET_ITEM(list, i++, Py_NewRef(key));
    }
    if (has_instance) {
        PyList_SET_ITEM(list, i++, Py_NewRef(tag_instance));
        PyList_SET_ITEM(list, i++, Py_NewRef(instance));
    }
    swmp_span_set_tags(span, list);
    return 0;
}

/* Whether keys are collected (the setting's truth; 1, 0, -1 error). */
static int collecting_keys(void) {
    PyObject *v = PyObject_GetAttr(settings, s_collect_keys);
    int r = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    return r;
}

/* The span of this call (recorded or not) as a new reference; NULL with no error: the
 * fallback's; NULL with an error: raised (not an Exception). */
static PyObject *open_span(CacheCall *c, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *info = info_of(c, args, nargs); /* held until the span is tagged: see info_of */
    if (info == NULL) {
        return NULL;
    }
    PyObject *key = NULL, *pair = NULL, *span = NULL;
    if (nargs <= c->key_index && c->key_required) {
        goto fallback;
    }
    if (nargs > c->key_index) {
        int collect = collecting_keys();
        if (collect < 0) {
            goto declined;
        }
        if (collect) {
            key = args[c->key_index];
            if (!PyUnicode_CheckExact(key)) {
                goto fallback; /* bytes, lists of keys...: the Python form's text() */
            }
        }
    }
    pair = where_of(c, args[0]);
    if (pair == NULL) {
        goto declined;
    }
    PyObject *head = PyTuple_GET_ITEM(info, 2), *instance = PyTuple_GET_ITEM(pair, 1);
    int fit = tags_fit(head, key, instance);
    if (fit < 0) {
        goto declined;
    }
    if (fit == 0) {
        goto fallback; /* a value to clip: the Python form's */
    }
    PyObject *exit_args[4] = {PyTuple_GET_ITEM(info, 0), PyTuple_GET_ITEM(pair, 0), c->component, layer};
    span = swmp_new_exit(exit_args);
    if (span != NULL && Py_IS_TYPE(span, span_class) && set_tags(span, head, key, instance) < 0) {
        /* The span exists (and counts as open in its segment): it runs untagged rather than
         * not at all. Not expected: a fresh span takes a list. */
        PyErr_Clear();
    }
    if (span == NULL) {
        goto declined;
    }
    Py_DECREF(pair);
    Py_DECREF(info);
    return span;
declined:
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
    }
fallback:
    Py_XDECREF(pair);
    Py_DECREF(info);
    return NULL;
}

/* The span of a call with ``nargs`` positional arguments (see open_span). */
static PyObject *span_of(CacheCall *c, PyObject *const *args, Py_ssize_t nargs) {
    return nargs < 1 || span_class == NULL ? NULL : open_span(c, args, nargs);
}

/* span_of as within.c's lazy form calls it. */
static PyObject *span_of_lazy(PyObject *callable, PyObject **argv, PyObject **kwnames, Py_ssize_t nargs,
                             swmp_within_after *after) {
    return span_of((CacheCall *)callable, &PyTuple_GET_ITEM(*argv, 0), nargs);
}

static PyObject *cachecall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    CacheCall *c = (CacheCall *)callable;
    if (c->awaiting) {
        return swmp_within_lazy(span_of_lazy, callable, c->orig, c->fallback, args, nargsf, kwnames);
    }
    PyObject *span = span_of(c, args, PyVectorcall_NARGS(nargsf));
    if (span == NULL) {
        return PyErr_Occurred() ? NULL : PyObject_Vectorcall(c->fallback, args, nargsf, kwnames);
    }
    if (swmp_span_enter(span) < 0) { /* as ``span.__enter__()`` in the Python form: raised */
        Py_DECREF(span);
        return NULL;
    }
    PyObject *result = swmp_span_leave(span, PyObject_Vectorcall(c->orig, args, nargsf, kwnames));
    Py_DECREF(span);
    return result;
}

static PyObject *cachecall_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *orig, *fallback, *component, *cache_type, *info, *holder_attr, *addresses;
    Py_ssize_t key_index;
    int key_required, awaiting = 0;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "CacheCall() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOUOUOnp|p:CacheCall", &orig, &fallback, &component, &cache_type, &info,
                          &holder_attr, &addresses, &key_index, &key_required, &awaiting)) {
        return NULL;
    }
    if (!PyCallable_Check(orig) || !PyCallable_Check(fallback) || !(PyDict_CheckExact(info) || PyTuple_CheckExact(info)) ||
        !(addresses == Py_None || PyDict_CheckExact(addresses)) || key_index < 1) {
        PyErr_SetString(PyExc_TypeError,
                        "CacheCall(orig, fallback, component, cache_type: str, info: dict | tuple, holder_attr: str, "
                        "addresses: dict | None, key_index: int >= 1, key_required: bool, awaiting: bool = False)");
        return NULL;
    }
    CacheCall *c = (CacheCall *)type->tp_alloc(type, 0);
    if (c == NULL) {
        return NULL;
    }
    PyObject **slots[] = {&c->orig, &c->fallback, &c->component, &c->cache_type, &c->info, &c->holder_attr, &c->addresses};
    PyObject *values[] = {orig, fallback, component, cache_type, info, holder_attr, addresses};
    for (int i = 0; i < 7; i++) {
        *slots[i] = Py_NewRef(values[i]);
    }
    c->key_index = key_index;
    c->key_required = key_required;
    c->awaiting = awaiting;
    c->vectorcall = cachecall_vectorcall;
    return (PyObject *)c;
}

static int cachecall_traverse(CacheCall *c, visitproc visit, void *arg) {
    Py_VISIT(c->orig);
    Py_VISIT(c->fallback);
    Py_VISIT(c->component);
    Py_VISIT(c->cache_type);
    Py_VISIT(c->info);
    Py_VISIT(c->holder_attr);
    Py_VISIT(c->addresses);
    return 0;
}

static int cachecall_clear(CacheCall *c) {
    Py_CLEAR(c->orig);
    Py_CLEAR(c->fallback);
    Py_CLEAR(c->component);
    Py_CLEAR(c->cache_type);
    Py_CLEAR(c->info);
    Py_CLEAR(c->holder_attr);
    Py_CLEAR(c->addresses);
    return 0;
}

static void cachecall_dealloc(CacheCall *c) {
    PyObject_GC_UnTrack(c);
    cachecall_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *cachecall_repr(CacheCall *c) {
    return PyUnicode_FromFormat("<swmp CacheCall %U of %R>", c->cache_type, c->orig);
}

PyTypeObject swmp_CacheCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.CacheCall",
    .tp_basicsize = sizeof(CacheCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "CacheCall(orig, fallback, component, cache_type, info, holder_attr, addresses, key_index, key_required, "
              "awaiting=False): one cache "
              "command run in its exit span; other calls go to fallback.",
    .tp_new = cachecall_new,
    .tp_dealloc = (destructor)cachecall_dealloc,
    .tp_traverse = (traverseproc)cachecall_traverse,
    .tp_clear = (inquiry)cachecall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CacheCall, vectorcall),
    .tp_repr = (reprfunc)cachecall_repr,
};
