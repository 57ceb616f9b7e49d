/* A span started in C where no Python frame needs to decide (see spancore.c): an exit span,
 * the child of the current span or the first of a new trace (exit_child, new_exit_span),
 * and a new segment's entry span, in a new trace or continuing a caller's (entry_root,
 * swmp_entry_sw8); anything else is handed back to the Python paths. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attrcache.h"
#include "carrier.h"
#include "segment.h"
#include "span.h"
#include "spancore.h"
#include "start.h"

/* For exit_child(), set once by setup_exit(): the Python class of recorded spans, the exit
 * kind, the span limits. */
PyTypeObject *swmp_span_class = NULL;
static PyObject *exit_kind = NULL;
static PyObject *limits = NULL;
/* Interned by swmp_start_init(), with the ints an entry span's ids are made of. */
static PyObject *s_ids, *s_span_limit, *s_rules, *s_sampling, *s_cache, *s_board, *s_sampled, *s_correlation,
    *s_skip_analysis, *s_trace_id, *minus_one;
PyObject *swmp_zero;

int swmp_start_init(void) {
    if (swmp_intern(&s_ids, "_ids") < 0 || swmp_intern(&s_span_limit, "span_limit") < 0 ||
        swmp_intern(&s_rules, "rules") < 0 || swmp_intern(&s_sampling, "sampling") < 0 ||
        swmp_intern(&s_cache, "_cache") < 0 || swmp_intern(&s_board, "board") < 0 ||
        swmp_intern(&s_sampled, "sampled") < 0 || swmp_intern(&s_correlation, "correlation") < 0 ||
        swmp_intern(&s_skip_analysis, "skip_analysis") < 0 || swmp_intern(&s_trace_id, "trace_id") < 0) {
        return -1;
    }
    return (swmp_zero = PyLong_FromLong(0)) == NULL || (minus_one = PyLong_FromLong(-1)) == NULL ? -1 : 0;
}

/* A list attribute of the segment (borrowed checks, new reference). */
static PyObject *seg_list(PyObject *v, PyObject *name) {
    if (v != NULL && !PyList_Check(v)) {
        Py_DECREF(v);
        PyErr_Format(PyExc_TypeError, "segment.%U is not a list", name);
        return NULL;
    }
    return v;
}

static PyObject *exit_root(PyObject *const *args); /* with entry_root, below */

/* exit_child(op, peer, component, layer): the common cases of context.new_exit_span: a
 * child exit span of the current open span (not itself an exit span) whose segment is
 * still open and under the span limit, or, with no span current at all, the first span of
 * a new segment (exit_root). None in every other case: the caller then takes the general
 * path, which decides those (and counts what it must). */
