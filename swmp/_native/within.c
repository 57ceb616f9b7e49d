/* within(span, awaitable): ``awaitable`` awaited with ``span`` entered around it, what
 *
 *     async def run():
 *         with span:
 *             return await awaitable
 *
 * does, without the Python coroutine.
 *
 * Why: a request handler awaited through a wrapping coroutine resumes that coroutine's
 * frame every time the request waits (five times a request in Django under ASGI: the body,
 * the signals, the thread hand-offs), ~2,400 instructions a request measured alone; this
 * object hands each send, throw and close to the awaited object directly.
 *
 * The behaviour is the coroutine's: the span is entered on the first send (in the context
 * of the task that awaits, not where this object was made) and exited with the outcome
 * (``__exit__(None, None, None)`` on return, with the exception otherwise: one raised by
 * the awaited object, a ``throw()`` it did not handle, the GeneratorExit of ``close()`` or
 * of this object being collected while running). Awaiting it a second time raises
 * RuntimeError, as a coroutine does. Only for callers that await what they are given (the
 * object is not a coroutine: ``asyncio.iscoroutine`` says no, so it must not be handed to
 * ``create_task``); swmp uses it for Django's ``ASGIHandler.handle``. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "within.h"

enum { NOT_STARTED, RUNNING, DONE };

typedef struct {
    PyObject_HEAD
    PyObject *span;
    PyObject *inner; /* the awaited object's iterator (a coroutine is its own) */
    int state;
} Within;

static PyObject *s_enter = NULL, *s_exit = NULL, *s_throw = NULL, *s_close = NULL;

/* span.__exit__(type, value, tb) for the exception set (or none): 0 with the exception
 * still set (or none), 1 when ``__exit__`` answered true for an exception (suppressed, as
 * a ``with`` does: the exception is cleared), -1 with the exit's own error replacing it. */
static int exit_span(Within *self, int with_error) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (with_error) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
    }
    PyObject *args[4] = {self->span, type ? type : Py_None, value ? value : Py_None, tb ? tb : Py_None};
    PyObject *r = PyObject_VectorcallMethod(s_exit, args, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    int suppressed = with_error ? PyObject_IsTrue(r) : 0;
    Py_DECREF(r);
    if (suppressed != 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return suppressed;
    }
    if (with_error) {
        PyErr_Restore(type, value, tb);
    }
    return 0;
}

/* The outcome of a step of the awaited object: NEXT passes through; RETURN and ERROR exit
 * the span first. */
