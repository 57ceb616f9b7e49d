/* Byte-level text checks of the native JSON reader (json.c): the hex digits of a \u escape
 * (0, or 1 when not hex),
 * strict UTF-8 (what Python's and orjson's decoders accept), printable ASCII runs. */
#ifndef SWMP_NATIVE_TEXT_H
#define SWMP_NATIVE_TEXT_H

#include "wire.h" /* Python.h first, as CPython requires */

static inline int hex4(const unsigned char *p, unsigned *out) {
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
            return 1;
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

#endif
