/* A segment's SEGMENT record (see spancore.c): its span rows, and emitting it after its last
 * span's end (finish.c calls swmp_emit_segment, once per segment): Segment.emit's steps in C
 * for a native segment, written to the ring directly when the sink allows. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#include "attrcache.h"
#include "emit.h"
#include "json.h"
#include "segment.h"
#include "span.h"

/* -- the record -------------------------------------------------------------------------- */

/* rows(spans, skip_analysis): [[span_id, parent_id, start, end, op, peer, kind, layer,
 * component, is_error, skip_analysis, tags, logs, refs], ...], the SEGMENT record's spans. */
static PyObject *rows_of(PyObject *spans, PyObject *skip) {
    Py_ssize_t n = PyList_GET_SIZE(spans);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(spans, i);
        if (!PyObject_TypeCheck(item, &swmp_SpanCoreType)) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_TypeError, "rows() takes spans of SpanCore");
            return NULL;
        }
        SpanCore *s = (SpanCore *)item;
        PyObject *row = PyList_New(14);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *fields[14] = {s->span_id, s->parent_id, s->start, s->end, s->op, s->peer, s->kind,
                                s->layer, s->component, s->is_error, skip, s->tags, s->logs, s->refs};
        for (int k = 0; k < 14; k++) {
            PyList_SET_ITEM(row, k, Py_NewRef(fields[k]));
        }
        PyList_SET_ITEM(out, i, row);
    }
    return out;
}

PyObject *swmp_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "rows(spans: list, skip_analysis)");
        return NULL;
    }
    return rows_of(args[0], args[1]);
}

/* -- emitting ---------------------------------------------------------------------------- */

/* set_emit(emit, identity, dumps, sink_namespace, stats, record_type): Segment.emit (the
 * Python method this replaces while a segment's class still has it) and what it uses. The
 * sink is read from swmp._sink's namespace (its ``_sink``, which set_sink() replaces): a
 * dict look-up where calling get_sink() was a Python frame per segment. */
static PyObject *e_emit = NULL, *e_identity = NULL, *e_dumps = NULL, *e_sink_ns = NULL, *e_stats = NULL,
                *e_rtype = NULL;
static PyObject *s_service, *s_instance, *s_write, *s_written, *s_dropped, *s_sink, *s_emit, *s_op, *one;

PyObject *swmp_set_emit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[2]) || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "set_emit(emit, identity, dumps, sink_namespace: dict, stats, record_type)");
        return NULL;
    }
    Py_XSETREF(e_emit, Py_NewRef(args[0]));
    Py_XSETREF(e_identity, Py_NewRef(args[1]));
    Py_XSETREF(e_dumps, Py_NewRef(args[2]));
    Py_XSETREF(e_sink_ns, Py_NewRef(args[3]));
    Py_XSETREF(e_stats, Py_NewRef(args[4]));
    Py_XSETREF(e_rtype, Py_NewRef(args[5]));
    Py_RETURN_NONE;
}

/* set_direct_sink(write, pid_holder, pid_function): ``write`` is the sink method (the
 * agent's ProcessSink.write) whose every call, while ``sink._pid`` is this process's pid and
 * ``sink._writer`` is not None, is exactly ``sink._writer.write(rtype, payload)``; the pid is
 * ``pid_holder.pid`` (kept by the fork hooks) or, when the holder is None, ``pid_function()``:
 * swmp.lifecycle.current_pid, as write() itself reads it. emit_fast then calls the ring
 * writer itself, a Python frame (and its pid check's) less per segment; a sink of another
 * class, a subclass with its own write, or a sink in any other state goes through write(). */
static PyObject *d_write = NULL, *d_holder = NULL, *d_pid_fn = NULL, *s_sink_pid, *s_sink_writer;

