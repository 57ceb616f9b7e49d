/* wsgi_call(app, environ, start_response, component, collect_params, params_limit): a WSGI
 * request run inside its entry span: swmp/instrument/wsgi.py's ``trace_wsgi`` with its
 * common case in C.
 *
 * Why: trace_wsgi ran ~200 bytecodes in two Python frames on every request of every WSGI
 * application (the WSGI middleware, Flask, Django, Falcon, Pyramid, Bottle). In a server
 * well below saturation each request starts with the CPU caches cold, and interpreted code
 * then pays for every distinct bytecode, code object and dict entry it touches: with the
 * caches emptied between requests the middleware's added time was several times its warm
 * figure (docs/performance.md, "WSGI entry in C").
 *
 * What it does is exactly trace_wsgi's: the method (REQUEST_METHOD, else "GET") and path
 * (PATH_INFO, else "/"); an incoming sw8 (HTTP_SW8, with HTTP_SW8_CORRELATION and
 * HTTP_SW8_X) decoded by the Python ``from_headers`` (an sw8 alone from a known caller: read
 * by the span core, the span made from its parts, swmp_sw8_span in web_entry.c); the span from
 * entry_root (start.c) or the Python decide_entry_span; a recorded span entered, tagged ``http.method`` /
 * ``http.url`` and given the client as peer; the application called with a status recorder
 * (status.c); on an exception the span marked with it and finished, the exception passed
 * on unchanged; the context given back once the application returned; the span finished
 * now for a list or tuple body, else when the server closes the body (body.c).
 *
 * Anything outside the plain shapes goes to the Python code, before a span is made when it
 * is the environ's (``py_trace``: an environ that is not a dict, a method or path that is
 * not a str, a method ignore list, keyword arguments); a recorded span whose host, server,
 * scheme, script name or client fields are not strs, or whose query string is collected,
 * is tagged by ``tag_request``; a span that is not recorded (ignored, over a limit) runs
 * the application in ``run_unrecorded``'s ``with span:``. Where trace_wsgi would let the
 * agent's own failure escape into the server (making or entering the span, giving the
 * context back, finishing it), the request here goes on: untraced, or answered as the
 * application answered it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "body.h"
#include "join.h"
#include "spancore.h"
#include "status.h"
#include "web_entry.h"
#include "wsgi.h"

/* Set by setup_wsgi(): see its docstring in spancore.c's method table. */
static PyObject *py_trace = NULL, *tag_request = NULL, *run_unrecorded = NULL, *decide_entry = NULL,
                *from_headers = NULL, *request_tags = NULL, *noop = NULL, *policy = NULL, *limits = NULL,
                *layer = NULL, *tag_method = NULL, *tag_url = NULL, *no_tags = NULL, *current = NULL;
static PyTypeObject *span_class = NULL;
/* The Python ``_file_response(result, span)`` (swmp/instrument/wsgi.py), set by setup_wsgi_file(). */
static PyObject *py_file_response = NULL, *k_file_wrapper = NULL, *s_read = NULL;
static PyObject *k_method, *k_path, *k_sw8, *k_sw8_correlation, *k_sw8_x, *k_host, *k_server_name,
    *k_server_port, *k_scheme, *k_script, *k_remote, *k_remote_port, *s_peer,
    *s_max_elements, *s_max_length, *s_enter, *s_ended_by, *s_finish, *v_get, *v_root, *v_http, *empty_text, *colon,
    *scheme_end;

