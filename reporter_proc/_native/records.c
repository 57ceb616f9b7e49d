/* Decoded SEGMENT / LOG records (Python lists) -> SkyWalking v3 protobuf bytes.
 *
 * It must produce exactly the bytes the pure-Python encoder produces for every valid record,
 * and raise reporter_proc._wire.EncodeError (and nothing else but BaseExceptions) for every
 * record the pure-Python encoder rejects; tests/test_encode_native.py checks both over
 * generated records.
 *
 * The rules it mirrors (wire rules: reporter_proc/_wire.py):
 *   - a string slot: a str is written unless empty; any other falsy value is left out; a truthy
 *     non-str is an error. Where the Python encoder uses the value as a cache key it hashes it
 *     even when falsy, so a falsy unhashable value is an error there (the `hashed` flag);
 *   - an int slot: the same with ints (bools are ints), range-checked to int32 / int64,
 *     negatives as 10-byte two's complement;
 *   - a bool slot: True is written, False and None are left out, anything else is an error;
 *   - a record, span, ref or span log is unpacked like Python unpacks it (any iterable of the
 *     exact length), tags and log data must be a list or tuple of even length.
 */
#include "wire.h"

/* ------------------------------------------------------------------------------ plain values
 * The walk below reads list items through borrowed pointers. That is safe only while no Python
 * code runs: code run by a value's __bool__, __len__, __hash__ or __iter__ could change or free
 * the lists being read. Decoded JSON holds only the exact built-in types below, whose truth,
 * length, hash and items never run Python code; any other value makes the walk raise
 * swmp_Exotic before touching it, and the record is encoded in Python (module.c). */
static inline int plain(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    return o == Py_None || t == &PyUnicode_Type || t == &PyLong_Type || t == &PyBool_Type ||
           t == &PyList_Type || t == &PyTuple_Type || t == &PyFloat_Type || t == &PyBytes_Type ||
           t == &PyDict_Type;
}

/* 0, or -1 with swmp_Exotic set. */
static inline int require_plain(PyObject *o) {
    if (plain(o)) {
        return 0;
    }
    PyErr_SetNone(swmp_Exotic);
    return -1;
}

/* PyObject_IsTrue of a plain value (1 / 0), or -1 with an error set. */
static inline int truth_of(PyObject *o) {
    return require_plain(o) < 0 ? -1 : PyObject_IsTrue(o);
}

/* ------------------------------------------------------------------------------ slots */
/* A falsy value in a slot is left out; a truthy one of the wrong type is an error. Returns
 * 0 (left out) or -1 (error set). `hashed`: the Python encoder hashes this value. */
static int falsy_or_error(PyObject *o, int hashed, const char *expected) {
    if (o == Py_None) {
        return 0;
    }
    int truth = truth_of(o);
    if (truth < 0) {
        return -1;
    }
    if (truth) {
        PyErr_Format(EncodeError, "not %s: %R", expected, o);
        return -1;
    }
    if (hashed && PyObject_Hash(o) == -1) {
        return -1;
    }
    return 0;
}

/* 1: write (*s, *n); 0: left out; -1: error. */
static inline int get_str(PyObject *o, int hashed, const char **s, Py_ssize_t *n) {
    if (PyUnicode_Check(o)) {
        if (PyUnicode_GET_LENGTH(o) == 0) {
            return 0;
        }
        *s = PyUnicode_AsUTF8AndSize(o, n);
        return *s == NULL ? -1 : 1;
    }
    return falsy_or_error(o, hashed, "a string");
}

static inline int put_str_slot(Buf *b, unsigned char tag, PyObject *o, int hashed) {
    const char *s = NULL;
    Py_ssize_t n = 0;
    int r = get_str(o, hashed, &s, &n);
    if (r <= 0) {
        return r;
    }
    return put_field_bytes(b, tag, s, n);
}

/* 1: write *v; 0: left out (zero or falsy); -1: error. */
static inline int get_int(PyObject *o, int hashed, int wide, int64_t *v) {
    if (PyLong_Check(o)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || (!wide && (x < INT32_MIN || x > INT32_MAX))) {
            PyErr_Format(EncodeError, "not an %s: %R", wide ? "int64" : "int32", o);
            return -1;
        }
        if (x == 0) {
            return 0;
        }
        *v = (int64_t)x;
        return 1;
    }
    return falsy_or_error(o, hashed, wide ? "an int64" : "an int32");
}