PyObject *swmp_set_direct_sink(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "set_direct_sink(write, pid_holder, pid_function)");
        return NULL;
    }
    Py_XSETREF(d_write, Py_NewRef(args[0]));
    Py_XSETREF(d_holder, Py_NewRef(args[1]));
    Py_XSETREF(d_pid_fn, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

int swmp_emit_init(void) {
    if (swmp_intern(&s_emit, "emit") < 0 || swmp_intern(&s_service, "service") < 0 ||
        swmp_intern(&s_instance, "instance") < 0 || swmp_intern(&s_write, "write") < 0 ||
        swmp_intern(&s_sink, "_sink") < 0 || swmp_intern(&s_sink_pid, "_pid") < 0 ||
        swmp_intern(&s_sink_writer, "_writer") < 0 || swmp_intern(&s_written, "segments_written") < 0 ||
        swmp_intern(&s_dropped, "segments_dropped") < 0 || swmp_intern(&s_op, "op") < 0) {
        return -1;
    }
    one = PyLong_FromLong(1);
    return one == NULL ? -1 : 0;
}

/* The ring writer ``sink.write()`` would hand the record to, as a new reference; NULL (and
 * no error) when write() must decide: another class, another pid (a fork to notice, a first
 * claim), no ring (a master, a process without a slot), anything unexpected. */
static PyObject *direct_writer(PyObject *sink) {
    static swmp_AttrCache at_pid, at_sink_pid, at_sink_writer; /* ProcessSink's slots */
    if (d_write == NULL || _PyType_Lookup(Py_TYPE(sink), s_write) != d_write) {
        return NULL;
    }
    PyObject *bound = swmp_slot_attr(sink, s_sink_pid, &at_sink_pid);
    long long pid = bound == NULL ? -1 : PyLong_AsLongLong(bound); /* -1: not bound yet */
    Py_XDECREF(bound);
    int same = pid != -1 && pid == swmp_pid_of(d_holder, d_pid_fn, &at_pid);
    PyObject *writer = same ? swmp_slot_attr(sink, s_sink_writer, &at_sink_writer) : NULL;
    if (writer == Py_None) {
        Py_CLEAR(writer);
    }
    if (writer == NULL) {
        PyErr_Clear();
    }
    return writer;
}

/* ``writer.write(e_rtype, payload)``: the result, or NULL with an error. The ring writer keeps
 * its ``write`` in a slot (the native Writer's bound method, or the pure fallback's
 * function); read where it lies and, when it is a builtin taking fast calls, called through
 * its C function as vectorcall would, without the method look-up (the type's member
 * descriptor, its ``__get__``) and the call's dispatch: ~20 lines of libpython code per
 * segment, each a miss when a request or a message starts with cold caches. */
static PyObject *ring_write(PyObject *writer, PyObject *payload) {
    static swmp_AttrCache at_write;
    PyObject *write = swmp_slot_attr(writer, s_write, &at_write);
    if (write == NULL) {
        return NULL;
    }
    PyObject *res;
    PyObject *args[2] = {e_rtype, payload};
    if (PyCFunction_CheckExact(write) && PyCFunction_GET_FLAGS(write) == METH_FASTCALL) {
        _PyCFunctionFast fn = (_PyCFunctionFast)(void (*)(void))PyCFunction_GET_FUNCTION(write);
        res = fn(PyCFunction_GET_SELF(write), args, 2);
    } else {
        res = PyObject_Vectorcall(write, args, 2, NULL);
    }
    Py_DECREF(write);
    return res;
}

/* ``v + 1``: an exact int in C (the conversions the path makes anyway), anything else as
 * Python adds it. Why: ``PyNumber_Add``'s dispatch and ``long_add`` were ~7 code lines per
 * segment that nothing else on the path runs. */
static PyObject *plus_one(PyObject *v) {
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && x != -1 && x < LLONG_MAX) {
            return PyLong_FromLongLong(x + 1);
        }
        PyErr_Clear(); /* -1 (maybe an error: none for an exact int), or too large: as Python does */
    }
    return PyNumber_Add(v, one);
}

/* ``stats.<name> += 1`` (``segments_written`` or ``segments_dropped``). For the tracing
 * core's Stats (a __slots__ class) the slot is updated where it lies, as the member
 * descriptor would, instead of two attribute look-ups on every emitted segment. */
static int count_stat(PyObject *name) {
    static swmp_AttrCache at_written, at_dropped;
    PyObject **slot = swmp_slot_ref(e_stats, name, name == s_written ? &at_written : &at_dropped);
    if (slot != NULL && *slot != NULL) {
        PyObject *nv = plus_one(*slot);
        if (nv == NULL) {
            return -1;
        }
        Py_SETREF(*slot, nv);
        return 0;
    }
    PyObject *v = PyObject_GetAttr(e_stats, name);
    PyObject *nv = v == NULL ? NULL : PyNumber_Add(v, one);
    int r = nv == NULL ? -1 : PyObject_SetAttr(e_stats, name, nv);
    Py_XDECREF(v);
    Py_XDECREF(nv);
    return r;
}

/* After its record is written (or given up) a segment lets go of its spans: it held them
 * in ``finished`` and ``first`` while each span holds its segment, a reference cycle per
 * traced request that only the garbage collector could free (its generation-0 passes were
 * ~5,000 instructions per request). The first span's name stays as ``ended_op`` for the
 * endpoint of late work that refers to this segment. Same as Segment._release in Python. */
static void release_spans(SegmentCore *seg) {
    PyObject *first = seg->first;
    if (first != Py_None) {
        PyObject *op = PyObject_TypeCheck(first, &swmp_SpanCoreType) ? Py_NewRef(((SpanCore *)first)->op)
                                                                : PyObject_GetAttr(first, s_op);
        if (op == NULL) {
            PyErr_Clear(); /* keeps the span: a cycle the collector frees, as before */
            return;
        }
        Py_SETREF(seg->ended_op, op);
        Py_SETREF(seg->first, Py_NewRef(Py_None));
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        PyErr_Clear();
        return;
    }
    Py_SETREF(seg->finished, fresh);
}

/* Segment.emit of a native segment, in C: the SEGMENT record (segment.py's to_record
 * layout), serialized, handed to the sink, counted. 1: done. 0: a step raised before
 * anything was written: the caller runs the Python emit, which does it again and counts and
 * logs the failure as it always has. -1: an error after the write (counting). */