PyObject *swmp_setup_wsgi(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 15 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2]) ||
        !PyCallable_Check(args[3]) || !PyCallable_Check(args[4]) || !PyCallable_Check(args[5]) ||
        !PyType_Check(args[7]) || !PyUnicode_CheckExact(args[11]) || !PyUnicode_CheckExact(args[12]) ||
        !PyContextVar_CheckExact(args[14])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_wsgi(py_trace, tag_request, run_unrecorded, decide_entry_span, from_headers, "
                        "request_tags, noop, span_class: type, policy, limits, layer, tag_method: str, "
                        "tag_url: str, no_tags, current: ContextVar)");
        return NULL;
    }
    if (scheme_end == NULL) { /* the last one made: a set-up that failed part way is made again */
#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) { \
        return NULL;                                        \
    }
        INTERN(k_method, "REQUEST_METHOD");
        INTERN(k_path, "PATH_INFO");
        INTERN(k_sw8, "HTTP_SW8");
        INTERN(k_sw8_correlation, "HTTP_SW8_CORRELATION");
        INTERN(k_sw8_x, "HTTP_SW8_X");
        INTERN(k_host, "HTTP_HOST");
        INTERN(k_server_name, "SERVER_NAME");
        INTERN(k_server_port, "SERVER_PORT");
        INTERN(k_scheme, "wsgi.url_scheme");
        INTERN(k_script, "SCRIPT_NAME");
        INTERN(k_remote, "REMOTE_ADDR");
        INTERN(k_remote_port, "REMOTE_PORT");
        INTERN(s_peer, "peer");
        INTERN(s_max_elements, "correlation_max_elements");
        INTERN(s_max_length, "correlation_max_value_length");
        INTERN(s_enter, "__enter__");
        INTERN(s_ended_by, "ended_by"); /* error, or interrupted for a BaseException */
        INTERN(s_finish, "finish");
        INTERN(v_get, "GET");
        INTERN(v_root, "/");
        INTERN(v_http, "http");
        INTERN(empty_text, "");
        INTERN(colon, ":");
        INTERN(k_file_wrapper, "wsgi.file_wrapper");
        INTERN(s_read, "read");
        INTERN(scheme_end, "://");
#undef INTERN
    }
    PyObject **slots[] = {&py_trace, &tag_request, &run_unrecorded, &decide_entry, &from_headers,
                          &request_tags, &noop, (PyObject **)&span_class, &policy, &limits,
                          &layer, &tag_method, &tag_url, &no_tags, &current};
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_XSETREF(*slots[i], Py_NewRef(args[i]));
    }
    Py_RETURN_NONE;
}

/* environ.get(key) as a borrowed reference, NULL when absent (an error set only on failure). */
static PyObject *field(PyObject *environ, PyObject *key) {
    return PyDict_GetItemWithError(environ, key);
}

/* A field read as ``environ.get(key) or fallback``: borrowed; NULL when it is there, true
 * and not a str (the Python code's case). */
static PyObject *text_or(PyObject *value, PyObject *fallback) {
    if (value == NULL || value == Py_None) {
        return fallback;
    }
    if (!PyUnicode_CheckExact(value)) {
        return NULL;
    }
    return PyUnicode_GET_LENGTH(value) ? value : fallback;
}

/* A field read as ``environ.get(key, fallback)`` into an f-string: borrowed; NULL when it
 * is not a str. */
static PyObject *text_else(PyObject *value, PyObject *fallback) {
    if (value == NULL) {
        return fallback;
    }
    return PyUnicode_CheckExact(value) ? value : NULL;
}

/* The span's ``http.method`` / ``http.url`` tags and its peer as trace_wsgi sets them: 1
 * done, 0 when the Python code must do it (nothing changed yet), -1 on a failure (the span
 * kept as it is, as the Python code's ``except Exception: pass``). */
