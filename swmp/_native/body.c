/* wsgi_body(result, span): a WSGI response iterable that finishes ``span`` when the server
 * closes it, for an application that returns something other than a list or tuple (Flask's
 * and Django's responses, generators).
 *
 * Why: the Python wrapper (``_Body`` in swmp/instrument/wsgi.py) cost an object with an
 * ``__init__`` frame, a generator for the iteration and a ``close`` frame per request. This
 * one does the same in C: iterating it iterates ``result`` (an exception raised while
 * iterating marks the span with it, ``span.error(exc)``, and propagates unchanged);
 * ``close()`` calls ``result.close()`` if it has one and finishes the span whatever that
 * does. Unlike the generator, dropping an unfinished iteration does not close ``result`` a
 * second time nor log a GeneratorExit on the span.
 *
 * A response that fails before its first item (a generator raising at once) is answered by
 * the server with a 500, its headers not sent yet: ``failed_first(span, exc)`` (the Python
 * ``_failed_first``, set by setup_wsgi_body()) tags the span with that status, as the
 * Python form does. */
#include "body.h"

typedef struct {
    PyObject_HEAD
    PyObject *result;
    PyObject *span;
    PyObject *inner; /* iter(result), from the last iter() of this object */
    int sent;        /* an item was returned since the last iter() */
} Body;

static PyObject *s_ended_by = NULL, *s_finish = NULL, *s_close = NULL;
static PyObject *failed_first = NULL; /* setup_wsgi_body(): see above */

PyObject *swmp_setup_wsgi_body(PyObject *module, PyObject *fn) {
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "setup_wsgi_body(failed_first: callable)");
        return NULL;
    }
    Py_XSETREF(failed_first, Py_NewRef(fn));
    Py_RETURN_NONE;
}

PyObject *swmp_wsgi_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wsgi_body(result, span)");
        return NULL;
    }
    if (s_ended_by == NULL && ((s_ended_by = PyUnicode_InternFromString("ended_by")) == NULL ||
                            (s_finish = PyUnicode_InternFromString("finish")) == NULL ||
                            (s_close = PyUnicode_InternFromString("close")) == NULL)) {
        return NULL;
    }
    Body *self = PyObject_GC_New(Body, &swmp_BodyType);
    if (self == NULL) {
        return NULL;
    }
    self->result = Py_NewRef(args[0]);
    self->span = Py_NewRef(args[1]);
    self->inner = NULL;
    self->sent = 0;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* iter(body): itself, iterating the response afresh (as the generator of the Python wrapper
 * did), iter(result) taken at the first item so that its error is the span's too. */
static PyObject *body_iter(Body *self) {
    Py_CLEAR(self->inner);
    self->sent = 0;
    return Py_NewRef(self);
}

/* The exception being raised marks the span (span.ended_by(exc): an error, or an interrupt
 * logged as such; before the first item, also failed_first(span, exc)) and goes on unchanged. */
static void mark_failed(Body *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *r = value == NULL ? NULL : PyObject_CallMethodOneArg(self->span, s_ended_by, value);
    if (r == NULL) {
        PyErr_Clear(); /* the span's trouble is not the application's */
    }
    Py_XDECREF(r);
    if (!self->sent && value != NULL) {
        swmp_failed_first(self->span, value);
    }
    PyErr_Restore(type, value, tb);
}

void swmp_failed_first(PyObject *span, PyObject *exc) {
    if (failed_first == NULL) {
        return;
    }
    PyObject *pair[2] = {span, exc};
    PyObject *r = PyObject_Vectorcall(failed_first, pair, 2, NULL);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
}

static PyObject *body_next(Body *self) {
    if (self->inner == NULL) {
        self->inner = PyObject_GetIter(self->result);
        if (self->inner == NULL) {
            mark_failed(self);
            return NULL;
        }
    }
    PyObject *item = PyIter_Next(self->inner);
    if (item != NULL) {
        self->sent = 1;
    } else if (PyErr_Occurred()) {
        mark_failed(self); /* the response failed while being sent */
    }
    return item; /* NULL without an error: exhausted */
}

static PyObject *body_close(Body *self, PyObject *unused) {
    PyObject *close = PyObject_GetAttr(self->result, s_close);
    PyObject *res = NULL;
    if (close == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            res = Py_NewRef(Py_None);
        }
    } else {
        res = close == Py_None ? Py_NewRef(Py_None) : PyObject_CallNoArgs(close); /* getattr(.., None) */
        Py_DECREF(close);
    }
    /* finally: the span ends whatever close() did; an error of finish() wins, as in Python. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *done = PyObject_CallMethodNoArgs(self->span, s_finish);
    if (done == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_XDECREF(res);
        return NULL;
    }
    Py_DECREF(done);
    PyErr_Restore(type, value, tb);
    if (res == NULL) {
        return NULL;
    }
    Py_DECREF(res);
    Py_RETURN_NONE;
}

static int body_traverse(Body *self, visitproc visit, void *arg) {
    Py_VISIT(self->result);
    Py_VISIT(self->span);
    Py_VISIT(self->inner);
    return 0;
}

static int body_clear(Body *self) {
    Py_CLEAR(self->result);
    Py_CLEAR(self->span);
    Py_CLEAR(self->inner);
    return 0;
}

static void body_dealloc(Body *self) {
    PyObject_GC_UnTrack(self);
    body_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef body_methods[] = {
    {"close", (PyCFunction)body_close, METH_NOARGS, "Close the response (if it can be) and finish the span."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject swmp_BodyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.WSGIBody",
    .tp_basicsize = sizeof(Body),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A traced WSGI response (see body.c).",
    .tp_iter = (getiterfunc)body_iter,
    .tp_iternext = (iternextfunc)body_next,
    .tp_methods = body_methods,
    .tp_dealloc = (destructor)body_dealloc,
    .tp_traverse = (traverseproc)body_traverse,
    .tp_clear = (inquiry)body_clear,
};
