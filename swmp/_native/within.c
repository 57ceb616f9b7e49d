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
 * RuntimeError, as a coroutine does. It has ``send``, ``throw``, ``close`` and ``__await__``,
 * so ``collections.abc.Coroutine`` (and with it ``asyncio.iscoroutine`` and
 * ``create_task``) takes it. swmp uses it for Django's ``ASGIHandler.handle``.
 *
 * The lazy form (``swmp_within_lazy``, for the async data-store calls in sql.c and
 * cache.c) is what the drivers' Python wrapper
 *
 *     async def traced(self, *args, **kwargs):
 *         with open_span(self, args, kwargs):
 *             return await orig(self, *args, **kwargs)
 *
 * does: nothing happens until the first send, in the awaiting task's context; then the
 * owner's ``open`` makes the span (or declines: the call is the Python ``fallback``'s,
 * whose coroutine is run as it is, with no span of ours), the span is entered, and only
 * then is ``orig`` called for the awaitable. A call never awaited makes no span, as a
 * coroutine never started runs none of its body; a ``throw()`` before the first send
 * raises the exception thrown, as it does into a coroutine not started. Why: the Python
 * wrapper was three to five Python frames per traced command or query between the
 * client's round trips (see sql.c). The opener may also give the call new arguments
 * (aiormq's publish in publish.c: the properties with the trace's headers), and a step to
 * take when the call is over, before the span exits (publish.c: what aiormq wrote on those
 * properties given back to the caller's). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#include "consume.h"
#include "spancore.h"
#include "within.h"

enum { NOT_STARTED, RUNNING, DONE };

typedef struct {
    PyObject_HEAD
    PyObject *span;  /* NULL: none (the lazy form not started yet, or its call declined) */
    PyObject *inner; /* the awaited object's iterator (a coroutine is its own); NULL until
                      * the lazy form's first send */
    int state;
    /* The lazy form: the call to make at the first send (open NULL: the eager form). */
    swmp_within_opener open;
    PyObject *owner, *orig, *fallback;
    PyObject *argv;    /* the positional arguments, then the keywords' values */
    PyObject *kwnames; /* NULL: none */
    Py_ssize_t nargs;
    swmp_within_after after; /* the opener's step for the end of the call; fn NULL: none */
} Within;

static PyObject *s_enter = NULL, *s_exit = NULL, *s_throw = NULL, *s_close = NULL;

/* The opener's step for the end of the call, taken once, the outcome (the exception set, if
 * ``with_error``) kept: 0; -1 with the step's own error (not an Exception) replacing it, as
 * one raised in a ``finally`` does. */
static int run_after(Within *self, int with_error) {
    int (*fn)(PyObject *) = self->after.fn;
    PyObject *state = self->after.state;
    if (fn == NULL) {
        return 0;
    }
    self->after.fn = NULL;
    self->after.state = NULL;
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (with_error) {
        PyErr_Fetch(&type, &value, &tb);
    }
    int r = fn(state);
    Py_XDECREF(state);
    if (r < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    if (with_error) {
        PyErr_Restore(type, value, tb);
    }
    return 0;
}

/* span.__exit__(type, value, tb) for the exception set (or none), after the opener's step
 * for the end of the call: 0 with the exception still set (or none), 1 when ``__exit__``
 * answered true for an exception (suppressed, as a ``with`` does: the exception is
 * cleared), -1 with the exit's own error (or that step's) replacing it. */
static int exit_span(Within *self, int with_error) {
    int after_failed = run_after(self, with_error) < 0;
    if (after_failed) {
        with_error = 1; /* the span exits with the step's error, which is the outcome now */
    }
    if (self->span == NULL) {
        return after_failed ? -1 : 0; /* no span of ours: the outcome passes as it is */
    }
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (with_error) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL) {
            PyException_SetTraceback(value, tb);
        }
    }
    PyObject *args[4] = {self->span, type ? type : Py_None, value ? value : Py_None, tb ? tb : Py_None};
    PyObject *r = swmp_cm_exit(args, s_exit);
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
    return after_failed ? -1 : 0; /* the step's error, not suppressed: the call raises it */
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

/* The iterator ``await aw`` runs (new reference), or NULL with await's TypeError. */
static PyObject *await_iter(PyObject *aw) {
    if (PyCoro_CheckExact(aw)) {
        return Py_NewRef(aw);
    }
    if (Py_TYPE(aw)->tp_as_async != NULL && Py_TYPE(aw)->tp_as_async->am_await != NULL) {
        PyObject *inner = Py_TYPE(aw)->tp_as_async->am_await(aw);
        if (inner != NULL && !PyIter_Check(inner)) {
            PyErr_Format(PyExc_TypeError, "__await__() returned non-iterator of type '%.100s'", Py_TYPE(inner)->tp_name);
            Py_CLEAR(inner);
        }
        return inner;
    }
    PyErr_Format(PyExc_TypeError, "object %.100s can't be used in 'await' expression", Py_TYPE(aw)->tp_name);
    return NULL;
}

/* The lazy form's first step: the span opened and entered (or the call declined to the
 * fallback), the awaitable made, its iterator kept. 0; -1 with the error to raise (a span
 * already entered is exited with it, as the ``with`` around the call would); 1 when that
 * exit suppressed the error (the coroutine would return None). */
static int start_lazy(Within *self) {
    PyObject *span = self->open(self->owner, &self->argv, &self->kwnames, self->nargs, &self->after);
    PyObject *const *args = &PyTuple_GET_ITEM(self->argv, 0); /* the call's, maybe new */
    /* The positional ones are the values before the keywords' (an opener may pass them
     * differently: kafka_send.c makes every argument positional). */
    Py_ssize_t nkw = self->kwnames == NULL ? 0 : PyTuple_GET_SIZE(self->kwnames);
    size_t nargsf = (size_t)(PyTuple_GET_SIZE(self->argv) - nkw);
    PyObject *aw;
    if (span == NULL || span == Py_None) { /* no span: nothing of the opener's to do at the end */
        self->after.fn = NULL;
        Py_CLEAR(self->after.state);
    }
    if (span == NULL) {
        if (PyErr_Occurred()) {
            return -1; /* not an Exception (the opener clears those): raised */
        }
        aw = PyObject_Vectorcall(self->fallback, args, nargsf, self->kwnames);
    } else if (span == Py_None) { /* no span to make: the call as it came, without one */
        Py_DECREF(span);
        aw = PyObject_Vectorcall(self->orig, args, nargsf, self->kwnames);
    } else {
        if (swmp_span_enter(span) < 0) { /* as ``with span:`` entering: raised */
            Py_DECREF(span);
            return -1;
        }
        self->span = span;
        aw = PyObject_Vectorcall(self->orig, args, nargsf, self->kwnames);
    }
    PyObject *inner = aw == NULL ? NULL : await_iter(aw);
    Py_XDECREF(aw);
    Py_CLEAR(self->argv); /* what the call needed is the awaitable's now */
    if (inner == NULL) {
        return exit_span(self, 1) > 0 ? 1 : -1;
    }
    self->inner = inner;
    return 0;
}

static PySendResult within_send(PyObject *obj, PyObject *arg, PyObject **result) {
    Within *self = (Within *)obj;
    *result = NULL;
    if (self->state == DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return PYGEN_ERROR;
    }
    if (self->state == NOT_STARTED) {
        if (arg != Py_None) { /* refused before anything starts (no span entered), as by a coroutine */
            PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
            return PYGEN_ERROR;
        }
        if (self->open != NULL) {
            int started = start_lazy(self);
            if (started != 0) {
                self->state = DONE;
                *result = started > 0 ? Py_NewRef(Py_None) : NULL;
                return started > 0 ? PYGEN_RETURN : PYGEN_ERROR;
            }
        } else {
            PyObject *entered = swmp_cm_enter(self->span, s_enter);
            if (entered == NULL) {
                self->state = DONE;
                return PYGEN_ERROR;
            }
            Py_DECREF(entered);
        }
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

/* The exception of ``throw(type[, value[, traceback]])`` set as raised: 0; -1: the arguments
 * are not an exception (a TypeError set instead, as ``coroutine.throw`` raises it without
 * touching the coroutine). */
static int set_thrown(PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw expected 1 to 3 arguments");
        return -1;
    }
    PyObject *type = args[0], *value = nargs > 1 && args[1] != Py_None ? args[1] : NULL;
    PyObject *tb = nargs > 2 && args[2] != Py_None ? args[2] : NULL;
    if (PyExceptionInstance_Check(type)) {
        if (value != NULL) {
            PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
            return -1;
        }
        value = type;
        type = (PyObject *)Py_TYPE(value);
    } else if (!PyExceptionClass_Check(type)) {
        PyErr_Format(PyExc_TypeError, "exceptions must be classes or instances deriving from BaseException, not %s",
                     Py_TYPE(type)->tp_name);
        return -1;
    }
    PyObject *t = Py_NewRef(type), *v = Py_XNewRef(value), *b = Py_XNewRef(tb);
    PyErr_NormalizeException(&t, &v, &b);
    if (b != NULL && v != NULL) {
        PyException_SetTraceback(v, b);
    }
    PyErr_Restore(t, v, b);
    return 0;
}

/* ``throw(...)`` into a coroutine not started: the exception thrown is raised where its body
 * would begin, none of it run. */
static PyObject *raise_thrown(Within *self, PyObject *const *args, Py_ssize_t nargs) {
    if (set_thrown(args, nargs) == 0) {
        self->state = DONE; /* a valid throw ends it, as it ends a coroutine not started */
    }
    return NULL;
}

static PyObject *within_throw(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    Within *self = (Within *)obj;
    if (self->inner == NULL) { /* the lazy form before its first send */
        return raise_thrown(self, args, nargs);
    }
    PyObject *throw = PyObject_GetAttr(self->inner, s_throw), *out = NULL;
    if (throw != NULL) {
        out = PyObject_Vectorcall(throw, args, nargs, NULL);
        Py_DECREF(throw);
    } else if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return NULL;
    } else {
        /* An awaited iterator without throw(): a coroutine raises the exception at its
         * ``await`` (where the ``with`` sees it), as here. */
        PyErr_Clear();
        if (set_thrown(args, nargs) < 0) {
            return NULL; /* not an exception: refused, the coroutine untouched */
        }
    }
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
        if (self->inner == NULL) {
            Py_RETURN_NONE; /* the lazy form never started: nothing was made */
        }
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
    Py_VISIT(self->owner);
    Py_VISIT(self->orig);
    Py_VISIT(self->fallback);
    Py_VISIT(self->argv);
    Py_VISIT(self->kwnames);
    Py_VISIT(self->after.state);
    return 0;
}

static int within_clear(Within *self) {
    Py_CLEAR(self->span);
    Py_CLEAR(self->inner);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->orig);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->argv);
    Py_CLEAR(self->kwnames);
    self->after.fn = NULL;
    Py_CLEAR(self->after.state);
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

