/* status_recorder(span, start_response): the ``start_response`` a traced WSGI application
 * gets, tagging the entry span with the response's status on the way to the server's.
 *
 * Why: a Python closure made for every request (its cells, the function object, a frame
 * per call and the status slicing) cost ~5,000 instructions of the WSGI middleware's
 * ~36,000 per request. This object is made and called in C; for a status line starting
 * with a known 3-digit code it appends the prebuilt ``http.status_code`` tag pair to the
 * span's tags list and marks 4xx/5xx as errors (``span.error()``), exactly what the Python
 * code does; anything else (an odd status, tags not yet a list, a tag length limit below 3)
 * goes to that Python code (``slow(span, status)``, swmp/instrument/wsgi.py), which decides
 * as before. The server's ``start_response`` then gets (status, headers[, exc_info]), an
 * ``exc_info`` of None dropped, as from the Python wrapper; a call with an ``exc_info``
 * (an error answer, which the server may refuse) or of another form (keywords, a wrong
 * number of arguments) is the Python wrapper's (``call(span,
 * start_response, *args, **kwargs)``), errors included.
 *
 * status_sender(span, send): the same for an ASGI application's ``send``: a message of type
 * ``http.response.start`` with a known integer status is tagged in C (only the first: the
 * server refuses a second), any other start message by the Python code
 * (``send_slow(span, message)``), the others not at all; then
 * the server's ``send`` gets the message and its awaitable goes back to the application. A
 * call of another form is the Python wrapper's (``send_call(span, send, *args, **kwargs)``).
 * For a span that records nothing the server's ``send`` itself is given. */
#include "attrcache.h"
#include "spancore.h"
#include "status.h"

#include <stddef.h>

#define FIRST_CODE 100
#define LAST_CODE 599

typedef struct {
    PyObject_HEAD
    PyObject *span;
    PyObject *start_response; /* or the ASGI server's send */
    vectorcallfunc vectorcall;
} StatusRecorder;

/* Set by setup_status, setup_recorder and setup_sender. */
static PyObject *pairs[LAST_CODE + 1]; /* code -> (TAG_HTTP_STATUS, "200"), borrowed from ``tag_table`` */
static PyObject *span_class = NULL, *send_slow = NULL, *send_call = NULL, *s_type = NULL, *s_status = NULL,
                *start_type = NULL;
static PyObject *tag_table = NULL, *slow = NULL, *py_call = NULL, *limits = NULL, *s_error = NULL,
                *s_tag_value_max = NULL;