static inline int put_int_slot(Buf *b, unsigned char tag, PyObject *o, int hashed, int wide) {
    int64_t v = 0;
    int r = get_int(o, hashed, wide, &v);
    if (r <= 0) {
        return r;
    }
    return put_tag_varint(b, tag, (uint64_t)v);
}

static inline int put_bool_slot(Buf *b, unsigned char tag, PyObject *o) {
    if (o == Py_True) {
        return put_tag_varint(b, tag, 1);
    }
    if (o == Py_False || o == Py_None) {
        return 0;
    }
    PyErr_Format(EncodeError, "not a bool: %R", o);
    return -1;
}

/* Unpack like `a, b, c = obj`: a new reference to a list/tuple of exactly n items. */
static PyObject *unpack(PyObject *o, Py_ssize_t n, const char *what) {
    PyObject *seq = require_plain(o) < 0 ? NULL : PySequence_Fast(o, what);
    if (seq == NULL) {
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        PyErr_Format(EncodeError, "%s: expected %zd values, got %zd", what, n,
                     PySequence_Fast_GET_SIZE(seq));
        Py_DECREF(seq);
        return NULL;
    }
    return seq;
}

/* `if x: for item in x` : a new reference to the items, or Py_None (borrowed-safe: incref'd)
 * when x is falsy. */
static PyObject *iter_items(PyObject *o, const char *what) {
    int truth = truth_of(o);
    if (truth < 0) {
        return NULL;
    }
    if (!truth) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    return PySequence_Fast(o, what);
}

