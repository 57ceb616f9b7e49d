/* asgi_entry(scope, component, collect_params, params_limit): the entry span of an ASGI
 * HTTP request, swmp/instrument/asgi.py's ``_entry`` with its common case in C.
 *
 * Why: the Python entry (the scope's fields, one pass over the header list, the URL, the
 * tag list) ran ~210 bytecodes per request, a third of what the instrumentation of Django
 * under ASGI added over bare Django; Starlette, FastAPI and Falcon's ASGI app pay it too.
 *
 * What it does is exactly the Python entry's: a scope of another type than "http" passes
 * through (None); the header list is read for host, sw8, sw8-correlation and sw8-x
 * (ASCII case-insensitively, the last of a repeated name winning); an incoming sw8 is
 * decoded by the Python ``from_headers`` (an sw8 alone from a known caller: read by the
 * span core, the span made from its parts, swmp_sw8_span); the span comes from entry_root
 * (start.c) or the Python decide_entry_span; a recorded span gets ``http.method`` /
 * ``http.url`` and the client as peer. Anything outside the plain shapes (a scope that is not a dict, a
 * method or path that is not a non-empty str, a method ignore list, a header list that is
 * not a list or tuple of (bytes, value) pairs) goes to the Python entry (``py_entry``)
 * before any span is made, and a recorded span whose host, scheme or root path are not
 * plain, or whose query string is collected, is tagged by the Python code
 * (``tag_request``). As in Python, a failure while tagging leaves the span as it is. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "asgi.h"
#include "join.h"
#include "spancore.h"
#include "web_entry.h"

/* Set by setup_asgi(): see its docstring in spancore.c's method table. */
static PyObject *py_entry = NULL, *tag_request = NULL, *decide_entry = NULL, *from_headers = NULL,
                *request_tags = NULL, *noop = NULL, *policy = NULL, *limits = NULL, *layer = NULL,
                *tag_method = NULL, *tag_url = NULL, *no_tags = NULL;
static PyTypeObject *span_class = NULL;
static PyObject *k_type, *k_method, *k_path, *k_headers, *k_scheme, *k_root_path, *k_server, *k_client, *v_http,
    *s_peer, *s_max_elements, *s_max_length, *empty_text,
    *default_scheme, *empty_server, *colon, *scheme_end, *index_0, *index_1;

PyObject *swmp_setup_asgi(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 13 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2]) ||
        !PyCallable_Check(args[3]) || !PyCallable_Check(args[4]) || !PyType_Check(args[6]) ||
        !PyUnicode_CheckExact(args[10]) || !PyUnicode_CheckExact(args[11])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_asgi(py_entry, tag_request, decide_entry_span, from_headers, request_tags, noop, "
                        "span_class: type, policy, limits, layer, tag_method: str, tag_url: str, no_tags)");
        return NULL;
    }
    if (index_1 == NULL) { /* the last one made: a set-up that failed part way is made again */
#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) { \
        return NULL;                                        \
    }
        INTERN(k_type, "type");
        INTERN(k_method, "method");
        INTERN(k_path, "path");
        INTERN(k_headers, "headers");
        INTERN(k_scheme, "scheme");
        INTERN(k_root_path, "root_path");
        INTERN(k_server, "server");
        INTERN(k_client, "client");
        INTERN(v_http, "http");
        INTERN(s_peer, "peer");
        INTERN(s_max_elements, "correlation_max_elements");
        INTERN(s_max_length, "correlation_max_value_length");
        INTERN(empty_text, "");
        INTERN(default_scheme, "http");
        INTERN(colon, ":");
        INTERN(scheme_end, "://");
#undef INTERN
        if ((empty_server = Py_BuildValue("(ss)", "", "")) == NULL || (index_0 = PyLong_FromLong(0)) == NULL ||
            (index_1 = PyLong_FromLong(1)) == NULL) {
            return NULL;
        }
    }
    PyObject **slots[] = {&py_entry, &tag_request, &decide_entry, &from_headers, &request_tags, &noop,
                          (PyObject **)&span_class, &policy, &limits, &layer, &tag_method, &tag_url, &no_tags};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

/* The Python entry, with the caller's four arguments. */
static PyObject *python_entry(PyObject *const *args) {
    return PyObject_Vectorcall(py_entry, args, 4, NULL);
}

