/* reporter_proc._encode_native: decoded SEGMENT / LOG records -> SkyWalking v3 protobuf bytes.
 *
 * The optional accelerator of reporter_proc/encode.py. It must produce exactly the bytes the
 * pure-Python encoder produces for every valid record, and raise
 * reporter_proc._wire.EncodeError (and nothing else but BaseExceptions) for every record the
 * pure-Python encoder rejects; tests/test_encode_native.py checks both over generated records.
 *
 * The rules it mirrors (see encode.py's docstring for the wire rules):
 *   - a string slot: a str is written unless empty; any other falsy value is left out; a truthy
 *     non-str is an error. Where the Python encoder uses the value as a cache key it hashes it
 *     even when falsy, so a falsy unhashable value is an error there (the `hashed` flag);
 *   - an int slot: the same with ints (bools are ints), range-checked to int32 / int64,
 *     negatives as 10-byte two's complement;
 *   - a bool slot: True is written, False and None are left out, anything else is an error;
 *   - a record, span, ref or span log is unpacked like Python unpacks it (any iterable of the
 *     exact length), tags and log data must be a list or tuple of even length.
 *
 * Output is built in one growable buffer (on the stack while it fits); a nested message
 * reserves two bytes for its length and moves its body only when the length needs more.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *EncodeError; /* reporter_proc._wire.EncodeError, looked up at import */

#define SHORT_VALUE 24 /* encode.SHORT_VALUE: the Python encoder caches (key, value) below this */
#define STACK_BYTES 4096
#define LEN_RESERVE 2 /* bytes reserved for a nested message's length (bodies < 16 KiB) */

/* ------------------------------------------------------------------------------ buffer */
typedef struct {
    char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
    char stack[STACK_BYTES];
} Buf;

static void buf_init(Buf *b) {
    b->p = b->stack;
    b->len = 0;
    b->cap = STACK_BYTES;
}

static void buf_free(Buf *b) {
    if (b->p != b->stack) {
        PyMem_Free(b->p);
    }
}