/* A flat [k, v, k, v] list as repeated KeyStringValuePair under `tag` (encode._kv_pairs). */
static int put_kv_pairs(Buf *b, unsigned char tag, PyObject *flat) {
    if (!PyList_Check(flat) && !PyTuple_Check(flat)) {
        PyErr_Format(EncodeError, "not a flat key/value list: %R", flat);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(flat);
    if (n & 1) {
        PyErr_Format(EncodeError, "not a flat key/value list: %R", flat);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(flat);
    for (Py_ssize_t i = 0; i < n; i += 2) {
        PyObject *k = items[i], *v = items[i + 1];
        const char *vs = NULL;
        Py_ssize_t vn = 0;
        int short_value;
        if (PyUnicode_Check(v)) {
            short_value = PyUnicode_GET_LENGTH(v) <= SHORT_VALUE;
            if (PyUnicode_GET_LENGTH(v) > 0) {
                vs = PyUnicode_AsUTF8AndSize(v, &vn);
                if (vs == NULL) {
                    return -1;
                }
            }
        } else {
            /* The Python encoder takes len(v), then caches (k, v) and leaves an empty v out:
             * only an empty, hashable non-str passes there. */
            Py_ssize_t size = require_plain(v) < 0 ? -1 : PyObject_Size(v);
            if (size < 0) {
                return -1;
            }
            if (size > 0 || PyObject_Hash(v) == -1) {
                if (!PyErr_Occurred()) {
                    PyErr_Format(EncodeError, "not a string: %R", v);
                }
                return -1;
            }
            short_value = 1;
        }
        Py_ssize_t start;
        if (msg_begin(b, tag, &start) < 0 || put_str_slot(b, 0x0a, k, short_value) < 0) {
            return -1;
        }
        if (vs != NULL && put_field_bytes(b, 0x12, vs, vn) < 0) {
            return -1;
        }
        if (msg_end(b, start) < 0) {
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------ segments */
static int put_ref(Buf *b, PyObject *ref) {
    PyObject *seq = unpack(ref, 8, "segment reference");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    Py_ssize_t start;
    int ok = msg_begin(b, 0x2a, &start) == 0          /* SpanObject.refs = 5 */
             && put_int_slot(b, 0x08, f[0], 0, 0) >= 0   /* refType */
             && put_str_slot(b, 0x12, f[1], 0) >= 0      /* traceId */
             && put_str_slot(b, 0x1a, f[2], 0) >= 0      /* parentTraceSegmentId */
             && put_int_slot(b, 0x20, f[3], 0, 0) >= 0   /* parentSpanId */
             && put_str_slot(b, 0x2a, f[4], 1) >= 0      /* parentService */
             && put_str_slot(b, 0x32, f[5], 1) >= 0      /* parentServiceInstance */
             && put_str_slot(b, 0x3a, f[6], 1) >= 0      /* parentEndpoint */
             && put_str_slot(b, 0x42, f[7], 1) >= 0      /* networkAddressUsedAtPeer */
             && msg_end(b, start) == 0;
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

static int put_span_log(Buf *b, PyObject *entry) {
    PyObject *seq = unpack(entry, 2, "span log");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    Py_ssize_t start;
    int ok = msg_begin(b, 0x6a, &start) == 0 /* SpanObject.logs = 13 */
             && put_int_slot(b, 0x08, f[0], 0, 1) >= 0;
    if (ok) {
        int truth = truth_of(f[1]);
        ok = truth >= 0 && (!truth || put_kv_pairs(b, 0x12, f[1]) == 0) && msg_end(b, start) == 0;
    }
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

/* `if items: for item in items: put(item)` */
static int put_each(Buf *b, PyObject *items, const char *what, int (*put)(Buf *, PyObject *)) {
    PyObject *seq = iter_items(items, what);
    if (seq == NULL) {
        return -1;
    }
    int ok = 1;
    if (seq != Py_None) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        PyObject **it = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; ok && i < n; i++) {
            ok = put(b, it[i]) == 0;
        }
    }
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

static int put_span(Buf *b, PyObject *span) {
    PyObject *seq = unpack(span, 14, "span");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    Py_ssize_t start;
    int ok = msg_begin(b, 0x1a, &start) == 0          /* SegmentObject.spans = 3 */
             && put_int_slot(b, 0x08, f[0], 1, 0) >= 0   /* spanId */
             && put_int_slot(b, 0x10, f[1], 1, 0) >= 0   /* parentSpanId */
             && put_int_slot(b, 0x18, f[2], 0, 1) >= 0   /* startTime */
             && put_int_slot(b, 0x20, f[3], 0, 1) >= 0   /* endTime */
             && put_each(b, f[13], "span refs", put_ref) == 0
             && put_str_slot(b, 0x32, f[4], 1) >= 0      /* operationName */
             && put_str_slot(b, 0x3a, f[5], 1) >= 0      /* peer */
             && put_int_slot(b, 0x40, f[6], 1, 0) >= 0   /* spanType */
             && put_int_slot(b, 0x48, f[7], 1, 0) >= 0   /* spanLayer */
             && put_int_slot(b, 0x50, f[8], 1, 0) >= 0   /* componentId */
             && put_bool_slot(b, 0x58, f[9]) >= 0;       /* isError */
    if (ok) {                                            /* tags = 12 */
        int truth = truth_of(f[11]);
        ok = truth >= 0 && (!truth || put_kv_pairs(b, 0x62, f[11]) == 0);
    }
    ok = ok && put_each(b, f[12], "span logs", put_span_log) == 0
         && put_bool_slot(b, 0x70, f[10]) >= 0           /* skipAnalysis */
         && msg_end(b, start) == 0;
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

int swmp_put_segment(Buf *b, PyObject *rec) {
    PyObject *seq = unpack(rec, 6, "SEGMENT record");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    int ok = put_str_slot(b, 0x0a, f[0], 0) >= 0 /* traceId */
             && put_str_slot(b, 0x12, f[1], 0) >= 0; /* traceSegmentId */
    if (ok) {
        /* `for span in spans` */
        PyObject *spans = require_plain(f[5]) < 0 ? NULL : PySequence_Fast(f[5], "spans is not iterable");
        ok = spans != NULL;
        if (ok) {
            Py_ssize_t n = PySequence_Fast_GET_SIZE(spans);
            PyObject **it = PySequence_Fast_ITEMS(spans);
            for (Py_ssize_t i = 0; ok && i < n; i++) {
                ok = put_span(b, it[i]) == 0;
            }
            Py_DECREF(spans);
        }
    }
    ok = ok && put_str_slot(b, 0x22, f[2], 0) >= 0 /* service */
         && put_str_slot(b, 0x2a, f[3], 0) >= 0     /* serviceInstance */
         && put_bool_slot(b, 0x30, f[4]) >= 0;      /* isSizeLimited */
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------------ logs */
int swmp_put_log(Buf *b, PyObject *rec) {
    PyObject *seq = unpack(rec, 11, "LOG record");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    PyObject *kind = f[4], *trace_id = f[6], *segment_id = f[7], *span_id = f[8];
    int ok = put_int_slot(b, 0x08, f[0], 0, 1) >= 0 /* timestamp */
             && put_str_slot(b, 0x12, f[1], 0) >= 0  /* service */
             && put_str_slot(b, 0x1a, f[2], 0) >= 0  /* serviceInstance */
             && put_str_slot(b, 0x22, f[3], 0) >= 0; /* endpoint */
    if (ok) { /* body = 5: LogDataBody{type = 1, text = 2 | json = 3 | yaml = 4 {text = 1}} */
        static const char *const kinds[3] = {"text", "json", "yaml"};
        int k = -1;
        if (PyUnicode_Check(kind)) {
            for (int i = 0; i < 3; i++) {
                if (PyUnicode_CompareWithASCIIString(kind, kinds[i]) == 0) {
                    k = i;
                    break;
                }
            }
        }
        if (k < 0) {
            PyErr_Format(EncodeError, "unknown log body kind %R", kind);
            ok = 0;
        } else {
            Py_ssize_t outer, inner;
            ok = msg_begin(b, 0x2a, &outer) == 0 && put_field_bytes(b, 0x0a, kinds[k], 4) == 0
                 && msg_begin(b, (unsigned char)(0x12 + 8 * k), &inner) == 0
                 && put_str_slot(b, 0x0a, f[5], 0) >= 0 && msg_end(b, inner) == 0
                 && msg_end(b, outer) == 0;
        }
    }
    int context = 0;
    if (ok) { /* `if trace_id or segment_id` */
        context = truth_of(trace_id);
        if (context == 0) {
            context = truth_of(segment_id);
        }
        ok = context >= 0;
    }
    if (ok && context) { /* traceContext = 6 */
        Py_ssize_t start;
        ok = msg_begin(b, 0x32, &start) == 0 && put_str_slot(b, 0x0a, trace_id, 0) >= 0
             && put_str_slot(b, 0x12, segment_id, 0) >= 0;
        if (ok) { /* `if span_id > 0: spanId = _int32(span_id)`; a positive non-int is an error */
            int positive;
            if (PyLong_Check(span_id)) {
                int overflow = 0;
                long long x = PyLong_AsLongLongAndOverflow(span_id, &overflow);
                positive = (x == -1 && PyErr_Occurred()) ? -1 : (overflow > 0 || x > 0);
            } else {
                PyObject *zero = require_plain(span_id) < 0 ? NULL : PyLong_FromLong(0);
                positive = zero == NULL ? -1 : PyObject_RichCompareBool(span_id, zero, Py_GT);
                Py_XDECREF(zero);
                if (positive > 0) {
                    PyErr_Format(EncodeError, "not an int32: %R", span_id);
                    positive = -1;
                }
            }
            ok = positive >= 0 && (!positive || put_int_slot(b, 0x18, span_id, 0, 0) == 0);
        }
        ok = ok && msg_end(b, start) == 0;
    } else if (ok && !PyLong_CheckExact(span_id)) {
        PyErr_Format(EncodeError, "span id is not an int: %R", span_id);
        ok = 0;
    }
    if (ok) { /* tags = 7: LogTags{data = 1} */
        int truth = truth_of(f[9]);
        Py_ssize_t start;
        ok = truth >= 0
             && (!truth || (msg_begin(b, 0x3a, &start) == 0 && put_kv_pairs(b, 0x0a, f[9]) == 0
                            && msg_end(b, start) == 0));
    }
    ok = ok && put_str_slot(b, 0x42, f[10], 0) >= 0; /* layer */
    Py_DECREF(seq);
    return ok ? 0 : -1;
}
