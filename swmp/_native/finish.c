/* A span's way through the context and its end (see spancore.c): entered (made current),
 * finished (the end time, the context given back to the nearest open ancestor, the
 * segment's bookkeeping, which emits it after its last span), and the span steps the
 * module's other sources take. All of it runs for every span: it stays in this one file
 * (and span.h's inline functions), where the compiler inlines it into the methods. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "emit.h"
#include "finish.h"
#include "segment.h"
#include "span.h"
#include "spancore.h"
#include "start.h"

static PyObject *s_enter_method, *s_exit_method, *s_finished, *s_error, *s_interrupted, *s_profile, *s_stop, *s_end,
    *s_prev, *s_tags;

int swmp_finish_init(void) {
    return swmp_intern(&s_finished, "finished") < 0 || swmp_intern(&s_enter_method, "__enter__") < 0 ||
                   swmp_intern(&s_exit_method, "__exit__") < 0 || swmp_intern(&s_error, "error") < 0 ||
                   swmp_intern(&s_interrupted, "interrupted") < 0 || swmp_intern(&s_profile, "profile") < 0 ||
                   swmp_intern(&s_stop, "stop") < 0 || swmp_intern(&s_end, "end") < 0 ||
                   swmp_intern(&s_prev, "_prev") < 0 || swmp_intern(&s_tags, "tags") < 0
               ? -1
               : 0;
}

/* -- the context -------------------------------------------------------------------------- */