static int buf_grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap;
    while (cap - b->len < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *np;
    if (b->p == b->stack) {
        np = PyMem_Malloc((size_t)cap);
        if (np != NULL) {
            memcpy(np, b->p, (size_t)b->len);
        }
    } else {
        np = PyMem_Realloc(b->p, (size_t)cap);
    }
    if (np == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline int buf_reserve(Buf *b, Py_ssize_t n) {
    return (b->cap - b->len >= n) ? 0 : buf_grow(b, n);
}

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Caller has reserved 10 bytes. */
static inline void put_varint_raw(Buf *b, uint64_t v) {
    char *p = b->p + b->len;
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    b->len = p - b->p;
}

/* tag + varint */
static inline int put_tag_varint(Buf *b, unsigned char tag, uint64_t v) {
    if (buf_reserve(b, 11) < 0) {
        return -1;
    }
    b->p[b->len++] = (char)tag;
    put_varint_raw(b, v);
    return 0;
}

/* tag + length + bytes */
static inline int put_field_bytes(Buf *b, unsigned char tag, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, 11 + n) < 0) {
        return -1;
    }
    b->p[b->len++] = (char)tag;
    put_varint_raw(b, (uint64_t)n);
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static inline int msg_begin(Buf *b, unsigned char tag, Py_ssize_t *start) {
    if (buf_reserve(b, 1 + LEN_RESERVE) < 0) {
        return -1;
    }
    b->p[b->len++] = (char)tag;
    *start = b->len;
    b->len += LEN_RESERVE;
    return 0;
}

static int msg_end(Buf *b, Py_ssize_t start) {
    Py_ssize_t body = b->len - start - LEN_RESERVE;
    int vlen = varint_len((uint64_t)body);
    if (vlen > LEN_RESERVE && buf_reserve(b, vlen - LEN_RESERVE) < 0) {
        return -1;
    }
    if (vlen != LEN_RESERVE) {
        memmove(b->p + start + vlen, b->p + start + LEN_RESERVE, (size_t)body);
    }
    char *p = b->p + start;
    uint64_t v = (uint64_t)body;
    while (v >= 0x80) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p = (char)v;
    b->len = start + vlen + body;
    return 0;
}

/* ------------------------------------------------------------------------------ slots */
/* A falsy value in a slot is left out; a truthy one of the wrong type is an error. Returns
 * 0 (left out) or -1 (error set). `hashed`: the Python encoder hashes this value. */
static int falsy_or_error(PyObject *o, int hashed, const char *expected) {
    if (o == Py_None) {
        return 0;
    }
    int truth = PyObject_IsTrue(o);
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
    PyObject *seq = PySequence_Fast(o, what);
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
    int truth = PyObject_IsTrue(o);
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
            Py_ssize_t size = PyObject_Size(v);
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
        int truth = PyObject_IsTrue(f[1]);
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
        int truth = PyObject_IsTrue(f[11]);
        ok = truth >= 0 && (!truth || put_kv_pairs(b, 0x62, f[11]) == 0);
    }
    ok = ok && put_each(b, f[12], "span logs", put_span_log) == 0
         && put_bool_slot(b, 0x70, f[10]) >= 0           /* skipAnalysis */
         && msg_end(b, start) == 0;
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

static int put_segment(Buf *b, PyObject *rec) {
    PyObject *seq = unpack(rec, 6, "SEGMENT record");
    if (seq == NULL) {
        return -1;
    }
    PyObject **f = PySequence_Fast_ITEMS(seq);
    int ok = put_str_slot(b, 0x0a, f[0], 0) >= 0 /* traceId */
             && put_str_slot(b, 0x12, f[1], 0) >= 0; /* traceSegmentId */
    if (ok) {
        PyObject *spans = PySequence_Fast(f[5], "spans is not iterable"); /* `for span in spans` */
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
static int put_log(Buf *b, PyObject *rec) {
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
        context = PyObject_IsTrue(trace_id);
        if (context == 0) {
            context = PyObject_IsTrue(segment_id);
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
                PyObject *zero = PyLong_FromLong(0);
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
        int truth = PyObject_IsTrue(f[9]);
        Py_ssize_t start;
        ok = truth >= 0
             && (!truth || (msg_begin(b, 0x3a, &start) == 0 && put_kv_pairs(b, 0x0a, f[9]) == 0
                            && msg_end(b, start) == 0));
    }
    ok = ok && put_str_slot(b, 0x42, f[10], 0) >= 0; /* layer */
    Py_DECREF(seq);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------------------------ from JSON */
/* SEGMENT records straight from the JSON the worker wrote, without building Python objects.
 *
 * A fast path, not a second decoder: it accepts only the plain shapes the workers write
 * (strings or null in string slots, integers or null in int slots, true/false/null in bool
 * slots, arrays of the exact layout, strict JSON and strict UTF-8) and answers "not mine"
 * (BAIL) for anything else, for which the caller decodes with orjson and encodes the decoded
 * record, the exact path. So where this returns bytes, they are the bytes of
 * segment(orjson.loads(payload)); tests/test_encode_native.py checks it. */
#define BAIL 1 /* return codes of the json_* functions: 0 done, BAIL, -1 Python error set */
#define TRY(x)            \
    do {                  \
        int r_ = (x);     \
        if (r_ != 0) {    \
            return r_;    \
        }                 \
    } while (0)
#define MAX_DEPTH 32

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cur;

static inline void ws(Cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) {
        c->p++;
    }
}

static inline int peek(Cur *c) {
    ws(c);
    return c->p < c->end ? *c->p : -1;
}

static inline int literal(Cur *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p >= n && memcmp(c->p, word, (size_t)n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

/* Past the closing quote of the string at c->p (an opening quote). */
static int skip_string(Cur *c) {
    const unsigned char *p = c->p + 1;
    while (p < c->end && *p != '"') {
        p += (*p == '\\') ? 2 : 1;
    }
    if (p >= c->end) {
        return BAIL;
    }
    c->p = p + 1;
    return 0;
}

static int skip_value(Cur *c, int depth) {
    int ch = peek(c);
    if (ch == '"') {
        return skip_string(c);
    }
    if (ch == '[') {
        if (depth >= MAX_DEPTH) {
            return BAIL;
        }
        c->p++;
        if (peek(c) == ']') {
            c->p++;
            return 0;
        }
        for (;;) {
            TRY(skip_value(c, depth + 1));
            ch = peek(c);
            c->p++;
            if (ch == ']') {
                return 0;
            }
            if (ch != ',') {
                return BAIL;
            }
        }
    }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        while (c->p < c->end && (strchr("0123456789+-.eE", *c->p) != NULL) && *c->p) {
            c->p++;
        }
        return 0;
    }
    if (literal(c, "true", 4) || literal(c, "false", 5) || literal(c, "null", 4)) {
        return 0;
    }
    return BAIL; /* objects and anything else: the exact path decides */
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') {
            v |= (unsigned)(h - '0');
        } else if (h >= 'a' && h <= 'f') {
            v |= (unsigned)(h - 'a' + 10);
        } else if (h >= 'A' && h <= 'F') {
            v |= (unsigned)(h - 'A' + 10);
        } else {
            return BAIL;
        }
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (strict: no overlongs, surrogates, > U+10FFFF),
 * or 0. */
static inline int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c0 = p[0];
    Py_ssize_t left = end - p;
#define CONT(i) (left > (i) && (p[i] & 0xC0) == 0x80)
    if (c0 >= 0xC2 && c0 <= 0xDF) {
        return CONT(1) ? 2 : 0;
    }
    if (c0 >= 0xE0 && c0 <= 0xEF) {
        if (!CONT(1) || !CONT(2) || (c0 == 0xE0 && p[1] < 0xA0) || (c0 == 0xED && p[1] > 0x9F)) {
            return 0;
        }
        return 3;
    }
    if (c0 >= 0xF0 && c0 <= 0xF4) {
        if (!CONT(1) || !CONT(2) || !CONT(3) || (c0 == 0xF0 && p[1] < 0x90)
            || (c0 == 0xF4 && p[1] > 0x8F)) {
            return 0;
        }
        return 4;
    }
#undef CONT
    return 0;
}

/* True when [p, p + n) is printable ASCII only: no escapes to decode, nothing to validate. */
static inline int plain_ascii(const unsigned char *p, Py_ssize_t n) {
    const uint64_t high = 0x8080808080808080ULL, space = 0x2020202020202020ULL;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        /* a high bit, or a byte below 0x20 (its borrow sets a high bit; a false alarm only
         * sends the string to the careful path) */
        if ((w | (w - space)) & high) {
            return 0;
        }
    }
    for (; i < n; i++) {
        if (p[i] < 0x20 || p[i] >= 0x80) {
            return 0;
        }
    }
    return 1;
}

/* A string slot: a JSON string is written under `tag` unless empty; null is left out; any
 * other value is BAIL. `required`: null is BAIL too (a tag value). */
static int json_str_slot(Buf *b, unsigned char tag, Cur *c, int required) {
    int ch = peek(c);
    if (ch == 'n' && !required && literal(c, "null", 4)) {
        return 0;
    }
    if (ch != '"') {
        return BAIL;
    }
    const unsigned char *p = c->p + 1;
    const unsigned char *close = memchr(p, '"', (size_t)(c->end - p));
    if (close == NULL) {
        return BAIL;
    }
    int escaped = memchr(p, '\\', (size_t)(close - p)) != NULL;
    if (escaped) { /* that quote may be escaped: find the real end */
        TRY(skip_string(c));
        close = c->p - 1;
    } else {
        c->p = close + 1;
    }
    if (close == p) {
        return 0; /* empty: left out */
    }
    if (!escaped && plain_ascii(p, close - p)) {
        return put_field_bytes(b, tag, (const char *)p, close - p) < 0 ? -1 : 0;
    }
    Py_ssize_t start;
    /* The decoded text is never longer than its JSON form. */
    if (buf_reserve(b, 1 + LEN_RESERVE + (close - p)) < 0 || msg_begin(b, tag, &start) < 0) {
        return -1;
    }
    unsigned char *out = (unsigned char *)b->p + b->len;
    while (p < close) {
        unsigned char ch0 = *p;
        if (ch0 >= 0x20 && ch0 < 0x80 && ch0 != '\\') {
            *out++ = ch0;
            p++;
        } else if (ch0 >= 0x80) {
            int n = utf8_len(p, close);
            if (n == 0) {
                return BAIL;
            }
            memcpy(out, p, (size_t)n);
            out += n;
            p += n;
        } else if (ch0 == '\\') {
            unsigned char e = p[1]; /* skip_string guarantees p + 1 < close */
            p += 2;
            switch (e) {
            case '"': *out++ = '"'; break;
            case '\\': *out++ = '\\'; break;
            case '/': *out++ = '/'; break;
            case 'b': *out++ = '\b'; break;
            case 'f': *out++ = '\f'; break;
            case 'n': *out++ = '\n'; break;
            case 'r': *out++ = '\r'; break;
            case 't': *out++ = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (close - p < 4 || hex4(p, &cp) != 0) {
                    return BAIL;
                }
                p += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) { /* a pair, or not ours */
                    if (close - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) != 0
                        || lo < 0xDC00 || lo > 0xDFFF) {
                        return BAIL;
                    }
                    p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return BAIL;
                }
                if (cp < 0x80) {
                    *out++ = (unsigned char)cp;
                } else if (cp < 0x800) {
                    *out++ = (unsigned char)(0xC0 | cp >> 6);
                    *out++ = (unsigned char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    *out++ = (unsigned char)(0xE0 | cp >> 12);
                    *out++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
                    *out++ = (unsigned char)(0x80 | (cp & 0x3F));
                } else {
                    *out++ = (unsigned char)(0xF0 | cp >> 18);
                    *out++ = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
                    *out++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
                    *out++ = (unsigned char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                return BAIL;
            }
        } else {
            return BAIL; /* a raw control character: not JSON */
        }
    }
    b->len = (char *)out - b->p;
    return msg_end(b, start) < 0 ? -1 : 0;
}

/* An int slot: a JSON integer in range is written under `tag` unless 0; null is left out. */
static int json_int_slot(Buf *b, unsigned char tag, Cur *c, int wide) {
    int ch = peek(c);
    if (ch == 'n' && literal(c, "null", 4)) {
        return 0;
    }
    int negative = ch == '-';
    if (negative) {
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        return BAIL;
    }
    uint64_t v = 0;
    if (*c->p == '0') {
        c->p++;
    } else {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (UINT64_MAX - 9) / 10) {
                return BAIL;
            }
            v = v * 10 + (uint64_t)(*c->p++ - '0');
        }
    }
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E' || (*c->p >= '0' && *c->p <= '9'))) {
        return BAIL; /* a float (or a leading zero): not ours */
    }
    uint64_t limit = wide ? (uint64_t)INT64_MAX : (uint64_t)INT32_MAX;
    if (v > limit + (negative ? 1u : 0u)) {
        return BAIL; /* out of range: the exact path raises */
    }
    if (v == 0) {
        return 0;
    }
    return put_tag_varint(b, tag, negative ? (uint64_t)0 - v : v) < 0 ? -1 : 0;
}