static PySendResult settle(Within *self, PySendResult r, PyObject **result) {
    if (r == PYGEN_NEXT) {
        return r;
    }
    self->state = DONE;
    int exited = exit_span(self, r == PYGEN_ERROR);
    if (exited < 0) {
        if (r == PYGEN_RETURN) {
            Py_CLEAR(*result);
        }
        return PYGEN_ERROR;
    }
    if (exited > 0) { /* the exception suppressed: the coroutine would return None */
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    return r;
}

static PySendResult within_send(PyObject *obj, PyObject *arg, PyObject **result) {
    Within *self = (Within *)obj;
    *result = NULL;
    if (self->state == DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return PYGEN_ERROR;
    }
    if (self->state == NOT_STARTED) {
        PyObject *entered = PyObject_CallMethodNoArgs(self->span, s_enter);
        if (entered == NULL) {
            self->state = DONE;
            return PYGEN_ERROR;
        }
        Py_DECREF(entered);
        self->state = RUNNING;
    }
    return settle(self, PyIter_Send(self->inner, arg, result), result);
}

/* A step's outcome as a Python-level send()/__next__() gives it: the value yielded, or
 * NULL with StopIteration(value) or the error set. */
static PyObject *as_call(PySendResult r, PyObject *result) {
    if (r == PYGEN_NEXT) {
        return result;
    }
    if (r == PYGEN_RETURN) {
        if (result == Py_None) {
            Py_DECREF(result);
            PyErr_SetNone(PyExc_StopIteration);
        } else {
            PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
            Py_DECREF(result);
            if (stop != NULL) {
                PyErr_SetObject(PyExc_StopIteration, stop);
                Py_DECREF(stop);
            }
        }
    }
    return NULL;
}

static PyObject *within_next(PyObject *self) {
    PyObject *result;
    PySendResult r = within_send(self, Py_None, &result);
    if (r == PYGEN_RETURN && result == Py_None) {
        Py_DECREF(result);
        return NULL; /* exhausted: tp_iternext's StopIteration without a value */
    }
    return as_call(r, result);
}

static PyObject *within_send_method(PyObject *self, PyObject *arg) {
    PyObject *result;
    PySendResult r = within_send(self, arg, &result);
    return as_call(r, result);
}

/* A value out of a StopIteration being raised, as a generator's return: *result set and
 * the error cleared; 0 when the error is another. */
static int stopped(PyObject **result) {
    if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
        return 0;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *v = value == NULL ? NULL : PyObject_GetAttrString(value, "value");
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (v == NULL) {
        PyErr_Clear();
        v = Py_NewRef(Py_None);
    }
    *result = v;
    return 1;
}

static PyObject *within_throw(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    Within *self = (Within *)obj;
    PyObject *throw = PyObject_GetAttr(self->inner, s_throw);
    if (throw == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_Vectorcall(throw, args, nargs, NULL);
    Py_DECREF(throw);
    if (self->state != RUNNING) { /* never entered, or over: the awaited object answers alone */
        self->state = DONE;
        return out;
    }
    if (out != NULL) {
        return out; /* handled: the awaited object yielded again */
    }
    PyObject *result = NULL;
    PySendResult r = stopped(&result) ? PYGEN_RETURN : PYGEN_ERROR;
    return as_call(settle(self, r, &result), result);
}

/* Close the awaited object, then exit the span with GeneratorExit (what the coroutine's
 * ``with`` sees). The exception set on entry is kept. */
static int close_running(Within *self) {
    self->state = DONE;
    PyObject *close = PyObject_GetAttr(self->inner, s_close);
    PyObject *closed = close == NULL ? NULL : PyObject_CallNoArgs(close);
    Py_XDECREF(close);
    if (closed == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            /* the span ends with the close's own error, which is raised (unless suppressed) */
            return exit_span(self, 1) > 0 ? 0 : -1;
        }
        PyErr_Clear(); /* an iterator without close(): nothing to close */
    }
    Py_XDECREF(closed);
    PyErr_SetNone(PyExc_GeneratorExit);
    if (exit_span(self, 1) < 0) {
        return -1; /* the exit's own error: close() raises it */
    }
    PyErr_Clear(); /* the GeneratorExit: close() returns normally */
    return 0;
}

static PyObject *within_close(PyObject *obj, PyObject *unused) {
    Within *self = (Within *)obj;
    if (self->state != RUNNING) {
        self->state = DONE;
        PyObject *close = PyObject_GetAttr(self->inner, s_close);
        if (close == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                return NULL;
            }
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        PyObject *r = PyObject_CallNoArgs(close);
        Py_DECREF(close);
        return r;
    }
    if (close_running(self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static void within_finalize(PyObject *obj) {
    Within *self = (Within *)obj;
    if (self->state != RUNNING) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (close_running(self) < 0) {
        PyErr_WriteUnraisable(obj);
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *within_await(PyObject *self) {
    return Py_NewRef(self);
}

static int within_traverse(Within *self, visitproc visit, void *arg) {
    Py_VISIT(self->span);
    Py_VISIT(self->inner);
    return 0;
}

static int within_clear(Within *self) {
    Py_CLEAR(self->span);
    Py_CLEAR(self->inner);
    return 0;
}

static void within_dealloc(PyObject *obj) {
    if (PyObject_CallFinalizerFromDealloc(obj) < 0) {
        return; /* resurrected */
    }
    PyObject_GC_UnTrack(obj);
    within_clear((Within *)obj);
    Py_TYPE(obj)->tp_free(obj);
}

static PyAsyncMethods within_async = {
    .am_await = within_await,
    .am_send = within_send,
};

static PyMethodDef within_methods[] = {
    {"send", (PyCFunction)within_send_method, METH_O, "Resume the awaited object with a value."},
    {"throw", (PyCFunction)(void (*)(void))within_throw, METH_FASTCALL, "Raise an exception in the awaited object."},
    {"close", (PyCFunction)within_close, METH_NOARGS, "Close the awaited object; the span ends with GeneratorExit."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject swmp_WithinType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.Within",
    .tp_basicsize = sizeof(Within),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "An awaitable: the awaited object run with a span entered around it (see within()).",
    .tp_dealloc = within_dealloc,
    .tp_finalize = within_finalize,
    .tp_traverse = (traverseproc)within_traverse,
    .tp_clear = (inquiry)within_clear,
    .tp_as_async = &within_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = within_next,
    .tp_methods = within_methods,
};

PyObject *swmp_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "within(span, awaitable)");
        return NULL;
    }
    if (s_enter == NULL && ((s_enter = PyUnicode_InternFromString("__enter__")) == NULL ||
                            (s_exit = PyUnicode_InternFromString("__exit__")) == NULL ||
                            (s_throw = PyUnicode_InternFromString("throw")) == NULL ||
                            (s_close = PyUnicode_InternFromString("close")) == NULL)) {
        return NULL;
    }
    PyObject *aw = args[1];
    PyObject *inner;
    if (PyCoro_CheckExact(aw)) {
        inner = Py_NewRef(aw);
    } else if (Py_TYPE(aw)->tp_as_async != NULL && Py_TYPE(aw)->tp_as_async->am_await != NULL) {
        inner = Py_TYPE(aw)->tp_as_async->am_await(aw);
        if (inner == NULL) {
            return NULL;
        }
        if (!PyIter_Check(inner)) {
            PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'", Py_TYPE(inner)->tp_name);
            Py_DECREF(inner);
            return NULL;
        }
    } else {
        PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression", Py_TYPE(aw)->tp_name);
        return NULL;
    }
    Within *self = PyObject_GC_New(Within, &swmp_WithinType);
    if (self == NULL) {
        Py_DECREF(inner);
        return NULL;
    }
    self->span = Py_NewRef(args[0]);
    self->inner = inner;
    self->state = NOT_STARTED;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
