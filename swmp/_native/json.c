/* The SEGMENT record's JSON, written here instead of by orjson (emit.c emit_fast).
 *
 * Why: every traced request and consumed message ends in one segment record, and
 * ``orjson.dumps`` of it was ~5,700 instructions of the ~33,000 a traced WSGI request costs
 * (its per-call set-up, the output buffer, the span rows built as lists first). The record
 * holds only a few kinds of value (text, integers, booleans, None, nested lists), so it is
 * written straight from the segment's and spans' fields into one buffer.
 *
 * The bytes are orjson's, byte for byte, for every value this writer takes (compact
 * separators; ``"`` ``\`` and control characters escaped as orjson does, other text as raw
 * UTF-8; integers in the signed or unsigned 64-bit range): tests/test_native_json.py holds
 * them side by side. For anything else (a float or a dict a user put into a tag or log, an
 * integer past 64 bits, text with a lone surrogate, nesting past MAX_DEPTH) it declines,
 * and the caller serializes the record with orjson as before, which writes it or refuses it
 * exactly as it always has.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "json.h"

#define MAX_DEPTH 32 /* records nest 5 deep (record, spans, span, logs, log entry, fields) */
#define DECLINED 1   /* a value orjson must decide: no error set */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    char small[1024]; /* a typical record fits: no allocation */
} Buf;