static int json_bool_slot(Buf *b, unsigned char tag, Cur *c) {
    peek(c);
    if (literal(c, "true", 4)) {
        return put_tag_varint(b, tag, 1) < 0 ? -1 : 0;
    }
    return (literal(c, "false", 5) || literal(c, "null", 4)) ? 0 : BAIL;
}

/* `null` or `[]`: nothing to write (returns 1); an array with items: 0, c past its '['. */
static int json_open_array(Cur *c, int *empty) {
    int ch = peek(c);
    if (ch == 'n' && literal(c, "null", 4)) {
        *empty = 1;
        return 0;
    }
    if (ch != '[') {
        return BAIL;
    }
    c->p++;
    *empty = peek(c) == ']';
    if (*empty) {
        c->p++;
    }
    return 0;
}

/* After an item of an array: 1 when the array ended, 0 when another item follows. */
static int json_next(Cur *c, int *done) {
    int ch = peek(c);
    c->p++;
    if (ch == ']') {
        *done = 1;
        return 0;
    }
    *done = 0;
    return ch == ',' ? 0 : BAIL;
}

/* A flat [k, v, ...] array (or null) as repeated KeyStringValuePair under `tag`. */
static int json_kv_pairs(Buf *b, unsigned char tag, Cur *c) {
    int empty, done = 0;
    TRY(json_open_array(c, &empty));
    if (empty) {
        return 0;
    }
    while (!done) {
        Py_ssize_t start;
        if (msg_begin(b, tag, &start) < 0) {
            return -1;
        }
        TRY(json_str_slot(b, 0x0a, c, 0));
        if (peek(c) != ',') {
            return BAIL; /* odd length */
        }
        c->p++;
        TRY(json_str_slot(b, 0x12, c, 1));
        if (msg_end(b, start) < 0) {
            return -1;
        }
        TRY(json_next(c, &done));
    }
    return 0;
}