/* Which wanted header a name is: 0 host, 1 sw8, 2 sw8-correlation, 3 sw8-x, -1 none. ASCII
 * case-insensitive, as the Python scan's lower() and look-up. */
static int wanted_index(PyObject *name) {
    static const char *const names[] = {"host", "sw8", "sw8-correlation", "sw8-x"};
    static const Py_ssize_t lengths[] = {4, 3, 15, 5};
    Py_ssize_t n = PyBytes_GET_SIZE(name);
    const char *bytes = PyBytes_AS_STRING(name);
    for (int i = 0; i < 4; i++) {
        if (n != lengths[i]) {
            continue;
        }
        Py_ssize_t j = 0;
        for (; j < n; j++) {
            char c = bytes[j];
            if (c >= 'A' && c <= 'Z') {
                c = (char)(c - 'A' + 'a');
            }
            if (c != names[i][j]) {
                break;
            }
        }
        return j == n ? i : -1;
    }
    return -1;
}

/* Fill found[4] (borrowed) from an ASGI header list; 0 when it is not of the plain shape. */
static int scan_headers(PyObject *headers, PyObject *found[4]) {
    if (headers == NULL || headers == Py_None) {
        return 1;
    }
    if (!PyList_CheckExact(headers) && !PyTuple_CheckExact(headers)) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(headers);
    PyObject **items = PySequence_Fast_ITEMS(headers);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = items[i];
        if ((!PyTuple_CheckExact(pair) && !PyList_CheckExact(pair)) || PySequence_Fast_GET_SIZE(pair) != 2) {
            return 0;
        }
        PyObject *name = PySequence_Fast_GET_ITEM(pair, 0);
        if (!PyBytes_CheckExact(name)) {
            return 0;
        }
        int at = wanted_index(name);
        if (at >= 0) {
            found[at] = PySequence_Fast_GET_ITEM(pair, 1);
        }
    }
    return 1;
}

/* f"{a}:{b}" */
static PyObject *host_port(PyObject *a, PyObject *b) {
    PyObject *fa = PyObject_Format(a, empty_text);
    PyObject *fb = fa == NULL ? NULL : PyObject_Format(b, empty_text);
    PyObject *out = NULL;
    if (fb != NULL) {
        PyObject *parts[3] = {fa, colon, fb};
        out = swmp_join(parts, 3);
    }
    Py_XDECREF(fa);
    Py_XDECREF(fb);
    return out;
}

/* scope.get(key) as a borrowed reference, NULL when absent (an error set only on failure). */
static PyObject *field(PyObject *scope, PyObject *key) {
    return PyDict_GetItemWithError(scope, key);
}

/* asgi.py's ``_under(path, root)``: 1 when ``path`` (a str) starts with the non-empty str
 * ``root`` at a segment boundary, 0 when not, -1 on an error. */
static int under_root(PyObject *path, PyObject *root) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(root);
    if (n == 0 || !PyUnicode_CheckExact(path)) {
        return 0;
    }
    Py_ssize_t match = PyUnicode_Tailmatch(path, root, 0, n, -1);
    if (match <= 0) {
        return match < 0 ? -1 : 0;
    }
    return PyUnicode_GET_LENGTH(path) == n || PyUnicode_READ_CHAR(path, n) == '/' ||
           PyUnicode_READ_CHAR(root, n - 1) == '/';
}

/* A plain request's ``http.url``, or NULL with no error set when the Python code must build
 * it (host, scheme or root path of another shape). */