static int tag_plain(PyObject *span, PyObject *environ, PyObject *method, PyObject *path) {
    PyObject *given = field(environ, k_host);
    PyObject *name = NULL, *port = NULL;
    if (PyErr_Occurred()) {
        return -1;
    }
    PyObject *host = text_or(given, NULL);
    if (host == NULL) { /* absent, None, "": f"{SERVER_NAME}:{SERVER_PORT}" (or not a str) */
        if (given != NULL && given != Py_None && !(PyUnicode_CheckExact(given) && !PyUnicode_GET_LENGTH(given))) {
            return 0;
        }
        name = text_else(field(environ, k_server_name), empty_text);
        port = name == NULL ? NULL : text_else(field(environ, k_server_port), empty_text);
        if (port == NULL) {
            return 0;
        }
    }
    PyObject *scheme = text_else(field(environ, k_scheme), v_http);
    PyObject *script = scheme == NULL ? NULL : text_else(field(environ, k_script), empty_text);
    if (script == NULL || !PyUnicode_IS_ASCII(script)) { /* (beyond ASCII: as the path) */
        return 0;
    }
    /* ``if remote:`` then ``f"{remote}:{port}" if port else remote`` */
    PyObject *remote = field(environ, k_remote);
    PyObject *remote_port = NULL;
    if (remote == Py_None || (remote != NULL && PyUnicode_CheckExact(remote) && !PyUnicode_GET_LENGTH(remote))) {
        remote = NULL;
    } else if (remote != NULL) {
        if (!PyUnicode_CheckExact(remote)) {
            return 0;
        }
        remote_port = field(environ, k_remote_port);
        if (remote_port == Py_None ||
            (remote_port != NULL && PyUnicode_CheckExact(remote_port) && !PyUnicode_GET_LENGTH(remote_port))) {
            remote_port = NULL;
        } else if (remote_port != NULL && !PyUnicode_CheckExact(remote_port)) {
            return 0;
        }
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    /* Every part is a str held by the environ: built now, before any Python code runs. */
    PyObject *host_text = host != NULL ? Py_NewRef(host) : NULL;
    if (host_text == NULL) {
        PyObject *parts[3] = {name, colon, port};
        if ((host_text = swmp_join(parts, 3)) == NULL) {
            return -1;
        }
    }
    PyObject *url_parts[5] = {scheme, scheme_end, host_text, script, path};
    PyObject *url = swmp_join(url_parts, 5);
    Py_DECREF(host_text);
    PyObject *peer = NULL;
    if (url != NULL && remote != NULL) {
        if (remote_port == NULL) {
            peer = Py_NewRef(remote);
        } else {
            PyObject *parts[3] = {remote, colon, remote_port};
            peer = swmp_join(parts, 3);
        }
        if (peer == NULL) {
            Py_CLEAR(url);
        }
    }
    if (url == NULL) {
        return -1;
    }
    SwmpRequestTags parts = {request_tags, limits, no_tags, tag_method, tag_url};
    int done = swmp_request_tags(&parts, span, method, url);
    Py_DECREF(url);
    if (done == 0 && peer != NULL) {
        done = PyObject_SetAttr(span, s_peer, peer);
    }
    Py_XDECREF(peer);
    return done < 0 ? -1 : 1;
}

/* The carrier of an incoming sw8 (None without one), by the Python from_headers. */
static PyObject *carrier_of(PyObject *sw8, PyObject *correlation, PyObject *x) {
    if (sw8 == NULL || sw8 == Py_None) {
        return Py_NewRef(Py_None);
    }
    PyObject *max_elements = PyObject_GetAttr(limits, s_max_elements);
    PyObject *max_length = max_elements == NULL ? NULL : PyObject_GetAttr(limits, s_max_length);
    PyObject *carrier = NULL;
    if (max_length != NULL) {
        PyObject *call[5] = {sw8, correlation ? correlation : Py_None, x ? x : Py_None, max_elements, max_length};
        carrier = PyObject_Vectorcall(from_headers, call, 5, NULL);
    }
    Py_XDECREF(max_elements);
    Py_XDECREF(max_length);
    return carrier;
}

/* The request's span (new reference; NULL with an error when the Python trace_wsgi must run
 * it, which is only when it was not made): from an sw8 alone (an exact str, no correlation
 * or extension header) by swmp_sw8_span, else with from_headers' carrier by
 * swmp_carrier_span (entry_root, else decide_entry_span). */
static PyObject *make_span(PyObject *environ, PyObject *path, PyObject *component) {
    PyObject *sw8 = field(environ, k_sw8);
    PyObject *correlation = sw8 == NULL ? NULL : field(environ, k_sw8_correlation);
    PyObject *x = correlation == NULL && PyErr_Occurred() ? NULL : field(environ, k_sw8_x);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *entry[3] = {path, component, layer};
    if (sw8 != NULL && PyUnicode_CheckExact(sw8) && (correlation == NULL || correlation == Py_None) &&
        (x == NULL || x == Py_None)) {
        PyObject *span = NULL;
        Py_INCREF(sw8); /* the environ's: read without Python code, held all the same */
        int plain = swmp_sw8_span(entry, decide_entry, sw8, &span);
        Py_DECREF(sw8);
        if (plain != 0) {
            return span;
        }
    }
    Py_XINCREF(sw8); /* held: from_headers runs Python code */
    Py_XINCREF(correlation);
    Py_XINCREF(x);
    PyObject *carrier = carrier_of(sw8, correlation, x);
    Py_XDECREF(sw8);
    Py_XDECREF(correlation);
    Py_XDECREF(x);
    if (carrier == NULL) {
        return NULL;
    }
    PyObject *span = swmp_carrier_span(entry, decide_entry, carrier);
    Py_DECREF(carrier);
    return span;
}

static PyObject *call_app(PyObject *app, PyObject *environ, PyObject *start_response) {
    PyObject *call[2] = {environ, start_response};
    return PyObject_Vectorcall(app, call, 2, NULL);
}

/* ``span.name()`` whose failure is not the request's: cleared. */
static void quietly(PyObject *span, PyObject *name, PyObject *arg) {
    PyObject *r = arg == NULL ? PyObject_CallMethodNoArgs(span, name) : PyObject_CallMethodOneArg(span, name, arg);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
}

/* The application called inside ``span`` (entered, tagged), the context given back and the
 * span finished as trace_wsgi does. */
static PyObject *run_traced(PyObject *module, PyObject *span, PyObject *prev, PyObject *const *args) {
    PyObject *app = args[0], *environ = args[1], *start_response = args[2];
    PyObject *pair[2] = {span, start_response};
    PyObject *recorder = swmp_status_recorder(module, pair, 2);
    if (recorder == NULL) { /* the status goes untagged; the request does not fail for it */
        PyErr_Clear();
    }
    PyObject *result = call_app(app, environ, recorder != NULL ? recorder : start_response);
    Py_XDECREF(recorder);
    if (result == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(value, tb); /* what ``except ... as e`` sees */
        }
        quietly(span, s_ended_by, value);
        /* Nothing was sent (the headers go with the first body item): the server answers
         * 500, whatever status start_response was given (_failed_first). */
        if (value != NULL) {
            swmp_failed_first(span, value);
        }
        quietly(span, s_finish, NULL);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    /* The body runs outside the application call: the span stays open until close(), but
     * the context is given back now. */
    PyObject *cur = NULL;
    if (PyContextVar_Get(current, NULL, &cur) < 0) {
        PyErr_Clear();
    } else if (cur == span) {
        PyObject *token = PyContextVar_Set(current, prev);
        if (token == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(token);
    }
    Py_XDECREF(cur);
    if (PyList_Check(result) || PyTuple_Check(result)) {
        quietly(span, s_finish, NULL);
        return result;
    }
    /* A server's own file wrapper goes back to it as it is (see _file_response); any other
     * response into the body that finishes the span when the server closes it. */
    PyObject *wrapper = py_file_response == NULL ? NULL : PyDict_GetItemWithError(environ, k_file_wrapper);
    PyObject *made, *made_of[2] = {result, span};
    /* (uWSGI's wsgi.file_wrapper is a function giving back the file-like itself; a list,
     * most responses, is never one: no failed attribute look-up for it) */
    int file_like = wrapper != NULL && (PyType_Check(wrapper)
                                            ? PyObject_TypeCheck(result, (PyTypeObject *)wrapper)
                                            : wrapper != Py_None && !PyList_CheckExact(result) &&
                                                  PyObject_HasAttr(result, s_read));
    if (file_like) {
        made = PyObject_Vectorcall(py_file_response, made_of, 2, NULL);
    } else {
        PyErr_Clear(); /* (a failed look-up in an exact dict: not expected) */
        made = swmp_wsgi_body(module, made_of, 2);
    }
    if (made == NULL) { /* answered as the application answered, the span ended now */
        PyErr_Clear();
        quietly(span, s_finish, NULL);
        return result;
    }
    Py_DECREF(result);
    return made;
}

PyObject *swmp_setup_wsgi_file(PyObject *module, PyObject *fn) {
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "setup_wsgi_file(file_response: callable)");
        return NULL;
    }
    Py_XSETREF(py_file_response, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *python_trace(PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(py_trace, args, nargsf, kwnames);
}

PyObject *swmp_wsgi_call(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (py_trace == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_wsgi() was not called");
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 6 || kwnames != NULL || !PyDict_CheckExact(args[1])) {
        return python_trace(args, nargsf, kwnames);
    }
    PyObject *environ = args[1];
    int ignoring = swmp_methods_ignored(policy);
    PyObject *method = ignoring != 0 ? NULL : text_or(field(environ, k_method), v_get);
    PyObject *path = method == NULL ? NULL : text_or(field(environ, k_path), v_root);
    /* A path beyond ASCII is the request's UTF-8 bytes as latin-1 characters (PEP 3333):
     * the Python code gives the span the text they spell. */
    if (path == NULL || PyErr_Occurred() || !PyUnicode_IS_ASCII(path)) { /* not a plain request, or reading it failed */
        PyErr_Clear();
        return python_trace(args, nargsf, kwnames);
    }
    Py_INCREF(method); /* held: making the span runs Python code */
    Py_INCREF(path);
    PyObject *span = make_span(environ, path, args[3]);
    PyObject *result = NULL;
    if (span == NULL && !PyErr_ExceptionMatches(PyExc_Exception)) {
        /* KeyboardInterrupt, SystemExit arriving while the span was made: the process's, not
         * the agent's to swallow (the Python form lets them through too). */
    } else if (span == NULL) { /* the agent failed, not the request: it goes on untraced */
        PyErr_Clear();
        result = call_app(args[0], environ, args[2]);
    } else if (span == noop) {
        result = call_app(args[0], environ, args[2]);
    } else if (!Py_IS_TYPE(span, span_class)) { /* not recorded: ``with span:`` in Python */
        PyObject *call[4] = {span, args[0], environ, args[2]};
        result = PyObject_Vectorcall(run_unrecorded, call, 4, NULL);
    } else {
        PyObject *prev = NULL;
        PyObject *entered = NULL;
        if (PyContextVar_Get(current, Py_None, &prev) == 0) {
            entered = PyObject_CallMethodNoArgs(span, s_enter);
        }
        if (entered == NULL) {
            PyErr_Clear();
            result = call_app(args[0], environ, args[2]);
        } else {
            Py_DECREF(entered);
            int collect = PyObject_IsTrue(args[4]);
            if (collect < 0) {
                PyErr_Clear(); /* the Python code asks again, inside its own guard */
            }
            int tagged = collect != 0 ? 0 : tag_plain(span, environ, method, path);
            if (tagged == 0) {
                PyObject *call[6] = {span, environ, method, path, args[4], args[5]};
                PyObject *r = PyObject_Vectorcall(tag_request, call, 6, NULL);
                tagged = r == NULL ? -1 : 1;
                Py_XDECREF(r);
            }
            if (tagged < 0) {
                PyErr_Clear(); /* as the Python code: the span as it is */
            }
            result = run_traced(module, span, prev, args);
        }
        Py_XDECREF(prev);
    }
    Py_XDECREF(span);
    Py_DECREF(method);
    Py_DECREF(path);
    return result;
}

int swmp_wsgi_set_up(void) {
    return py_trace != NULL;
}