static inline int expect(Cur *c, int ch) {
    if (peek(c) != ch) {
        return BAIL;
    }
    c->p++;
    return 0;
}

/* Where the next item starts (after its comma), skipped: written later, out of JSON order. */
static inline int later(Cur *c, const unsigned char **start) {
    TRY(expect(c, ','));
    ws(c);
    *start = c->p;
    return skip_value(c, 1);
}

static int json_ref(Buf *b, Cur *c) {
    Py_ssize_t start;
    TRY(expect(c, '['));
    if (msg_begin(b, 0x2a, &start) < 0) { /* SpanObject.refs = 5; fields in JSON order */
        return -1;
    }
    TRY(json_int_slot(b, 0x08, c, 0)); /* refType */
    for (int i = 1; i < 8; i++) {
        TRY(expect(c, ','));
        if (i == 3) {
            TRY(json_int_slot(b, 0x20, c, 0)); /* parentSpanId */
        } else {
            TRY(json_str_slot(b, (unsigned char)(0x02 + 8 * (i + 1)), c, 0));
        }
    }
    TRY(expect(c, ']'));
    return msg_end(b, start) < 0 ? -1 : 0;
}

static int json_span_log(Buf *b, Cur *c) {
    Py_ssize_t start;
    TRY(expect(c, '['));
    if (msg_begin(b, 0x6a, &start) < 0) { /* SpanObject.logs = 13 */
        return -1;
    }
    TRY(json_int_slot(b, 0x08, c, 1));
    TRY(expect(c, ','));
    TRY(json_kv_pairs(b, 0x12, c));
    TRY(expect(c, ']'));
    return msg_end(b, start) < 0 ? -1 : 0;
}