static int grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + need) {
        cap *= 2;
    }
    char *data = b->data == b->small ? PyMem_Malloc((size_t)cap) : PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (b->data == b->small) {
        memcpy(data, b->small, (size_t)b->len);
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const char *s, Py_ssize_t n) {
    if (b->len + n > b->cap && grow(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static inline int put_char(Buf *b, char c) {
    if (b->len + 1 > b->cap && grow(b, 1) < 0) {
        return -1;
    }
    b->data[b->len++] = c;
    return 0;
}

/* orjson's escapes: the short forms for \b \t \n \f \r, \u00xx (lower-case hex) for the
 * other control characters, \" and \\; everything else (DEL and non-ASCII UTF-8) raw. */
static const char HEX[] = "0123456789abcdef";

/* 1 for the bytes JSON text must escape: control characters, '"' and '\\'. */
static const unsigned char ESCAPED[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    ['"'] = 1, ['\\'] = 1,
};

/* The bytes of ``u`` from ``i`` on, with escapes (the slow path: text holding a byte to
 * escape); the bytes before ``i`` are already at ``o``. Returns the end of what it wrote. */
static char *put_escaped(char *o, const char *u, Py_ssize_t i, Py_ssize_t n) {
    o += i;
    Py_ssize_t run = 0; /* bytes copied as they are, pending */
    for (; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (!ESCAPED[c]) {
            run++;
            continue;
        }
        memcpy(o, u + i - run, (size_t)run);
        o += run;
        run = 0;
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\b': *o++ = 'b'; break;
        case '\t': *o++ = 't'; break;
        case '\n': *o++ = 'n'; break;
        case '\f': *o++ = 'f'; break;
        case '\r': *o++ = 'r'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = HEX[c >> 4];
            *o++ = HEX[c & 15];
        }
    }
    memcpy(o, u + n - run, (size_t)run);
    return o + run;
}

/* A word's bytes below 0x20, or equal to '"' or '\\', set their high bit in the result. */
static inline uint64_t hit8(uint64_t w) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    return ((w - ones * 0x20) | ((w ^ (ones * '"')) - ones) | ((w ^ (ones * '\\')) - ones)) & ~w & highs;
}

static inline uint32_t hit4(uint32_t w) {
    const uint32_t ones = 0x01010101U, highs = 0x80808080U;
    return ((w - ones * 0x20) | ((w ^ (ones * '"')) - ones) | ((w ^ (ones * '\\')) - ones)) & ~w & highs;
}

static int put_text(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *u;
    if (PyUnicode_IS_COMPACT_ASCII(s)) { /* the common case: its bytes are its UTF-8 */
        u = (const char *)PyUnicode_DATA(s);
        n = PyUnicode_GET_LENGTH(s);
    } else {
        u = PyUnicode_AsUTF8AndSize(s, &n);
        if (u == NULL) {
            PyErr_Clear(); /* a lone surrogate: orjson refuses it with its own error */
            return DECLINED;
        }
    }
    /* At most 6 bytes a byte, plus the quotes: reserve once, then write without checks. */
    if (b->len + 6 * n + 2 > b->cap && grow(b, 6 * n + 2) < 0) {
        return -1;
    }
    char *o = b->data + b->len + 1;
    o[-1] = '"';
    /* Most text (ids, names, tags) has nothing to escape: it is checked and copied a word at
     * a time (fixed-size copies, single moves: no call to memcpy per text). The last 1-7
     * bytes of a longer text are checked and copied as one more word ending at the text's
     * end (overlapping bytes already checked, which hold no escape); text of 4-7 bytes as
     * two words of four the same way. From the first word holding a byte to escape, the
     * text goes the slow way (put_escaped) after the words before it. */
    Py_ssize_t i = 0;
    if (n >= 8) {
        uint64_t w;
        for (; i + 8 <= n; i += 8) {
            memcpy(&w, u + i, 8);
            if (hit8(w)) {
                goto escaped;
            }
            memcpy(o + i, &w, 8);
        }
        if (i < n) {
            memcpy(&w, u + n - 8, 8);
            if (hit8(w)) {
                goto escaped;
            }
            memcpy(o + n - 8, &w, 8);
        }
    } else if (n >= 4) {
        uint32_t a, z;
        memcpy(&a, u, 4);
        memcpy(&z, u + n - 4, 4);
        if (hit4(a) | hit4(z)) {
            goto escaped;
        }
        memcpy(o, &a, 4);
        memcpy(o + n - 4, &z, 4);
    } else {
        for (; i < n; i++) {
            if (ESCAPED[(unsigned char)u[i]]) {
                goto escaped;
            }
            o[i] = u[i];
        }
    }
    o[n] = '"';
    b->len = o + n + 1 - b->data;
    return 0;
escaped:
    o = put_escaped(o, u, i, n);
    *o++ = '"';
    b->len = o - b->data;
    return 0;
}

/* Decimal digits of ``u`` (and a minus sign), written straight into the buffer backwards
 * from their end, two at a time: snprintf's locale and format parsing cost more than the
 * rest of a record. The digits are counted first so that they land in place (no scratch
 * and no call to memcpy per number: a record holds 9 or more). */
static const char PAIRS[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                            "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                            "8081828384858687888990919293949596979899";

static const unsigned long long POW10[20] = { /* 10**k */
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL,
    100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
    10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
    1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL,
};

static int put_digits(Buf *b, unsigned long long u, int negative) {
    if (b->len + 21 > b->cap && grow(b, 21) < 0) { /* 20 digits and a sign at most */
        return -1;
    }
    char *o = b->data + b->len;
    if (negative) {
        *o++ = '-';
    }
    if (u < 10) { /* ids, kinds, flags: most numbers of a record */
        *o++ = (char)('0' + u);
        b->len = o - b->data;
        return 0;
    }
    /* How many digits: millisecond times have 13, so the count starts at 11 for those. */
    int digits = u >= POW10[10] ? 11 : 2;
    while (digits < 20 && u >= POW10[digits]) {
        digits++;
    }
    char *end = o + digits, *p = end;
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100) * 2;
        u /= 100;
        *--p = PAIRS[r + 1];
        *--p = PAIRS[r];
    }
    if (u >= 10) {
        *--p = PAIRS[u * 2 + 1];
        *--p = PAIRS[u * 2];
    } else {
        *--p = (char)('0' + u);
    }
    b->len = end - b->data;
    return 0;
}