PyObject *swmp_exit_child(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "exit_child(op, peer, component, layer)");
        return NULL;
    }
    if (swmp_span_class == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *cur = swmp_get_current();
    if (cur == NULL) {
        return NULL;
    }
    if (cur == Py_None) {
        Py_DECREF(cur);
        return exit_root(args);
    }
    if (Py_TYPE(cur) != swmp_span_class) {
        Py_DECREF(cur);
        Py_RETURN_NONE;
    }
    SpanCore *parent = (SpanCore *)cur;
    int r = PyObject_IsTrue(parent->end);
    if (r == 0) {
        r = PyObject_RichCompareBool(parent->kind, exit_kind, Py_EQ);
    }
    if (r != 0) {
        Py_DECREF(cur);
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg = parent->segment;
    PyObject *token = seg_list(SEG_FIELD(seg, token, swmp_s_token), swmp_s_token);
    if (token == NULL) {
        Py_DECREF(cur);
        return NULL;
    }
    Py_ssize_t alive = PyList_GET_SIZE(token);
    Py_DECREF(token);
    if (!alive) {
        Py_DECREF(cur);
        Py_RETURN_NONE;
    }
    PyObject *n;
    if (PyObject_TypeCheck(seg, &swmp_SegmentCoreType)) {
        n = PyLong_FromSsize_t(((SegmentCore *)seg)->next_id++);
    } else {
        PyObject *ids = PyObject_GetAttr(seg, s_ids);
        n = ids == NULL ? NULL : PyIter_Next(ids);
        Py_XDECREF(ids);
    }
    static swmp_AttrCache at_span_limit;
    PyObject *limit = n == NULL ? NULL : swmp_slot_attr(limits, s_span_limit, &at_span_limit);
    r = limit == NULL ? -1 : PyObject_RichCompareBool(n, limit, Py_LT);
    Py_XDECREF(limit);
    if (r <= 0) {
        /* Over the limit (the general path counts it) or an error (none expected: raised). */
        Py_XDECREF(n);
        Py_DECREF(cur);
        if (r < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_RuntimeError, "segment span ids exhausted");
            }
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *open = seg_list(SEG_FIELD(seg, open, swmp_s_open), swmp_s_open);
    r = open == NULL ? -1 : PyList_Append(open, Py_None);
    if (r < 0) {
        Py_XDECREF(open);
        Py_DECREF(n);
        Py_DECREF(cur);
        return NULL;
    }
    PyObject *span =
        swmp_make_span(swmp_span_class, seg, n, parent->span_id, args[0], exit_kind, args[3], args[2], args[1]);
    if (span == NULL) {
        /* No span will finish and give the token back: left there, it would keep the segment
         * open (never emitted) for good. The tokens are all None: one off the end is ours. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_ssize_t k = PyList_GET_SIZE(open);
        if (k > 0 && PyList_SetSlice(open, k - 1, k, NULL) < 0) {
            PyErr_Clear();
        }
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(open);
    Py_DECREF(cur);
    return span;
}

/* new_exit_span(op, peer, component, layer, carrier=None): context.new_exit_span with its
 * common cases (exit_child's) taken here, without the Python frame every client call,
 * query and publish paid for them; with exactly four positional arguments the rest is
 * decide_exit_span's (Python: the cases exit_child declined), any other call goes to the
 * Python new_exit_span as it came (keywords, defaults, a carrier). */
static PyObject *py_new_exit_span = NULL, *py_decide_exit_span = NULL;

PyObject *swmp_setup_new_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_new_exit(new_exit_span, decide_exit_span)");
        return NULL;
    }
    Py_XSETREF(py_new_exit_span, Py_NewRef(args[0]));
    Py_XSETREF(py_decide_exit_span, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

PyObject *swmp_new_exit_span(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (py_new_exit_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_new_exit() was not called");
        return NULL;
    }
    if (nargs != 4 || kwnames != NULL) {
        return PyObject_Vectorcall(py_new_exit_span, args, (size_t)nargs, kwnames);
    }
    PyObject *span = swmp_exit_child(module, args, 4);
    if (span != Py_None) {
        return span; /* a span, or NULL with the error exit_child raised */
    }
    Py_DECREF(span);
    PyObject *call[5] = {args[0], args[1], args[2], args[3], Py_None};
    return PyObject_Vectorcall(py_decide_exit_span, call, 5, NULL);
}

PyObject *swmp_new_exit(PyObject *const *args) {
    return swmp_new_exit_span(NULL, args, 4, NULL);
}

/* entry_root(op, component, layer, carrier): the common case of context.new_entry_span, in
 * C: no span current, so a new segment whose first span is an entry span, in a new trace
 * or, with ``carrier`` (a ContextCarrier: the caller's decoded headers), in the caller's
 * with its cross-process reference; None when the ignore rules' cached decision, the
 * sampler (for a new trace), a caller's "not sampled" or a profiling board asks for more,
 * and the Python path decides, counts and fills the cache as it always has. Saves the
 * Python frames of _start_trace, the ignore check and the reference on every request. */
static PyTypeObject *segment_class = NULL;
PyObject *swmp_entry_kind = NULL, *swmp_profile_gate = NULL, *swmp_cross_process_ref = NULL;
static PyObject *policy = NULL, *rules_type = NULL, *carrier_type = NULL;

/* entry_root's and swmp_entry_sw8's common checks (each caller has made its own first),
 * in the order both made them: what a new segment's entry span needs set up, ``op`` an
 * exact str, and no span current (outside any trace). 1: the span may start here (the
 * sampling and ignore checks still to come), 0: not here (None), -1 with an error. */
static int starts_outside(PyObject *op) {
    if (segment_class == NULL || swmp_span_class == NULL || !PyUnicode_CheckExact(op)) {
        return 0;
    }
    PyObject *cur = swmp_get_current();
    if (cur == NULL) {
        return -1;
    }
    int outside = cur == Py_None;
    Py_DECREF(cur);
    return outside;
}

/* The truth of ``obj.name``: 1, 0, or -1 with an error. */
static int attr_true(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyObject *v = swmp_slot_attr(obj, name, cache);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1: the rules and settings let this segment start here with no more checks; 0: ask Python. */
static int plain_start(PyObject *op, int new_trace) {
    if (new_trace) {
        static swmp_AttrCache at_sampling;
        int on = attr_true(policy, s_sampling, &at_sampling);
        if (on != 0) {
            return on < 0 ? -1 : 0;
        }
    }
    static swmp_AttrCache at_board, at_rules, at_cache;
    PyObject *board = swmp_slot_attr(swmp_profile_gate, s_board, &at_board);
    if (board == NULL) {
        return -1;
    }
    int attached = board != Py_None;
    Py_DECREF(board);
    if (attached) {
        return 0;
    }
    PyObject *rules = swmp_slot_attr(policy, s_rules, &at_rules);
    if (rules == NULL) {
        return -1;
    }
    if ((PyObject *)Py_TYPE(rules) != rules_type) {
        Py_DECREF(rules);
        return 0;
    }
    PyObject *cache = swmp_slot_attr(rules, s_cache, &at_cache);
    Py_DECREF(rules);
    if (cache == NULL) {
        return -1;
    }
    PyObject *decision = PyDict_Check(cache) ? PyDict_GetItemWithError(cache, op) : NULL; /* borrowed */
    int plain = decision == Py_False;
    Py_DECREF(cache);
    if (decision == NULL && PyErr_Occurred()) {
        return -1;
    }
    return plain;
}


/* The caller's segment as the span's one reference, in segment.cross_process_ref's layout. */
static int add_caller_ref(SpanCore *span, PyObject *carrier) {
    PyObject *ref = swmp_caller_ref(carrier);
    PyObject *refs = ref == NULL ? NULL : PyList_New(1);
    if (refs == NULL) {
        Py_XDECREF(ref);
        return -1;
    }
    PyList_SET_ITEM(refs, 0, ref);
    Py_SETREF(span->refs, refs);
    return 0;
}

/* The caller's trace id, correlation and skip-analysis flag on a new segment. */
static int join_caller(SegmentCore *seg, PyObject *carrier) {
    static swmp_AttrCache at_correlation, at_skip;
    PyObject *corr = swmp_slot_attr(carrier, s_correlation, &at_correlation);
    if (corr == NULL) {
        return -1;
    }
    int has = PyObject_IsTrue(corr);
    if (has > 0) {
        Py_SETREF(seg->correlation, corr);
    } else {
        Py_DECREF(corr);
    }
    int skip = has < 0 ? -1 : attr_true(carrier, s_skip_analysis, &at_skip);
    if (skip > 0) {
        Py_SETREF(seg->skip_analysis, Py_NewRef(Py_True));
    }
    return skip < 0 ? -1 : 0;
}

PyObject *swmp_entry_root_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "entry_root(op, component, layer, carrier)");
        return NULL;
    }
    PyObject *carrier = args[3];
    if (carrier != Py_None && (PyObject *)Py_TYPE(carrier) != carrier_type) {
        Py_RETURN_NONE;
    }
    int outside = starts_outside(args[0]);
    if (outside <= 0) {
        return outside < 0 ? NULL : Py_NewRef(Py_None);
    }
    int r = plain_start(args[0], carrier == Py_None);
    if (r > 0 && carrier != Py_None) {
        static swmp_AttrCache at_sampled;
        r = attr_true(carrier, s_sampled, &at_sampled); /* not sampled: Python counts it */
    }
    if (r <= 0) {
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg;
    if (carrier == Py_None) {
        seg = PyObject_CallNoArgs((PyObject *)segment_class);
    } else {
        static swmp_AttrCache at_trace_id;
        PyObject *trace_id = swmp_slot_attr(carrier, s_trace_id, &at_trace_id);
        seg = trace_id == NULL ? NULL : PyObject_CallOneArg((PyObject *)segment_class, trace_id);
        Py_XDECREF(trace_id);
        if (seg != NULL && join_caller((SegmentCore *)seg, carrier) < 0) {
            Py_CLEAR(seg);
        }
    }
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        swmp_make_span(swmp_span_class, seg, Py_NewRef(swmp_zero), minus_one, args[0], swmp_entry_kind, args[2],
                       args[1], swmp_empty_op);
    if (span != NULL && carrier != Py_None && add_caller_ref((SpanCore *)span, carrier) < 0) {
        Py_CLEAR(span);
    }
    if (span != NULL) {
        Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    }
    Py_DECREF(seg);
    return span;
}

PyObject *swmp_entry_root(PyObject *const *args) {
    return swmp_entry_root_py(NULL, args, 4);
}


/* exit_child's other common case, a span in no trace yet (a client call, a query or a
 * message sent outside any request: a worker's loop, a script, a scheduled job): a new
 * segment in a new trace whose first span is this exit span, what context._start_trace
 * makes; None when the ignore rules' cached decision, the sampler or a profiling board asks
 * for more, as for entry_root. ``args``: exit_child's (op, peer, component, layer). */
static PyObject *exit_root(PyObject *const *args) {
    if (segment_class == NULL || !PyUnicode_CheckExact(args[0])) {
        Py_RETURN_NONE;
    }
    int r = plain_start(args[0], 1);
    if (r <= 0) {
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *seg = PyObject_CallNoArgs((PyObject *)segment_class);
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        swmp_make_span(swmp_span_class, seg, Py_NewRef(swmp_zero), minus_one, args[0], exit_kind, args[3], args[2],
                       args[1]);
    if (span != NULL) {
        Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    }
    Py_DECREF(seg);
    return span;
}

/* entry_root(op, component, layer, decode_carrier(value)) for a value swmp_sw8_read took,
 * without the carrier: its steps in their order and with the same objects (the segment made
 * with the caller's trace id, which its reference shares; a carrier of decode_carrier's
 * has no correlation and no skip-analysis flag, so join_caller would set nothing), and the
 * reference as caller_ref lists it. Why: the carrier's allocation, its ten slots, its empty
 * correlation dict, the four slot reads entry_root made of it and its release were ~1,000
 * instructions of every consumed message with a caller. None (nothing changed) wherever
 * entry_root would answer None or ask Python, and also before caller_ref's first call (the
 * reference's kind is not known yet) and for a carrier class other than entry_root's: the
 * caller then makes the carrier (swmp_sw8_carrier) and goes entry_root's way. */
PyObject *swmp_entry_sw8(PyObject *const *args, const SwmpSw8 *p) {
    PyObject *op = args[0];
    if (swmp_ref_kind == NULL || carrier_type != (PyObject *)swmp_carrier_class) {
        Py_RETURN_NONE;
    }
    int outside = starts_outside(op);
    if (outside <= 0) {
        return outside < 0 ? NULL : Py_NewRef(Py_None);
    }
    int r = plain_start(op, 0);
    if (r > 0 && !p->sampled) {
        r = 0; /* not sampled: Python counts it */
    }
    if (r <= 0) {
        return r < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *seg = PyObject_CallOneArg((PyObject *)segment_class, p->trace_id);
    if (seg == NULL) {
        return NULL;
    }
    PyObject *span =
        swmp_make_span(swmp_span_class, seg, Py_NewRef(swmp_zero), minus_one, op, swmp_entry_kind, args[2], args[1],
                       swmp_empty_op);
    PyObject *span_id = span == NULL ? NULL : PyLong_FromLongLong(p->span_id);
    PyObject *ref = span_id == NULL ? NULL : PyList_New(1 + CF_ADDRESS + 1);
    PyObject *refs = ref == NULL ? NULL : PyList_New(1);
    if (refs == NULL) {
        Py_XDECREF(ref);
        Py_XDECREF(span_id);
        Py_XDECREF(span);
        Py_DECREF(seg);
        return NULL;
    }
    PyObject *items[1 + CF_ADDRESS + 1] = {swmp_ref_kind,
                                           p->trace_id,
                                           p->segment_id,
                                           NULL, /* span_id, whose reference moves in */
                                           PyTuple_GET_ITEM(p->caller, 0),
                                           PyTuple_GET_ITEM(p->caller, 1),
                                           PyTuple_GET_ITEM(p->caller, 2),
                                           PyTuple_GET_ITEM(p->caller, 3)};
    for (int i = 0; i < 1 + CF_ADDRESS + 1; i++) {
        PyList_SET_ITEM(ref, i, items[i] == NULL ? span_id : Py_NewRef(items[i]));
    }
    PyList_SET_ITEM(refs, 0, ref);
    Py_SETREF(((SpanCore *)span)->refs, refs);
    Py_SETREF(((SegmentCore *)seg)->first, Py_NewRef(span)); /* start_first() */
    Py_DECREF(seg);
    return span;
}

/* setup_entry(segment_class, entry_kind, policy, rules_type, profile_gate, carrier_type,
 * cross_process_ref): what entry_root() needs (context.policy, whose rules and sampling
 * configure() replaces, and the profiling gate, whose board is attached and detached at run
 * time, are read on every call). */
PyObject *swmp_setup_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &swmp_SegmentCoreType) ||
        !PyType_Check(args[3]) || !PyType_Check(args[5]) || !PyCallable_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_entry(segment_class: type[SegmentCore], entry_kind, policy, rules_type: type, "
                        "profile_gate, carrier_type: type, cross_process_ref: callable)");
        return NULL;
    }
    Py_XSETREF(segment_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(swmp_entry_kind, Py_NewRef(args[1]));
    Py_XSETREF(policy, Py_NewRef(args[2]));
    Py_XSETREF(rules_type, Py_NewRef(args[3]));
    Py_XSETREF(swmp_profile_gate, Py_NewRef(args[4]));
    Py_XSETREF(carrier_type, Py_NewRef(args[5]));
    Py_XSETREF(swmp_cross_process_ref, Py_NewRef(args[6]));
    Py_RETURN_NONE;
}

PyObject *swmp_setup_exit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &swmp_SpanCoreType)) {
        PyErr_SetString(PyExc_TypeError, "setup_exit(span_class: type[SpanCore], exit_kind: int, limits)");
        return NULL;
    }
    Py_XSETREF(swmp_span_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(exit_kind, Py_NewRef(args[1]));
    Py_XSETREF(limits, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}
