/* swmp._spancore's SegmentCore (see spancore.c): a new segment, its fields and its span
 * ids, and the ids of this process (``new_id``) it draws its own from. Its bookkeeping at a
 * span's end is finish.c's, its record emit.c's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#include "attrcache.h"
#include "segment.h"
#include "span.h"

/* The names of a segment's fields SEG_FIELD reads by attribute, and the empty operation
 * name (a segment's ``ended_op`` until it is emitted). */
PyObject *swmp_s_open, *swmp_s_token, *swmp_empty_op;
static PyObject *s_pid, *s_unbound, *s_bind;

int swmp_segment_init(void) {
    return swmp_intern(&swmp_s_open, "_open") < 0 || swmp_intern(&swmp_s_token, "_token") < 0 ||
                   swmp_intern(&s_pid, "pid") < 0 || swmp_intern(&s_unbound, "unbound") < 0 ||
                   swmp_intern(&s_bind, "bind") < 0 || swmp_intern(&swmp_empty_op, "") < 0
               ? -1
               : 0;
}

/* -- ids -------------------------------------------------------------------------------- */

/* set_ids(prefix, pid, pid_holder, pid_function, reseed): ``prefix`` and ``pid`` as drawn by
 * swmp.tracing.ids for this process; the current pid is ``pid_holder.pid`` (kept by the fork
 * hooks, no system call) or, when the holder is None, ``pid_function()``; ``reseed()`` draws
 * a new prefix (and calls set_ids) when they differ: after a fork. */
static PyObject *id_prefix = NULL;
static long long id_pid = -1;
static unsigned long long id_counter = 0;
static PyObject *pid_holder = NULL, *pid_function = NULL, *reseed_ids = NULL;

PyObject *swmp_set_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_Check(args[0]) || !PyLong_Check(args[1]) || !PyCallable_Check(args[3]) ||
        !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "set_ids(prefix: str, pid: int, pid_holder, pid_function, reseed)");
        return NULL;
    }
    long long pid = PyLong_AsLongLong(args[1]);
    if (pid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_XSETREF(id_prefix, Py_NewRef(args[0]));
    Py_XSETREF(pid_holder, Py_NewRef(args[2]));
    Py_XSETREF(pid_function, Py_NewRef(args[3]));
    Py_XSETREF(reseed_ids, Py_NewRef(args[4]));
    id_pid = pid;
    id_counter = 0;
    Py_RETURN_NONE;
}

/* ``holder.pid`` (kept by the fork hooks, no system call) or, with no holder, ``fn()``;
 * -1 with an error. */
long long swmp_pid_of(PyObject *holder, PyObject *fn, swmp_AttrCache *cache) {
    PyObject *v = holder != Py_None ? swmp_slot_attr(holder, s_pid, cache) : PyObject_CallNoArgs(fn);
    if (v == NULL) {
        return -1;
    }
    long long pid = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return pid;
}

static long long current_pid(void) {
    static swmp_AttrCache at_pid;
    return swmp_pid_of(pid_holder, pid_function, &at_pid);
}