/* ``obj.end`` is true: the fields of our own spans directly, other objects by attribute. */
static int has_ended(PyObject *obj) {
    if (PyObject_TypeCheck(obj, &swmp_SpanCoreType)) {
        return PyObject_IsTrue(((SpanCore *)obj)->end);
    }
    PyObject *end = PyObject_GetAttr(obj, s_end);
    if (end == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(end);
    Py_DECREF(end);
    return r;
}

static PyObject *prev_of(PyObject *obj) {
    if (PyObject_TypeCheck(obj, &swmp_SpanCoreType)) {
        return Py_NewRef(((SpanCore *)obj)->prev);
    }
    return PyObject_GetAttr(obj, s_prev);
}

/* If this span is current, the nearest ancestor that is still open becomes current. */
static int leave_context(SpanCore *self) {
    PyObject *cur = swmp_get_current();
    if (cur == NULL) {
        return -1;
    }
    int is_self = cur == (PyObject *)self;
    Py_DECREF(cur);
    if (!is_self) {
        return 0;
    }
    PyObject *prev = Py_NewRef(self->prev);
    while (prev != Py_None) {
        int ended = has_ended(prev);
        if (ended < 0) {
            Py_DECREF(prev);
            return -1;
        }
        if (!ended) {
            break;
        }
        PyObject *up = prev_of(prev);
        Py_DECREF(prev);
        if (up == NULL) {
            return -1;
        }
        prev = up;
    }
    int r = swmp_set_current(prev);
    Py_DECREF(prev);
    return r;
}

/* -- finishing -------------------------------------------------------------------------- */

static int lost(void) {
    PyObject *r = PyObject_CallNoArgs(swmp_count_lost);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* ``lst.pop()`` of a non-empty list, the result dropped: the size lowered in place for an
 * exact list (no resize: a segment's bookkeeping lists hold one or two items, and shrinking
 * them meant a realloc of their item array at every span's end), else PyList_SetSlice. */
static int pop_last(PyObject *lst) {
    Py_ssize_t n = PyList_GET_SIZE(lst);
    if (!PyList_CheckExact(lst)) {
        return PyList_SetSlice(lst, n - 1, n, NULL);
    }
    PyObject *item = PyList_GET_ITEM(lst, n - 1);
    PyList_SET_ITEM(lst, n - 1, NULL);
    Py_SET_SIZE(lst, n - 1);
    Py_DECREF(item); /* last: the list is whole again if this runs a finalizer */
    return 0;
}

/* Segment.closed(span): record the span as finished, give back its open token, and emit the
 * segment if it was the last one open and the emit token is still there. */
static int segment_closed(SpanCore *self) {
    PyObject *seg = self->segment;
    PyObject *finished = SEG_FIELD(seg, finished, s_finished);
    if (finished == NULL) {
        return -1;
    }
    int r = PyList_Check(finished) ? PyList_Append(finished, (PyObject *)self) : -1;
    Py_DECREF(finished);
    if (r < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "segment.finished is not a list");
        }
        return -1;
    }
    PyObject *open = SEG_FIELD(seg, open, swmp_s_open);
    if (open == NULL) {
        return -1;
    }
    if (!PyList_Check(open)) {
        Py_DECREF(open);
        PyErr_SetString(PyExc_TypeError, "segment._open is not a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(open);
    if (n == 0) {
        Py_DECREF(open);
        return lost();
    }
    r = pop_last(open);
    Py_ssize_t left = PyList_GET_SIZE(open);
    Py_DECREF(open);
    if (r < 0) {
        return -1;
    }
    if (left) {
        return 0;
    }
    PyObject *token = SEG_FIELD(seg, token, swmp_s_token);
    if (token == NULL) {
        return -1;
    }
    if (!PyList_Check(token)) {
        Py_DECREF(token);
        PyErr_SetString(PyExc_TypeError, "segment._token is not a list");
        return -1;
    }
    n = PyList_GET_SIZE(token);
    if (n == 0) {
        /* Already emitted (a span that raced the segment's end): counted, not re-emitted. */
        Py_DECREF(token);
        return lost();
    }
    r = pop_last(token);
    Py_DECREF(token);
    if (r < 0) {
        return -1;
    }
    return swmp_emit_segment(seg);
}

/* ``parent_id`` of an exit span standing in for one dropped over the span limit
 * (swmp.tracing.span.UNRECORDED, the same value): not recorded, its end leaves the segment's
 * bookkeeping alone. */
#define UNRECORDED_PARENT (-2)

static int is_unrecorded(SpanCore *self) {
    int overflow = 0;
    return self->parent_id != NULL && PyLong_CheckExact(self->parent_id) &&
           PyLong_AsLongAndOverflow(self->parent_id, &overflow) == UNRECORDED_PARENT && overflow == 0;
}

/* The end of a span: profiling stopped first (no snapshot after the segment's end), the end
 * time, the context, the segment's bookkeeping. ``end_ms`` NULL or false: now. */
static int finish_span(SpanCore *self, PyObject *end_ms) {
    int ended = PyObject_IsTrue(self->end);
    if (ended != 0) {
        return ended < 0 ? -1 : 0;
    }
    int unrecorded = is_unrecorded(self);
    int overflow = 0;
    long id = PyLong_CheckExact(self->span_id) ? PyLong_AsLongAndOverflow(self->span_id, &overflow) : -1;
    if (id == 0 && overflow == 0 && !unrecorded) { /* an exact int: no error possible */
        PyObject *profile = SEG_FIELD(self->segment, profile, s_profile);
        if (profile == NULL) {
            return -1;
        }
        if (profile != Py_None) {
            PyObject *r = PyObject_CallMethodNoArgs(profile, s_stop);
            if (r == NULL) {
                Py_DECREF(profile);
                return -1;
            }
            Py_DECREF(r);
        }
        Py_DECREF(profile);
    }
    PyObject *end;
    int given = end_ms == NULL ? 0 : PyObject_IsTrue(end_ms);
    if (given < 0) {
        return -1;
    }
    end = given ? Py_NewRef(end_ms) : swmp_now_ms();
    if (end == NULL) {
        return -1;
    }
    Py_SETREF(self->end, end);
    if (leave_context(self) < 0) {
        return -1;
    }
    return unrecorded ? 0 : segment_closed(self); /* a stand-in is no part of its segment */
}

PyObject *swmp_spancore_enter(SpanCore *self, PyObject *unused) {
    PyObject *cur = swmp_get_current();
    if (cur == NULL) {
        return NULL;
    }
    Py_SETREF(self->prev, cur);
    if (swmp_set_current((PyObject *)self) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

PyObject *swmp_spancore_exit(SpanCore *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    if (args[1] != Py_None) {
        /* Only an Exception marks the span failed; a CancelledError, GeneratorExit,
         * KeyboardInterrupt or SystemExit is recorded by Span.interrupted (its docstring says
         * why), as PySpanCore.__exit__ does. */
        PyObject *r = PyObject_CallMethodOneArg(
            (PyObject *)self, PyObject_TypeCheck(args[1], (PyTypeObject *)PyExc_Exception) ? s_error : s_interrupted,
            args[1]);
        if (r == NULL) {
            /* Recording the exception failed (a subclass's error(), an object of the
             * application's that cannot be read): the span still ends, and the with
             * statement raises the application's exception, not this one. */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                int ended = finish_span(self, NULL);
                if (ended < 0) {
                    PyErr_Clear();
                }
                PyErr_Restore(type, value, tb);
                return NULL;
            }
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    if (finish_span(self, NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *swmp_spancore_finish(SpanCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *end_ms = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "finish() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1) {
        end_ms = args[0];
    } else if (nkw == 1) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) ||
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "end_ms") != 0) {
            PyErr_SetString(PyExc_TypeError, "finish() got an unexpected keyword argument");
            return NULL;
        }
        end_ms = args[0];
    }
    if (finish_span(self, end_ms) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The span steps the other sources take: for a span of the recorded class the methods' own
 * code, without the method look-ups (Span adds no __enter__ / __exit__ of its own). */
int swmp_span_enter(PyObject *span) {
    PyObject *r = Py_TYPE(span) == swmp_span_class ? swmp_spancore_enter((SpanCore *)span, NULL)
                                               : PyObject_CallMethodNoArgs(span, s_enter_method);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

int swmp_span_exit(PyObject *span, PyObject *exc) {
    PyObject *args[3] = {exc != NULL ? (PyObject *)Py_TYPE(exc) : Py_None, exc != NULL ? exc : Py_None, Py_None};
    PyObject *r = swmp_spancore_exit((SpanCore *)span, args, 3);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

PyObject *swmp_span_tags(PyObject *span) {
    return ((SpanCore *)span)->tags;
}

void swmp_span_set_tags(PyObject *span, PyObject *tags) {
    Py_SETREF(((SpanCore *)span)->tags, tags);
}

/* Any span's: a span core's in its struct (its fields cannot be deleted, so never NULL: the
 * member descriptor's answer), another kind by attribute. */
PyObject *swmp_tags_of(PyObject *span) {
    return PyObject_TypeCheck(span, &swmp_SpanCoreType) ? Py_NewRef(swmp_span_tags(span))
                                                        : PyObject_GetAttr(span, s_tags);
}

int swmp_set_tags_of(PyObject *span, PyObject *tags) {
    if (PyObject_TypeCheck(span, &swmp_SpanCoreType)) {
        swmp_span_set_tags(span, tags);
        return 0;
    }
    int r = PyObject_SetAttr(span, s_tags, tags);
    Py_DECREF(tags);
    return r;
}

PyObject *swmp_span_leave(PyObject *span, PyObject *result) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (result == NULL) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(value, tb);
        }
    }
    int r;
    if (Py_TYPE(span) == swmp_span_class) {
        r = swmp_span_exit(span, value);
    } else {
        PyObject *call[4] = {span, type != NULL ? type : Py_None, value != NULL ? value : Py_None,
                             tb != NULL ? tb : Py_None};
        PyObject *done = PyObject_VectorcallMethod(s_exit_method, call, 4, NULL);
        r = done == NULL ? -1 : 0;
        Py_XDECREF(done);
    }
    if (r < 0) {
        PyErr_Clear();
    }
    if (result == NULL) {
        PyErr_Restore(type, value, tb);
    }
    return result;
}
