/* The ``sw8`` header's text: split_sw8 for an incoming one, swmp_b64_text and
 * swmp_sw8_join for the one an exit span sends (inject.c's sw8_header).
 *
 * split_sw8(value): the plain case of an incoming ``sw8`` header, parsed in one C pass.
 *
 * Why: every consumed message, task run and request with a caller decodes one, and in
 * Python (swmp/propagation.py, decode_sw8) the split, the checks and the two base64 ids
 * cost ~1.1 us of its ~1.4 us. Here they cost ~0.1 us.
 *
 * It is a fast path, not a second decoder: it answers only for the shape every agent sends
 * (ASCII text without surrounding whitespace, a "0"/"1" flag, canonical padded base64 of
 * ASCII ids with no stray bits, a span id of 1-10 digits within 2**31 - 1) with
 * ``(sampled, trace_id, segment_id, span_id, tail)``, ``tail`` being the caller's four
 * fields, undecoded (decode_sw8 decodes those once per distinct text). For anything else it
 * answers None and decode_sw8 goes its own way, which decides as it always did; so where
 * this answers, the answer is the Python path's (tests/test_propagation.py compares the
 * decoder with its previous form on 200,000 mutated headers). */
#include "sw8.h"

#include <stdio.h>
#include <string.h>

#define MAX_SW8_LENGTH 4096 /* swmp.propagation.MAX_SW8_LENGTH */
#define MAX_SPAN_ID 2147483647LL

/* base64 value of each byte, -1 for bytes outside the alphabet ('=' included); filled by
 * swmp_sw8_init() when the module loads. */
static signed char b64[256];
static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void swmp_sw8_init(void) {
    memset(b64, -1, sizeof(b64));
    for (int i = 0; i < 64; i++) {
        b64[(unsigned char)alphabet[i]] = (signed char)i;
    }
}

/* The text of a base64 id, or NULL (no error set) when it is not plain: empty, unpadded,
 * outside the alphabet, padding within, stray bits in the last character, or not ASCII.
 * Four characters (three bytes) a step: a byte at a time cost ~660 instructions an id. */
static PyObject *decode_id(const unsigned char *s, Py_ssize_t n) {
    if (n == 0 || n % 4 != 0) {
        return NULL;
    }
    Py_ssize_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    Py_ssize_t out_len = n / 4 * 3 - pad;
    PyObject *text = PyUnicode_New(out_len, 127);
    if (text == NULL) {
        PyErr_Clear(); /* no memory: the Python path will say so */
        return NULL;
    }
    unsigned char *out = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t whole = pad ? n - 4 : n; /* the quads without padding */
    int outside = 0;                    /* negative once any character is outside the alphabet */
    unsigned int high = 0;              /* the bytes' high bits: not ASCII */
    for (Py_ssize_t i = 0; i < whole; i += 4, out += 3) {
        int a = b64[s[i]], b = b64[s[i + 1]], c = b64[s[i + 2]], d = b64[s[i + 3]];
        outside |= a | b | c | d;
        unsigned int v = (unsigned int)a << 18 | (unsigned int)b << 12 | (unsigned int)c << 6 | (unsigned int)d;
        high |= v & 0x808080u;
        out[0] = (unsigned char)(v >> 16);
        out[1] = (unsigned char)(v >> 8);
        out[2] = (unsigned char)v;
    }
    unsigned int stray = 0; /* bits after the last byte, in the padded quad */
    if (pad) {
        const unsigned char *q = s + n - 4;
        int a = b64[q[0]], b = b64[q[1]], c = pad == 1 ? b64[q[2]] : 0;
        outside |= a | b | c;
        unsigned int v = (unsigned int)a << 12 | (unsigned int)b << 6 | (unsigned int)c; /* 18 bits */
        out[0] = (unsigned char)(v >> 10);
        if (pad == 1) {
            out[1] = (unsigned char)(v >> 2);
            high |= v & 0x20200u; /* bit 7 of each byte: v's bits 17 and 9 */
            stray = v & 3u;
        } else {
            high |= v & 0x20000u;
            stray = v & 0x3ffu; /* b's low 4 bits (c is 0) */
        }
    }
    if (outside < 0 || high != 0 || stray != 0) {
        Py_DECREF(text);
        return NULL;
    }
    return text;
}