/* setup_status(tags, limits): the tag pairs by code and the limits, from swmp/instrument/_http.py. */
PyObject *swmp_setup_status(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_status(tags: dict[int, tuple[str, str]], limits)");
        return NULL;
    }
    if (s_error == NULL && ((s_error = PyUnicode_InternFromString("error")) == NULL ||
                           (s_tag_value_max = PyUnicode_InternFromString("tag_value_max")) == NULL ||
                           (s_type = PyUnicode_InternFromString("type")) == NULL ||
                           (s_status = PyUnicode_InternFromString("status")) == NULL ||
                           (start_type = PyUnicode_InternFromString("http.response.start")) == NULL)) {
        return NULL;
    }
    for (int code = 0; code <= LAST_CODE; code++) {
        PyObject *key = PyLong_FromLong(code);
        PyObject *pair = key == NULL ? NULL : PyDict_GetItemWithError(args[0], key);
        Py_XDECREF(key);
        if (pair == NULL && PyErr_Occurred()) {
            return NULL;
        }
        pairs[code] = pair != NULL && PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2 ? pair : NULL;
    }
    Py_XSETREF(tag_table, Py_NewRef(args[0])); /* keeps the pairs alive */
    Py_XSETREF(limits, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* setup_recorder(slow, call): the WSGI recorder's Python code (swmp/instrument/wsgi.py). */
PyObject *swmp_setup_recorder(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_recorder(slow: callable, call: callable)");
        return NULL;
    }
    Py_XSETREF(slow, Py_NewRef(args[0]));
    Py_XSETREF(py_call, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* setup_sender(span_class, send_slow, send_call): the ASGI sender's (swmp/instrument/asgi.py). */
PyObject *swmp_setup_sender(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "setup_sender(span_class: type, send_slow: callable, send_call: callable)");
        return NULL;
    }
    Py_XSETREF(span_class, Py_NewRef(args[0]));
    Py_XSETREF(send_slow, Py_NewRef(args[1]));
    Py_XSETREF(send_call, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* The status code of a status line starting with three ASCII digits in the table, else 0. */
static int known_code(PyObject *status) {
    if (!PyUnicode_CheckExact(status) || !PyUnicode_IS_COMPACT_ASCII(status) || PyUnicode_GET_LENGTH(status) < 3) {
        return 0;
    }
    const unsigned char *s = PyUnicode_1BYTE_DATA(status);
    for (int i = 0; i < 3; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
    }
    int code = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
    return code >= FIRST_CODE && code <= LAST_CODE && pairs[code] != NULL ? code : 0;
}

/* Tags the span: 1 done here, 0 leave it to ``slow``, -1 error. */
static int record_fast(PyObject *span, int code) {
    static swmp_AttrCache at_max; /* Limits: a __slots__ class (attrcache.c) */
    PyObject *max = swmp_slot_attr(limits, s_tag_value_max, &at_max);
    if (max == NULL) {
        return -1;
    }
    long lim = PyLong_Check(max) ? PyLong_AsLong(max) : -1;
    Py_DECREF(max);
    if (lim == -1 && PyErr_Occurred()) {
        PyErr_Clear();
    }
    if (lim < 3) {
        return 0;
    }
    PyObject *tags = swmp_tags_of(span);
    if (tags == NULL) {
        return -1;
    }
    int done = 0;
    if (PyList_CheckExact(tags)) {
        PyObject *pair = pairs[code];
        done = PyList_Append(tags, PyTuple_GET_ITEM(pair, 0)) == 0 && PyList_Append(tags, PyTuple_GET_ITEM(pair, 1)) == 0
                   ? 1
                   : -1;
    }
    Py_DECREF(tags);
    if (done == 1 && code >= 400) {
        PyObject *r = PyObject_CallMethodNoArgs(span, s_error);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    return done;
}

/* Whether the span has an ``http.status_code`` tag already: 1 yes, 0 no, -1 error. An ASGI
 * response starts once: the server refuses a second start message (raises), so the status
 * sent is the first one's, and only it is tagged. */
static int has_status(PyObject *span) {
    PyObject *key = pairs[200] != NULL ? PyTuple_GET_ITEM(pairs[200], 0) : NULL;
    PyObject *tags = key == NULL ? NULL : swmp_tags_of(span);
    if (tags == NULL) {
        return key == NULL ? 0 : -1;
    }
    int found = 0;
    if (PyList_CheckExact(tags)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tags) && !found; i += 2) {
            PyObject *k = PyList_GET_ITEM(tags, i);
            found = k == key || (PyUnicode_CheckExact(k) && PyUnicode_Compare(k, key) == 0);
        }
    }
    Py_DECREF(tags);
    return found;
}

/* A call of another form than the plain one: the Python wrapper's (``fallback``). */
static PyObject *python_call(PyObject *fallback, StatusRecorder *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    return swmp_call_with_two(fallback, self->span, self->start_response, args, nargs, kwnames);
}

static PyObject *recorder_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    StatusRecorder *self = (StatusRecorder *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 2 || nargs > 3 || (nargs == 3 && args[2] != Py_None)) {
        /* exc_info given: an error answer that replaces the status, or not, as the server
         * decides; the Python code asks it first, then tags what it took */
        return python_call(py_call, self, args, nargs, kwnames);
    }
    int code = known_code(args[0]);
    int r = code ? record_fast(self->span, code) : 0;
    if (r == 0) {
        PyObject *call[2] = {self->span, args[0]};
        PyObject *res = PyObject_Vectorcall(slow, call, 2, NULL);
        r = res == NULL ? -1 : 1;
        Py_XDECREF(res);
    }
    if (r < 0) {
        /* The Python wrapper let only ValueError and TypeError pass. */
        if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_TypeError)) {
            return NULL;
        }
        PyErr_Clear();
    }
    if (nargs == 3 && args[2] == Py_None) {
        nargs = 2; /* exc_info=None: the server gets (status, headers), as from the Python wrapper */
    }
    return PyObject_Vectorcall(self->start_response, args, (size_t)nargs, NULL);
}