static int put_int(Buf *b, PyObject *v) {
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    /* An exact int of at most two digits (below 2**60: ids, kinds, millisecond times) read
     * from its digits: PyLong_AsLongLongAndOverflow's checks cost more than the rest. */
    if (Py_IS_TYPE(v, &PyLong_Type)) {
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        if (size >= -2 && size <= 2) {
            Py_ssize_t a = size < 0 ? -size : size;
            unsigned long long u = a == 0 ? 0 : a == 1 ? d[0] : (unsigned long long)d[0] | (unsigned long long)d[1] << 30;
            return put_digits(b, u, size < 0);
        }
    }
#endif
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow == 0) {
        /* -x as unsigned: also right for -2**63, whose negation a long long cannot hold. */
        return x < 0 ? put_digits(b, 0ULL - (unsigned long long)x, 1) : put_digits(b, (unsigned long long)x, 0);
    }
    if (overflow < 0) {
        return DECLINED; /* below -2**63: orjson refuses it */
    }
    unsigned long long ux = PyLong_AsUnsignedLongLong(v);
    if (ux == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return DECLINED; /* 2**64 or more */
    }
    return put_digits(b, ux, 0);
}

static int put_value(Buf *b, PyObject *v, int depth);

static int put_items(Buf *b, PyObject *const *items, Py_ssize_t n, int depth) {
    if (put_char(b, '[') < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && put_char(b, ',') < 0) {
            return -1;
        }
        int r = put_value(b, items[i], depth);
        if (r != 0) {
            return r;
        }
    }
    return put_char(b, ']');
}

static int put_value(Buf *b, PyObject *v, int depth) {
    /* Exact text and integers first (most of a record): a pointer comparison each, no load
     * of the type's flags; then the singletons, subclasses (IntEnum fields) and lists. */
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyUnicode_Type) {
        return put_text(b, v);
    }
    if (t == &PyLong_Type) {
        return put_int(b, v);
    }
    if (PyUnicode_Check(v)) {
        return put_text(b, v);
    }
    if (v == Py_None) {
        return put(b, "null", 4);
    }
    if (v == Py_True) {
        return put(b, "true", 4);
    }
    if (v == Py_False) {
        return put(b, "false", 5);
    }
    if (PyLong_Check(v)) {
        return put_int(b, v);
    }
    if (depth >= MAX_DEPTH) {
        return DECLINED;
    }
    if (PyList_Check(v)) {
        /* A list of text and numbers cannot change while it is written (no Python code
         * runs here), so its item array is read directly. */
        return put_items(b, ((PyListObject *)v)->ob_item, PyList_GET_SIZE(v), depth + 1);
    }
    if (PyTuple_Check(v)) {
        return put_items(b, ((PyTupleObject *)v)->ob_item, PyTuple_GET_SIZE(v), depth + 1);
    }
    return DECLINED; /* floats, dicts, anything else: orjson's call */
}

static PyObject *finish(Buf *b, int r) {
    PyObject *out = r == 0 ? PyBytes_FromStringAndSize(b->data, b->len) : NULL;
    if (b->data != b->small) {
        PyMem_Free(b->data);
    }
    return out;
}

static void init(Buf *b) {
    b->data = b->small;
    b->len = 0;
    b->cap = sizeof b->small;
}

PyObject *swmp_json_dump(PyObject *value) {
    Buf b;
    init(&b);
    return finish(&b, put_value(&b, value, 0));
}

PyObject *swmp_json_record(PyObject *const *head, Py_ssize_t nhead, PyObject *const *rows, Py_ssize_t nrows,
                           Py_ssize_t width) {
    Buf b;
    init(&b);
    int r = put_char(&b, '[');
    for (Py_ssize_t i = 0; r == 0 && i < nhead; i++) {
        r = put_value(&b, head[i], 1);
        if (r == 0) {
            r = put_char(&b, ',');
        }
    }
    r = r ? r : put_char(&b, '[');
    for (Py_ssize_t i = 0; r == 0 && i < nrows; i++) {
        if (i) {
            r = put_char(&b, ',');
        }
        r = r ? r : put_items(&b, rows + i * width, width, 3);
    }
    r = r ? r : put(&b, "]]", 2);
    return finish(&b, r);
}