static PyObject *request_url(PyObject *scope, PyObject *host, PyObject *path) {
    PyObject *host_text;
    if (host != NULL && PyBytes_CheckExact(host) && PyBytes_GET_SIZE(host) > 0) {
        host_text = PyUnicode_DecodeLatin1(PyBytes_AS_STRING(host), PyBytes_GET_SIZE(host), NULL);
    } else if (host == NULL || host == Py_None || (PyBytes_CheckExact(host) && PyBytes_GET_SIZE(host) == 0)) {
        PyObject *server = field(scope, k_server); /* ``scope.get("server") or ("", "")`` */
        int truth = server == NULL ? 0 : PyObject_IsTrue(server);
        if (truth < 0) {
            return NULL;
        }
        server = truth ? server : empty_server;
        if (!PyTuple_CheckExact(server) || PyTuple_GET_SIZE(server) != 2) {
            return NULL;
        }
        Py_INCREF(server); /* held: formatting may run Python code */
        host_text = host_port(PyTuple_GET_ITEM(server, 0), PyTuple_GET_ITEM(server, 1));
        Py_DECREF(server);
    } else {
        return NULL;
    }
    if (host_text == NULL) {
        return NULL;
    }
    PyObject *scheme = field(scope, k_scheme);
    PyObject *root = scheme == NULL && PyErr_Occurred() ? NULL : field(scope, k_root_path);
    PyObject *url = NULL;
    if (!PyErr_Occurred()) {
        scheme = scheme == NULL ? default_scheme : scheme;
        root = root == NULL ? empty_text : root;
        int under = PyUnicode_CheckExact(scheme) && PyUnicode_CheckExact(root) ? under_root(path, root) : 0;
        if (under < 0) {
            Py_DECREF(host_text);
            return NULL;
        }
        if (under) {
            root = empty_text; /* the server put root_path in path already (asgi.py: _under) */
        }
        if (PyUnicode_CheckExact(scheme) && PyUnicode_CheckExact(root)) {
            PyObject *parts[5] = {scheme, scheme_end, host_text, root, path};
            url = swmp_join(parts, 5);
        }
    }
    Py_DECREF(host_text);
    return url;
}

/* The entry span's tags and peer, as the Python entry sets them; 0 when the Python code
 * (tag_request) must do it, -1 on a failure (the span is kept as it is). */