static PyObject *draw_id(void) {
    if (id_prefix == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.set_ids() was not called");
        return NULL;
    }
    long long pid = current_pid();
    if (pid == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pid != id_pid) {
        PyObject *r = PyObject_CallNoArgs(reseed_ids); /* calls set_ids() */
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    /* The counter is safe under the GIL: nothing between the read and the store releases it. */
    unsigned long long n = ++id_counter;
    char digits[24];
    int len = 0;
    do { /* backwards: the id is built once, in one allocation */
        digits[sizeof digits - 1 - len++] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    if (PyUnicode_KIND(id_prefix) != PyUnicode_1BYTE_KIND) { /* set_ids() got a non-ASCII prefix */
        PyObject *tail = PyUnicode_FromStringAndSize(digits + sizeof digits - len, len);
        PyObject *id = tail == NULL ? NULL : PyUnicode_Concat(id_prefix, tail);
        Py_XDECREF(tail);
        return id;
    }
    Py_ssize_t plen = PyUnicode_GET_LENGTH(id_prefix);
    PyObject *id = PyUnicode_New(plen + len, PyUnicode_MAX_CHAR_VALUE(id_prefix));
    if (id == NULL) {
        return NULL;
    }
    memcpy(PyUnicode_1BYTE_DATA(id), PyUnicode_1BYTE_DATA(id_prefix), (size_t)plen);
    memcpy(PyUnicode_1BYTE_DATA(id) + plen, digits + sizeof digits - len, (size_t)len);
    return id;
}

PyObject *swmp_new_id(PyObject *module, PyObject *unused) {
    return draw_id();
}

/* -- the segment ------------------------------------------------------------------------- */


/* set_segments(identity, no_correlation): what a new segment needs. */
PyObject *swmp_seg_identity = NULL, *swmp_no_correlation = NULL;

PyObject *swmp_set_segments(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_segments(identity, no_correlation)");
        return NULL;
    }
    Py_XSETREF(swmp_seg_identity, Py_NewRef(args[0]));
    Py_XSETREF(swmp_no_correlation, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyObject *segcore_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (swmp_seg_identity == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.set_segments() was not called");
        return NULL;
    }
    PyObject *trace_id = Py_None;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds) != 0) || PyTuple_GET_SIZE(args) > 1) {
        PyErr_SetString(PyExc_TypeError, "Segment() takes at most one positional argument (trace_id)");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) == 1) {
        trace_id = PyTuple_GET_ITEM(args, 0);
    }
    /* The first segment of a process names it (its ring slot and instance) before anything
     * is built: its outgoing sw8 headers carry the instance name. */
    static swmp_AttrCache at_unbound;
    PyObject *unbound = swmp_slot_attr(swmp_seg_identity, s_unbound, &at_unbound);
    if (unbound == NULL) {
        return NULL;
    }
    int must_bind = PyObject_IsTrue(unbound);
    Py_DECREF(unbound);
    if (must_bind < 0) {
        return NULL;
    }
    if (must_bind) {
        PyObject *r = PyObject_CallMethodNoArgs(swmp_seg_identity, s_bind);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    int continues = PyObject_IsTrue(trace_id);
    if (continues < 0) {
        return NULL;
    }
    PyObject *sid = draw_id();
    if (sid == NULL) {
        return NULL;
    }
    SegmentCore *self = (SegmentCore *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(sid);
        return NULL;
    }
    /* A new trace reuses the segment's id as the trace id: both are unique ids. */
    self->trace_id = Py_NewRef(continues ? trace_id : sid);
    self->segment_id = sid;
    self->finished = PyList_New(2); /* the item array made with the segment, not at its end */
    self->next_id = 1;
    /* Room for an exit span's token from the start (appended without a resize). */
    self->open = PyList_New(2);
    self->token = PyList_New(1);
    self->first = Py_NewRef(Py_None);
    self->size_limited = Py_NewRef(Py_False);
    self->skip_analysis = Py_NewRef(Py_False);
    self->encoded = Py_NewRef(Py_None);
    self->correlation = Py_NewRef(swmp_no_correlation);
    self->profile = Py_NewRef(Py_None);
    self->ended_op = Py_NewRef(swmp_empty_op);
    if (self->finished == NULL || self->open == NULL || self->token == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyList_SET_ITEM(self->open, 0, Py_NewRef(Py_None)); /* the first span's token */
    Py_SET_SIZE(self->open, 1);
    Py_SET_SIZE(self->finished, 0);
    PyList_SET_ITEM(self->token, 0, Py_NewRef(Py_True));
    return (PyObject *)self;
}

static int segcore_init(PyObject *self, PyObject *args, PyObject *kwds) {
    return 0; /* everything is done by __new__ */
}

static int segcore_traverse(SegmentCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->trace_id);
    Py_VISIT(self->segment_id);
    Py_VISIT(self->finished);
    Py_VISIT(self->open);
    Py_VISIT(self->token);
    Py_VISIT(self->first);
    Py_VISIT(self->size_limited);
    Py_VISIT(self->skip_analysis);
    Py_VISIT(self->encoded);
    Py_VISIT(self->correlation);
    Py_VISIT(self->profile);
    Py_VISIT(self->ended_op);
    return 0;
}

