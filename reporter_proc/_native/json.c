/* SEGMENT records straight from the JSON the worker wrote, without building Python objects.
 *
 * A fast path, not a second decoder: it accepts only the plain shapes the workers write
 * (strings or null in string slots, integers or null in int slots, true/false/null in bool
 * slots, arrays of the exact layout, strict JSON and strict UTF-8) and answers "not mine"
 * (BAIL) for anything else, for which the caller decodes with orjson and encodes the decoded
 * record, the exact path. So where this returns bytes, they are the bytes of
 * segment(orjson.loads(payload)); tests/test_encode_native.py checks it. */
#include "wire.h"
#include "text.h"

/* Return codes of the json_* functions: 0 done, BAIL (wire.h), -1 Python error set. */
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

int swmp_json_segment(Buf *b, const unsigned char *p, Py_ssize_t n) {
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