/* `null`, `[]` or an array of items, each written by `put`. */
static int json_each(Buf *b, Cur *c, int (*put)(Buf *, Cur *)) {
    int empty, done = 0;
    TRY(json_open_array(c, &empty));
    while (!empty && !done) {
        TRY(put(b, c));
        TRY(json_next(c, &done));
    }
    return 0;
}

/* Move the bytes [mid, end) of the buffer in front of [from, mid). */
static int rotate(Buf *b, Py_ssize_t from, Py_ssize_t mid) {
    Py_ssize_t tail = b->len - mid;
    char small[512];
    char *tmp = tail <= (Py_ssize_t)sizeof(small) ? small : PyMem_Malloc((size_t)tail);
    if (tmp == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(tmp, b->p + mid, (size_t)tail);
    memmove(b->p + from + tail, b->p + from, (size_t)(mid - from));
    memcpy(b->p + from, tmp, (size_t)tail);
    if (tmp != small) {
        PyMem_Free(tmp);
    }
    return 0;
}

/* One pass over the span's JSON. Protobuf order differs from the record's in two places:
 * refs (last in the record) go right after the times, skipAnalysis (11th) goes last. */
static int json_span(Buf *b, Cur *c) {
    Py_ssize_t start, after_times, refs;
    const unsigned char *skip_analysis;
    TRY(expect(c, '['));
    if (msg_begin(b, 0x1a, &start) < 0) { /* SegmentObject.spans = 3 */
        return -1;
    }
    TRY(json_int_slot(b, 0x08, c, 0)); /* spanId */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x10, c, 0)); /* parentSpanId */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x18, c, 1)); /* startTime */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x20, c, 1)); /* endTime */
    after_times = b->len;
    TRY(expect(c, ','));
    TRY(json_str_slot(b, 0x32, c, 0)); /* operationName */
    TRY(expect(c, ','));
    TRY(json_str_slot(b, 0x3a, c, 0)); /* peer */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x40, c, 0)); /* spanType */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x48, c, 0)); /* spanLayer */
    TRY(expect(c, ','));
    TRY(json_int_slot(b, 0x50, c, 0)); /* componentId */
    TRY(expect(c, ','));
    TRY(json_bool_slot(b, 0x58, c)); /* isError */
    TRY(later(c, &skip_analysis));
    TRY(expect(c, ','));
    TRY(json_kv_pairs(b, 0x62, c)); /* tags */
    TRY(expect(c, ','));
    TRY(json_each(b, c, json_span_log)); /* logs */
    TRY(expect(c, ','));
    refs = b->len;
    TRY(json_each(b, c, json_ref)); /* refs */
    TRY(expect(c, ']'));
    if (b->len > refs && rotate(b, after_times, refs) < 0) {
        return -1;
    }
    Cur e = {skip_analysis, c->end};
    TRY(json_bool_slot(b, 0x70, &e)); /* skipAnalysis */
    return msg_end(b, start) < 0 ? -1 : 0;
}