static int tag_plain(PyObject *span, PyObject *scope, PyObject *method, PyObject *path, PyObject *host) {
    PyObject *url = request_url(scope, host, path);
    if (url == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    SwmpRequestTags parts = {request_tags, limits, no_tags, tag_method, tag_url};
    int done = swmp_request_tags(&parts, span, method, url);
    Py_DECREF(url);
    if (done < 0) {
        return -1;
    }
    PyObject *client = field(scope, k_client);
    if (client == NULL) {
        return PyErr_Occurred() ? -1 : 1;
    }
    Py_INCREF(client); /* held: its truth, items and their formatting may run Python code */
    int truth = PyObject_IsTrue(client);
    if (truth <= 0) {
        Py_DECREF(client);
        return truth < 0 ? -1 : 1;
    }
    /* f"{client[0]}:{client[1]}" */
    PyObject *a = PyObject_GetItem(client, index_0);
    PyObject *b = a == NULL ? NULL : PyObject_GetItem(client, index_1);
    PyObject *peer = b == NULL ? NULL : host_port(a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_DECREF(client);
    done = peer == NULL ? -1 : PyObject_SetAttr(span, s_peer, peer);
    Py_XDECREF(peer);
    return done < 0 ? -1 : 1;
}

/* The carrier of an incoming sw8 (None when absent or bad), by the Python from_headers. */
static PyObject *carrier_of(PyObject *found[4]) {
    if (found[1] == NULL) {
        return Py_NewRef(Py_None);
    }
    PyObject *max_elements = PyObject_GetAttr(limits, s_max_elements);
    PyObject *max_length = max_elements == NULL ? NULL : PyObject_GetAttr(limits, s_max_length);
    PyObject *carrier = NULL;
    if (max_length != NULL) {
        PyObject *call[5] = {found[1], found[2] ? found[2] : Py_None, found[3] ? found[3] : Py_None, max_elements,
                             max_length};
        carrier = PyObject_Vectorcall(from_headers, call, 5, NULL);
    }
    Py_XDECREF(max_elements);
    Py_XDECREF(max_length);
    return carrier;
}

/* An sw8 alone (``found``'s correlation and extension headers absent or None) as the str
 * decode_sw8 reads (an exact str, or exact bytes decoded as ASCII): a new reference, or
 * NULL (no error set) when from_headers must decide. */
static PyObject *plain_sw8_text(PyObject *found[4]) {
    PyObject *sw8 = found[1];
    if (sw8 == NULL || (found[2] != NULL && found[2] != Py_None) || (found[3] != NULL && found[3] != Py_None)) {
        return NULL;
    }
    if (PyUnicode_CheckExact(sw8)) {
        return Py_NewRef(sw8);
    }
    if (!PyBytes_CheckExact(sw8)) {
        return NULL;
    }
    PyObject *text = PyUnicode_DecodeASCII(PyBytes_AS_STRING(sw8), PyBytes_GET_SIZE(sw8), "strict");
    if (text == NULL) {
        PyErr_Clear(); /* not ASCII: decode_sw8 refuses it (and says so) */
    }
    return text;
}

/* The request's span (new reference, or NULL with an error): from an sw8 alone by
 * swmp_sw8_span, else with from_headers' carrier by swmp_carrier_span. */
static PyObject *make_span(PyObject *path, PyObject *component, PyObject *found[4]) {
    PyObject *entry[3] = {path, component, layer};
    PyObject *text = plain_sw8_text(found), *span = NULL;
    int plain = text == NULL ? 0 : swmp_sw8_span(entry, decide_entry, text, &span);
    Py_XDECREF(text);
    if (plain != 0) {
        return span;
    }
    PyObject *carrier = carrier_of(found);
    if (carrier == NULL) {
        return NULL;
    }
    span = swmp_carrier_span(entry, decide_entry, carrier);
    Py_DECREF(carrier);
    return span;
}

static PyObject *entry_of(PyObject *const *args) {
    PyObject *scope = args[0];
    if (!PyDict_CheckExact(scope)) {
        return python_entry(args);
    }
    PyObject *type = field(scope, k_type);
    if (type == NULL || !PyUnicode_CheckExact(type)) {
        return PyErr_Occurred() ? NULL : python_entry(args);
    }
    if (type != v_http && PyUnicode_CompareWithASCIIString(type, "http") != 0) {
        Py_RETURN_NONE; /* WebSocket, lifespan: not a request */
    }
    /* Ignored methods: asked by the Python entry (IgnoreRules keeps them in ``_methods``). */
    int ignoring = swmp_methods_ignored(policy);
    if (ignoring != 0) {
        return ignoring < 0 ? NULL : python_entry(args);
    }
    PyObject *method = field(scope, k_method);
    PyObject *path = method == NULL ? NULL : field(scope, k_path);
    PyObject *headers = path == NULL ? NULL : field(scope, k_headers);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *found[4] = {NULL, NULL, NULL, NULL};
    if (path == NULL || !PyUnicode_CheckExact(method) || !PyUnicode_CheckExact(path) ||
        PyUnicode_GET_LENGTH(method) == 0 || PyUnicode_GET_LENGTH(path) == 0 || !scan_headers(headers, found)) {
        return python_entry(args);
    }
    /* Held from here: from_headers, decide_entry_span and the tags' formatting run Python code. */
    for (int i = 0; i < 4; i++) {
        Py_XINCREF(found[i]);
    }
    Py_INCREF(method);
    Py_INCREF(path);
    PyObject *span = make_span(path, args[1], found);
    if (span == noop) {
        Py_SETREF(span, Py_NewRef(Py_None));
    } else if (span != NULL && Py_IS_TYPE(span, span_class)) {
        int collect = PyObject_IsTrue(args[2]);
        if (collect < 0) {
            PyErr_Clear(); /* the Python code asks again, inside its own guard */
        }
        int r = collect != 0 ? 0 : tag_plain(span, scope, method, path, found[0]);
        if (r == 0) {
            PyObject *call[7] = {span, scope, method, path, found[0] ? found[0] : Py_None, args[2], args[3]};
            PyObject *done = PyObject_Vectorcall(tag_request, call, 7, NULL);
            r = done == NULL ? -1 : 1;
            Py_XDECREF(done);
        }
        if (r < 0) {
            PyErr_Clear(); /* as the Python entry: the span as it is */
        }
    }
    for (int i = 0; i < 4; i++) {
        Py_XDECREF(found[i]);
    }
    Py_DECREF(method);
    Py_DECREF(path);
    return span;
}

PyObject *swmp_asgi_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "asgi_entry(scope, component, collect_params, params_limit)");
        return NULL;
    }
    if (py_entry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_asgi() was not called");
        return NULL;
    }
    PyObject *span = entry_of(args);
    if (span == NULL) { /* as the Python entry: a request the tracing failed on goes untraced */
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL; /* KeyboardInterrupt, SystemExit: the Python entry lets them through */
        }
        PyErr_Clear();
        span = Py_NewRef(Py_None);
    }
    return span;
}