int swmp_sw8_parts(PyObject *value, int *sampled, PyObject **trace_id, PyObject **segment_id, long long *span_id,
                   Py_ssize_t *tail_at) {
    if (!PyUnicode_CheckExact(value) || !PyUnicode_IS_COMPACT_ASCII(value)) {
        return 0;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    const unsigned char *s = PyUnicode_1BYTE_DATA(value);
    if (n == 0 || n > MAX_SW8_LENGTH || s[0] <= ' ' || s[n - 1] <= ' ') {
        return 0; /* str.strip() territory: the Python path */
    }
    Py_ssize_t dash[4];
    int found = 0;
    /* memchr for each dash: the ids between them are most of the header's length. */
    for (const unsigned char *at = s, *end = s + n; found < 4 && at < end; found++) {
        const unsigned char *d = memchr(at, '-', (size_t)(end - at));
        if (d == NULL) {
            break;
        }
        dash[found] = d - s;
        at = d + 1;
    }
    if (found < 4 || dash[0] != 1 || (s[0] != '0' && s[0] != '1')) {
        return 0;
    }
    Py_ssize_t span_len = dash[3] - dash[2] - 1;
    if (span_len < 1 || span_len > 10) {
        return 0;
    }
    long long id = 0;
    for (Py_ssize_t i = dash[2] + 1; i < dash[3]; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
        id = id * 10 + (s[i] - '0');
    }
    if (id > MAX_SPAN_ID) {
        return 0;
    }
    Py_ssize_t tid_len = dash[1] - dash[0] - 1, sid_len = dash[2] - dash[1] - 1;
    PyObject *tid = decode_id(s + dash[0] + 1, tid_len);
    /* The caller's segment started its trace (the usual first hop): one id, decoded once. */
    PyObject *sid = tid == NULL                                                               ? NULL
                    : tid_len == sid_len && memcmp(s + dash[0] + 1, s + dash[1] + 1, (size_t)tid_len) == 0
                        ? Py_NewRef(tid)
                        : decode_id(s + dash[1] + 1, sid_len);
    if (sid == NULL) {
        Py_XDECREF(tid);
        return 0;
    }
    *sampled = s[0] == '1';
    *trace_id = tid;
    *segment_id = sid;
    *span_id = id;
    *tail_at = dash[3] + 1;
    return 1;
}

PyObject *swmp_split_sw8(PyObject *module, PyObject *value) {
    int sampled;
    PyObject *trace_id, *segment_id;
    long long span_id;
    Py_ssize_t tail_at;
    if (!swmp_sw8_parts(value, &sampled, &trace_id, &segment_id, &span_id, &tail_at)) {
        Py_RETURN_NONE;
    }
    PyObject *tail = PyUnicode_Substring(value, tail_at, PyUnicode_GET_LENGTH(value));
    PyObject *span = tail == NULL ? NULL : PyLong_FromLongLong(span_id);
    PyObject *out = span == NULL ? NULL
                                 : PyTuple_Pack(5, sampled ? Py_True : Py_False, trace_id, segment_id, span, tail);
    Py_DECREF(trace_id);
    Py_DECREF(segment_id);
    Py_XDECREF(span);
    Py_XDECREF(tail);
    return out;
}

/* -- outgoing ------------------------------------------------------------------------------
 * Why: Span.inject in Python (two base64 ids per segment, the peer's, and an eight-part
 * f-string) was ~1.2 us of every propagating exit span (an HTTP or gRPC client call, a
 * produced message, a published Celery task). */
PyObject *swmp_b64_text(PyObject *text) {
    Py_ssize_t n;
    const char *raw = PyUnicode_AsUTF8AndSize(text, &n);
    if (raw == NULL) {
        PyErr_Clear(); /* a lone surrogate: b64() encodes it with "replace" */
        return NULL;
    }
    const unsigned char *in = (const unsigned char *)raw;
    PyObject *out = PyUnicode_New((n + 2) / 3 * 4, 127);
    if (out == NULL) {
        return NULL;
    }
    char *o = (char *)PyUnicode_1BYTE_DATA(out);
    Py_ssize_t i = 0;
    for (; i + 2 < n; i += 3) {
        unsigned int v = (unsigned int)in[i] << 16 | (unsigned int)in[i + 1] << 8 | in[i + 2];
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = alphabet[v & 63];
    }
    if (i < n) {
        unsigned int v = (unsigned int)in[i] << 16 | (i + 1 < n ? (unsigned int)in[i + 1] << 8 : 0);
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    return out;
}

PyObject *swmp_sw8_join(PyObject *trace, PyObject *segment, long long span_id, PyObject *service,
                        PyObject *instance, PyObject *endpoint, PyObject *peer) {
    if (span_id < 0) {
        return NULL;
    }
    /* The span id in decimal, written backwards (snprintf costs more than the rest). */
    char buf[24];
    char *digits = buf + sizeof(buf);
    unsigned long long v = (unsigned long long)span_id;
    do {
        *--digits = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    Py_ssize_t nd = buf + sizeof(buf) - digits;
    /* The seven fields after the leading "1", each written after a dash. */
    PyObject *texts[7] = {trace, segment, NULL, service, instance, endpoint, peer};
    const char *src[7];
    Py_ssize_t size[7];
    Py_ssize_t len = 1 + 7;
    for (int k = 0; k < 7; k++) {
        if (texts[k] == NULL) { /* the span id */
            src[k] = digits;
            size[k] = nd;
        } else if (PyUnicode_CheckExact(texts[k]) && PyUnicode_IS_COMPACT_ASCII(texts[k])) {
            src[k] = (const char *)PyUnicode_1BYTE_DATA(texts[k]);
            size[k] = PyUnicode_GET_LENGTH(texts[k]);
        } else {
            return NULL;
        }
        len += size[k];
    }
    PyObject *out = PyUnicode_New(len, 127);
    if (out == NULL) {
        return NULL;
    }
    char *o = (char *)PyUnicode_1BYTE_DATA(out);
    *o++ = '1';
    for (int k = 0; k < 7; k++) {
        *o++ = '-';
        memcpy(o, src[k], (size_t)size[k]);
        o += size[k];
    }
    return out;
}