static int json_segment(Buf *b, const unsigned char *p, Py_ssize_t n) {
    Cur c = {p, p + n};
    const unsigned char *service, *instance, *limited;
    TRY(expect(&c, '['));
    TRY(json_str_slot(b, 0x0a, &c, 0)); /* traceId */
    TRY(expect(&c, ','));
    TRY(json_str_slot(b, 0x12, &c, 0)); /* traceSegmentId */
    TRY(later(&c, &service));
    TRY(later(&c, &instance));
    TRY(later(&c, &limited));
    TRY(expect(&c, ','));
    if (peek(&c) != '[') {
        return BAIL; /* `for span in <not a list>`: the exact path says what happens */
    }
    TRY(json_each(b, &c, json_span)); /* spans */
    TRY(expect(&c, ']'));
    if (peek(&c) != -1) {
        return BAIL; /* trailing bytes: not JSON */
    }
    Cur e = {service, c.end};
    TRY(json_str_slot(b, 0x22, &e, 0));
    e.p = instance;
    TRY(json_str_slot(b, 0x2a, &e, 0));
    e.p = limited;
    TRY(json_bool_slot(b, 0x30, &e));
    return 0;
}

static PyObject *native_segment_json(PyObject *module, PyObject *payload) {
    (void)module;
    if (!PyBytes_Check(payload)) {
        Py_RETURN_NONE; /* not ours: the exact path decides */
    }
    Buf b;
    buf_init(&b);
    PyObject *out;
    int r = json_segment(&b, (const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload));
    if (r == 0) {
        out = PyBytes_FromStringAndSize(b.p, b.len);
    } else if (r == BAIL) {
        out = Py_NewRef(Py_None);
    } else {
        out = NULL;
    }
    buf_free(&b);
    return out;
}