static int segcore_clear(SegmentCore *self) {
    Py_CLEAR(self->trace_id);
    Py_CLEAR(self->segment_id);
    Py_CLEAR(self->finished);
    Py_CLEAR(self->open);
    Py_CLEAR(self->token);
    Py_CLEAR(self->first);
    Py_CLEAR(self->size_limited);
    Py_CLEAR(self->skip_analysis);
    Py_CLEAR(self->encoded);
    Py_CLEAR(self->correlation);
    Py_CLEAR(self->profile);
    Py_CLEAR(self->ended_op);
    return 0;
}

static void segcore_dealloc(SegmentCore *self) {
    PyObject_GC_UnTrack(self);
    segcore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int segcore_setattro(PyObject *self, PyObject *name, PyObject *value) {
    return swmp_refuse_field_deletion(self, name, value, &swmp_SegmentCoreType);
}

#define SEGFIELD(name, member) {name, T_OBJECT_EX, offsetof(SegmentCore, member), 0, NULL}
static PyMemberDef segcore_members[] = {
    SEGFIELD("trace_id", trace_id),
    SEGFIELD("segment_id", segment_id),
    SEGFIELD("finished", finished),
    SEGFIELD("_open", open),
    SEGFIELD("_token", token),
    SEGFIELD("first", first),
    SEGFIELD("size_limited", size_limited),
    SEGFIELD("skip_analysis", skip_analysis),
    SEGFIELD("encoded", encoded),
    SEGFIELD("correlation", correlation),
    SEGFIELD("profile", profile),
    SEGFIELD("ended_op", ended_op),
    {NULL, 0, 0, 0, NULL},
};

/* ``segment._ids``: the span-id counter as Python sees it (``next(seg._ids)``), an iterator
 * over the segment's ``next_id``. The C paths take ``next_id`` directly. Why not the
 * ``itertools.count(1)`` of the Python core: making one (a call of the type, its arguments
 * parsed) was ~600 instructions of every new segment, and a segment of one span (a task
 * published or a message consumed outside a request, a request with no exit span) never
 * draws an id from it. */
typedef struct {
    PyObject_HEAD
    SegmentCore *seg;
} SpanIds;

static int spanids_traverse(SpanIds *self, visitproc visit, void *arg) {
    Py_VISIT(self->seg);
    return 0;
}

static int spanids_clear(SpanIds *self) {
    Py_CLEAR(self->seg);
    return 0;
}

static void spanids_dealloc(SpanIds *self) {
    PyObject_GC_UnTrack(self);
    spanids_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *spanids_next(SpanIds *self) {
    if (self->seg == NULL) {
        return NULL;
    }
    return PyLong_FromSsize_t(self->seg->next_id++); /* atomic under the GIL, as count's is */
}

PyTypeObject swmp_SpanIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SpanIds",
    .tp_basicsize = sizeof(SpanIds),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The span ids of a segment still to be drawn (next() gives the next one).",
    .tp_dealloc = (destructor)spanids_dealloc,
    .tp_traverse = (traverseproc)spanids_traverse,
    .tp_clear = (inquiry)spanids_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)spanids_next,
};

static PyObject *segcore_get_ids(SegmentCore *self, void *closure) {
    SpanIds *ids = PyObject_GC_New(SpanIds, &swmp_SpanIdsType);
    if (ids == NULL) {
        return NULL;
    }
    ids->seg = (SegmentCore *)Py_NewRef(self);
    PyObject_GC_Track(ids);
    return (PyObject *)ids;
}

static PyGetSetDef segcore_getset[] = {
    {"_ids", (getter)segcore_get_ids, NULL, "The span ids still to be drawn (id 0 is the first span's).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject swmp_SegmentCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.SegmentCore",
    .tp_basicsize = sizeof(SegmentCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields and creation of a segment (see swmp.tracing.segment).",
    .tp_new = segcore_new,
    .tp_init = segcore_init,
    .tp_dealloc = (destructor)segcore_dealloc,
    .tp_traverse = (traverseproc)segcore_traverse,
    .tp_clear = (inquiry)segcore_clear,
    .tp_members = segcore_members,
    .tp_getset = segcore_getset,
    .tp_setattro = segcore_setattro,
};