/* Passes an error of the tagging through as the Python wrapper did: it let every Exception pass. */
static int tagging_failed(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyErr_Clear();
    return 0;
}

static PyObject *sender_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    StatusRecorder *self = (StatusRecorder *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 1) {
        return python_call(send_call, self, args, nargs, kwnames);
    }
    PyObject *message = args[0];
    int r = 0; /* 1 tagged or not a start message, 0 the Python code's, -1 error */
    if (PyDict_CheckExact(message)) {
        PyObject *type = PyDict_GetItemWithError(message, s_type); /* borrowed */
        if (type == NULL) {
            r = PyErr_Occurred() ? -1 : 0;
        } else if (!PyUnicode_CheckExact(type)) {
            r = 0;
        } else if (type != start_type && PyUnicode_Compare(type, start_type) != 0) {
            r = 1; /* a body message: nothing to tag */
        } else {
            PyObject *status = PyDict_GetItemWithError(message, s_status);
            long code = status != NULL && PyLong_CheckExact(status) ? PyLong_AsLong(status) : 0;
            if (code == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                code = 0;
            }
            int again = PyErr_Occurred() ? -1 : has_status(self->span);
            r = again != 0                                                       ? (again < 0 ? -1 : 1)
                : code >= FIRST_CODE && code <= LAST_CODE && pairs[code] != NULL ? record_fast(self->span, (int)code)
                                                                                 : 0;
        }
    }
    if (r == 0) {
        PyObject *call[2] = {self->span, message};
        PyObject *res = PyObject_Vectorcall(send_slow, call, 2, NULL);
        r = res == NULL ? -1 : 1;
        Py_XDECREF(res);
    }
    if (r < 0 && tagging_failed() < 0) {
        return NULL;
    }
    return PyObject_Vectorcall(self->start_response, args, 1, NULL);
}

static PyObject *make(PyObject *span, PyObject *target, vectorcallfunc call) {
    StatusRecorder *self = PyObject_GC_New(StatusRecorder, &swmp_StatusRecorderType);
    if (self == NULL) {
        return NULL;
    }
    self->span = Py_NewRef(span);
    self->start_response = Py_NewRef(target);
    self->vectorcall = call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

PyObject *swmp_status_sender(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || span_class == NULL || limits == NULL) {
        PyErr_SetString(PyExc_TypeError, "status_sender(span, send) after setup_status/sender()");
        return NULL;
    }
    if ((PyObject *)Py_TYPE(args[0]) != span_class) {
        return Py_NewRef(args[1]); /* a span that records nothing: the server's send itself */
    }
    return make(args[0], args[1], sender_call);
}

PyObject *swmp_status_recorder(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || slow == NULL || limits == NULL) {
        PyErr_SetString(PyExc_TypeError, "status_recorder(span, start_response) after setup_status/recorder()");
        return NULL;
    }
    return make(args[0], args[1], recorder_call);
}

static int recorder_traverse(StatusRecorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->span);
    Py_VISIT(self->start_response);
    return 0;
}

static int recorder_clear(StatusRecorder *self) {
    Py_CLEAR(self->span);
    Py_CLEAR(self->start_response);
    return 0;
}

static void recorder_dealloc(StatusRecorder *self) {
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    PyObject_GC_Del(self);
}

PyTypeObject swmp_StatusRecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.StatusRecorder",
    .tp_basicsize = sizeof(StatusRecorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A traced WSGI request's start_response (see status.c).",
    .tp_vectorcall_offset = offsetof(StatusRecorder, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
};