/* ------------------------------------------------------------------------------ entry points */
/* Anything but EncodeError that escaped (a wrong type, an unencodable string, no memory)
 * becomes EncodeError, chained, as encode._guarded does; BaseExceptions pass through. */
static void as_encode_error(const char *what) {
    if (PyErr_ExceptionMatches(EncodeError) || !PyErr_ExceptionMatches(PyExc_Exception)) {
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *msg = PyUnicode_FromFormat("invalid %s: %s: %S", what,
                                         ((PyTypeObject *)type)->tp_name, value);
    PyObject *exc = msg == NULL ? NULL : PyObject_CallOneArg(EncodeError, msg);
    Py_XDECREF(msg);
    if (exc == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return; /* the error of building the message stands */
    }
    Py_INCREF(value);
    PyException_SetContext(exc, value); /* steals one reference */
    PyException_SetCause(exc, value);   /* steals the other */
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_SetObject(EncodeError, exc);
    Py_DECREF(exc);
}

static PyObject *encode_with(PyObject *rec, int (*put)(Buf *, PyObject *), const char *what) {
    Buf b;
    buf_init(&b);
    PyObject *out = NULL;
    if (put(&b, rec) == 0) {
        out = PyBytes_FromStringAndSize(b.p, b.len);
    } else {
        as_encode_error(what);
    }
    buf_free(&b);
    return out;
}

static PyObject *native_segment(PyObject *module, PyObject *rec) {
    (void)module;
    return encode_with(rec, put_segment, "SEGMENT record -> SegmentObject");
}

static PyObject *native_log(PyObject *module, PyObject *rec) {
    (void)module;
    return encode_with(rec, put_log, "LOG record -> LogData");
}

/* SegmentCollection of encoded SegmentObjects: repeated field 1. */
static PyObject *native_segment_collection(PyObject *module, PyObject *segments) {
    (void)module;
    PyObject *seq = PySequence_Fast(segments, "segments must be iterable");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **it = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(it[i])) {
            PyErr_Format(PyExc_TypeError, "an encoded segment must be bytes, not %.100s",
                         Py_TYPE(it[i])->tp_name);
            Py_DECREF(seq);
            return NULL;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(it[i]);
        total += 1 + varint_len((uint64_t)len) + len;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out != NULL) {
        Buf b; /* writes straight into the result: cap is exactly what it needs */
        b.p = PyBytes_AS_STRING(out);
        b.len = 0;
        b.cap = total;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t len = PyBytes_GET_SIZE(it[i]);
            b.p[b.len++] = 0x0a;
            put_varint_raw(&b, (uint64_t)len);
            memcpy(b.p + b.len, PyBytes_AS_STRING(it[i]), (size_t)len);
            b.len += len;
        }
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"segment", native_segment, METH_O,
     "Encode a SEGMENT record -> SegmentObject; raises EncodeError for anything invalid."},
    {"segment_json", native_segment_json, METH_O,
     "SEGMENT record as JSON bytes -> SegmentObject, or None when the payload is not on the\n"
     "fast path (decode it and use segment(); that gives the same bytes or the error)."},
    {"log", native_log, METH_O,
     "Encode a LOG record -> LogData; raises EncodeError for anything invalid."},
    {"segment_collection", native_segment_collection, METH_O,
     "SegmentCollection of already encoded SegmentObjects (field 1, repeated)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_encode_native",
    "Native encoder of SEGMENT and LOG records (optional accelerator of reporter_proc.encode).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__encode_native(void) {
    PyObject *wire = PyImport_ImportModule("reporter_proc._wire");
    if (wire == NULL) {
        return NULL;
    }
    EncodeError = PyObject_GetAttrString(wire, "EncodeError");
    Py_DECREF(wire);
    if (EncodeError == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "SHORT_VALUE", SHORT_VALUE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