/* The record's JSON written from the fields directly (json.c); NULL with no error set when
 * the writer declines (a value only orjson decides) or a span is not ours. */
#define ROW_WIDTH 14
#define STACK_SPANS 16

static PyObject *record_json(SegmentCore *seg, PyObject *service, PyObject *instance) {
    PyObject *spans = seg->finished;
    if (!PyList_Check(spans)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(spans);
    PyObject *stack[STACK_SPANS * ROW_WIDTH];
    PyObject **fields = n <= STACK_SPANS ? stack : PyMem_Malloc(sizeof(PyObject *) * ROW_WIDTH * (size_t)n);
    if (fields == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *out = NULL;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(spans, i);
        if (!PyObject_TypeCheck(item, &swmp_SpanCoreType)) {
            break;
        }
        SpanCore *s = (SpanCore *)item;
        /* Borrowed: the writer runs no Python code, so nothing can change under it. */
        PyObject *row[ROW_WIDTH] = {s->span_id, s->parent_id, s->start, s->end, s->op, s->peer, s->kind,
                                    s->layer, s->component, s->is_error, seg->skip_analysis, s->tags, s->logs,
                                    s->refs};
        memcpy(fields + i * ROW_WIDTH, row, sizeof row);
    }
    if (i == n) {
        PyObject *head[5] = {seg->trace_id, seg->segment_id, service, instance, seg->size_limited};
        out = swmp_json_record(head, 5, fields, n, ROW_WIDTH);
    }
    if (fields != stack) {
        PyMem_Free(fields);
    }
    return out;
}

/* The record built as lists and serialized by orjson (what the writer declined). */
static PyObject *record_orjson(SegmentCore *seg, PyObject *service, PyObject *instance) {
    PyObject *spans = rows_of(seg->finished, seg->skip_analysis);
    PyObject *rec = spans == NULL ? NULL : PyList_New(6);
    if (rec == NULL) {
        Py_XDECREF(spans);
        return NULL;
    }
    PyList_SET_ITEM(rec, 0, Py_NewRef(seg->trace_id));
    PyList_SET_ITEM(rec, 1, Py_NewRef(seg->segment_id));
    PyList_SET_ITEM(rec, 2, Py_NewRef(service));
    PyList_SET_ITEM(rec, 3, Py_NewRef(instance));
    PyList_SET_ITEM(rec, 4, Py_NewRef(seg->size_limited));
    PyList_SET_ITEM(rec, 5, spans);
    PyObject *payload = PyObject_CallOneArg(e_dumps, rec);
    Py_DECREF(rec);
    return payload;
}

static int emit_fast(SegmentCore *seg) {
    static swmp_AttrCache at_service, at_instance;
    PyObject *service = swmp_slot_attr(e_identity, s_service, &at_service);
    PyObject *instance = service == NULL ? NULL : swmp_slot_attr(e_identity, s_instance, &at_instance);
    PyObject *payload = NULL;
    if (instance != NULL) {
        payload = record_json(seg, service, instance);
        if (payload == NULL) {
            PyErr_Clear();
            payload = record_orjson(seg, service, instance);
        }
    }
    Py_XDECREF(service);
    Py_XDECREF(instance);
    PyObject *sink = payload == NULL ? NULL : Py_XNewRef(PyDict_GetItemWithError(e_sink_ns, s_sink));
    if (sink == NULL) {
        Py_XDECREF(payload);
        PyErr_Clear();
        return 0;
    }
    PyObject *res = NULL;
    PyObject *writer = direct_writer(sink);
    if (writer != NULL) {
        res = ring_write(writer, payload);
        Py_DECREF(writer);
        if (res == NULL) {
            PyErr_Clear(); /* refused before writing anything: write() decides, and counts */
        }
    }
    if (res == NULL) {
        PyObject *call[3] = {sink, e_rtype, payload};
        res = PyObject_VectorcallMethod(s_write, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(sink);
    Py_DECREF(payload);
    if (res == NULL) {
        PyErr_Clear(); /* a sink that raised wrote nothing (sinks never raise: see _sink.py) */
        return 0;
    }
    int ok = res == Py_True ? 1 : res == Py_False ? 0 : PyObject_IsTrue(res);
    Py_DECREF(res);
    release_spans(seg);
    if (ok < 0) {
        return -1;
    }
    return count_stat(ok ? s_written : s_dropped) < 0 ? -1 : 1;
}

/* seg.emit(): in C when the segment is ours and its class still has Segment.emit. */
int swmp_emit_segment(PyObject *seg) {
    if (e_emit != NULL && PyObject_TypeCheck(seg, &swmp_SegmentCoreType) &&
        _PyType_Lookup(Py_TYPE(seg), s_emit) == e_emit) {
        int r = emit_fast((SegmentCore *)seg);
        if (r != 0) {
            return r < 0 ? -1 : 0;
        }
    }
    PyObject *res = PyObject_CallMethodNoArgs(seg, s_emit);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    return 0;
}