/* The names, made at the first call (out of line: later calls only test a pointer). */
__attribute__((noinline, cold)) static int make_names(void) {
    if ((s_enter = PyUnicode_InternFromString("__enter__")) == NULL ||
        (s_exit = PyUnicode_InternFromString("__exit__")) == NULL ||
        (s_throw = PyUnicode_InternFromString("throw")) == NULL ||
        (s_close = PyUnicode_InternFromString("close")) == NULL) {
        return -1;
    }
    return 0;
}

static inline int init_names(void) {
    return s_close != NULL ? 0 : make_names();
}

static Within *new_within(void) {
    Within *self = PyObject_GC_New(Within, &swmp_WithinType);
    if (self != NULL) {
        self->span = self->inner = self->owner = self->orig = self->fallback = self->argv = self->kwnames = NULL;
        self->open = NULL;
        self->nargs = 0;
        self->after.fn = NULL;
        self->after.state = NULL;
        self->state = NOT_STARTED;
    }
    return self;
}

PyObject *swmp_within(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "within(span, awaitable)");
        return NULL;
    }
    if (init_names() < 0) {
        return NULL;
    }
    PyObject *inner = await_iter(args[1]);
    if (inner == NULL) {
        return NULL;
    }
    Within *self = new_within();
    if (self == NULL) {
        Py_DECREF(inner);
        return NULL;
    }
    self->span = Py_NewRef(args[0]);
    self->inner = inner;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

PyObject *swmp_within_lazy(swmp_within_opener open, PyObject *owner, PyObject *orig, PyObject *fallback,
                           PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (init_names() < 0) {
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *argv = PyTuple_New(nargs + nkw);
    if (argv == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        PyTuple_SET_ITEM(argv, i, Py_NewRef(args[i]));
    }
    Within *self = new_within();
    if (self == NULL) {
        Py_DECREF(argv);
        return NULL;
    }
    self->open = open;
    self->owner = Py_NewRef(owner);
    self->orig = Py_NewRef(orig);
    self->fallback = Py_NewRef(fallback);
    self->argv = argv;
    self->kwnames = nkw ? Py_NewRef(kwnames) : NULL;
    self->nargs = nargs;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
