/* Shared by the native encoder's sources: the output buffer and the protobuf wire writers.
 *
 * Output is built in one growable buffer (on the stack while it fits); a nested message
 * reserves two bytes for its length and moves its body only when the length needs more.
 * Everything here is static inline: each source gets its own copy, nothing is exported.
 */
#ifndef SWMP_NATIVE_WIRE_H
#define SWMP_NATIVE_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* reporter_proc._wire.EncodeError, looked up when the module is imported (module.c). */
extern PyObject *swmp_EncodeError;
#define EncodeError swmp_EncodeError

/* Raised (module-private) where a decoded record holds a value of a type that could run
 * Python code when its truth, length, hash or items are taken: the record goes to the
 * pure-Python encoder instead (module.c). The walk in records.c holds borrowed pointers into
 * the record's lists, which such code could resize or free. */
extern PyObject *swmp_Exotic;

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

static inline void buf_init(Buf *b) {
    b->p = b->stack;
    b->len = 0;
    b->cap = STACK_BYTES;
}

static inline void buf_free(Buf *b) {
    if (b->p != b->stack) {
        PyMem_Free(b->p);
    }
}

static inline int buf_grow(Buf *b, Py_ssize_t need) {
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

static inline int msg_end(Buf *b, Py_ssize_t start) {
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

/* The encoders (0: done, -1: Python error set; the JSON one also BAIL: not on its path). */
int swmp_put_segment(Buf *b, PyObject *rec);
int swmp_put_log(Buf *b, PyObject *rec);
#define BAIL 1
int swmp_json_segment(Buf *b, const unsigned char *p, Py_ssize_t n);

#endif
