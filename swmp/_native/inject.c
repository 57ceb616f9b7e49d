/* The outgoing ``sw8`` header (see spancore.c): a span's value built in C (sw8_header), and
 * span.inject()'s dict of it for the common case. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "attrcache.h"
#include "inject.h"
#include "segment.h"
#include "span.h"
#include "spancore.h"
#include "sw8.h"

/* The last text encoded and its base64, for the peer and for the endpoint: a client calls
 * the same few peers over and over (often with the very same string object, e.g. a cached
 * broker address), and a process's segments start at the same few endpoints. */
typedef struct {
    PyObject *text, *b64;
} B64Memo;

static B64Memo last_peer, last_endpoint;

static PyObject *memo_b64(B64Memo *memo, PyObject *text) {
    PyObject *last = memo->text;
    if (last != NULL && (text == last || (PyUnicode_IS_COMPACT_ASCII(text) && PyUnicode_IS_COMPACT_ASCII(last) &&
                                          PyUnicode_GET_LENGTH(text) == PyUnicode_GET_LENGTH(last) &&
                                          memcmp(PyUnicode_1BYTE_DATA(text), PyUnicode_1BYTE_DATA(last),
                                                 (size_t)PyUnicode_GET_LENGTH(text)) == 0))) {
        return Py_NewRef(memo->b64);
    }
    PyObject *out = swmp_b64_text(text);
    if (out != NULL) {
        Py_XSETREF(memo->text, Py_NewRef(text));
        Py_XSETREF(memo->b64, Py_NewRef(out));
    }
    return out;
}

static PyObject *peer_b64(PyObject *peer) {
    return memo_b64(&last_peer, peer);
}

/* A segment's base64 trace id, segment id and endpoint (Segment.encode_ids: computed once,
 * kept in ``encoded``); NULL with no error set when the Python path must do it. */
static PyObject *encoded_ids(SegmentCore *seg) {
    PyObject *enc = seg->encoded;
    if (PyTuple_CheckExact(enc) && PyTuple_GET_SIZE(enc) == 3) {
        return Py_NewRef(enc);
    }
    PyObject *first = seg->first;
    PyObject *op = first == Py_None ? Py_NewRef(seg->ended_op)
                   : PyObject_TypeCheck(first, &swmp_SpanCoreType) ? Py_NewRef(((SpanCore *)first)->op)
                                                               : NULL;
    if (op == NULL || !PyUnicode_CheckExact(op) || !PyUnicode_CheckExact(seg->trace_id) ||
        !PyUnicode_CheckExact(seg->segment_id)) {
        Py_XDECREF(op);
        return NULL;
    }
    PyObject *sid = swmp_b64_text(seg->segment_id);
    PyObject *tid = sid == NULL                           ? NULL
                    : seg->trace_id == seg->segment_id    ? Py_NewRef(sid)
                                                          : swmp_b64_text(seg->trace_id);
    PyObject *ep = tid == NULL                ? NULL
                   : PyUnicode_GET_LENGTH(op) ? memo_b64(&last_endpoint, op)
                                              : Py_NewRef(swmp_empty_op);
    Py_DECREF(op);
    if (ep == NULL) {
        Py_XDECREF(sid);
        Py_XDECREF(tid);
        return NULL;
    }
    enc = PyTuple_New(3); /* made once per segment that sends a header: no PyTuple_Pack call */
    if (enc == NULL) {
        Py_DECREF(tid);
        Py_DECREF(sid);
        Py_DECREF(ep);
        return NULL;
    }
    PyTuple_SET_ITEM(enc, 0, tid); /* the references given to the tuple */
    PyTuple_SET_ITEM(enc, 1, sid);
    PyTuple_SET_ITEM(enc, 2, ep);
    Py_SETREF(seg->encoded, Py_NewRef(enc));
    return enc;
}

/* The ``sw8`` value of ``span`` (a new reference), or NULL: with an error set, or without one
 * when the Python path must build it (a pure-Python segment, text it encodes its own way). */
static PyObject *build_sw8(PyObject *obj, PyObject *service_b64, PyObject *instance_b64) {
    if (!PyObject_TypeCheck(obj, &swmp_SpanCoreType)) {
        return NULL;
    }
    SpanCore *span = (SpanCore *)obj;
    if (span->segment == NULL || span->span_id == NULL || span->peer == NULL || /* deleted fields */
        !PyObject_TypeCheck(span->segment, &swmp_SegmentCoreType) || !PyLong_CheckExact(span->span_id) ||
        !PyUnicode_CheckExact(span->peer)) {
        return NULL;
    }
    int overflow = 0;
    long long span_id = PyLong_AsLongLongAndOverflow(span->span_id, &overflow);
    if (overflow || (span_id == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *enc = encoded_ids((SegmentCore *)span->segment);
    if (enc == NULL) {
        return NULL;
    }
    PyObject *peer = peer_b64(span->peer);
    PyObject *out = peer == NULL ? NULL
                                 : swmp_sw8_join(PyTuple_GET_ITEM(enc, 0), PyTuple_GET_ITEM(enc, 1), span_id,
                                                 service_b64, instance_b64, PyTuple_GET_ITEM(enc, 2), peer);
    Py_DECREF(enc);
    Py_XDECREF(peer);
    return out;
}

/* sw8_header(span, service_b64, instance_b64): the ``sw8`` value Span.inject sends, in C;
 * None (the Python path builds it) for a pure-Python segment or text it encodes its own
 * way. tests/test_propagation.py compares the two. */
PyObject *swmp_sw8_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "sw8_header(span, service_b64, instance_b64)");
        return NULL;
    }
    PyObject *out = build_sw8(args[0], args[1], args[2]);
    if (out == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return out;
}

/* span.inject(): ``{"sw8": ...}`` built here for a native segment without correlation
 * data or skip_analysis (the common case); anything else goes to the Python reference
 * (setup_inject's fallback), which does what it always did. Why: the Python method, its
 * look-ups and its dict were ~40% of what propagating an exit span added (a Celery
 * publish, an HTTP or gRPC client call, a produced message). */
static PyObject *inject_fallback = NULL, *s_sw8 = NULL, *s_service_b64 = NULL, *s_instance_b64 = NULL;

int swmp_inject_init(void) {
    return swmp_intern(&s_sw8, "sw8") < 0 || swmp_intern(&s_service_b64, "service_b64") < 0 ||
                   swmp_intern(&s_instance_b64, "instance_b64") < 0
               ? -1
               : 0;
}

PyObject *swmp_setup_inject(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "setup_inject(fallback: callable)");
        return NULL;
    }
    Py_XSETREF(inject_fallback, Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

/* The ``sw8`` value inject() puts in its dict, built here for a native segment without
 * correlation data or skip_analysis (a new reference); NULL with no error set for anything
 * else (the caller goes to inject(), whose fallback decides), NULL with an error set on
 * failure. */
static PyObject *plain_sw8(PyObject *span) {
    PyObject *seg = ((SpanCore *)span)->segment;
    PyObject *corr =
        seg != NULL && PyObject_TypeCheck(seg, &swmp_SegmentCoreType) ? ((SegmentCore *)seg)->correlation : NULL;
    if (swmp_seg_identity == NULL || corr == NULL || ((SegmentCore *)seg)->skip_analysis != Py_False ||
        !(corr == swmp_no_correlation || (PyDict_CheckExact(corr) && PyDict_GET_SIZE(corr) == 0))) {
        return NULL;
    }
    static swmp_AttrCache at_service_b64, at_instance_b64;
    PyObject *service = swmp_slot_attr(swmp_seg_identity, s_service_b64, &at_service_b64);
    PyObject *instance = service == NULL ? NULL : swmp_slot_attr(swmp_seg_identity, s_instance_b64, &at_instance_b64);
    /* Texts swmp_sw8_join cannot copy (not ASCII str) make build_sw8 decline: Python's. */
    PyObject *sw8 = instance == NULL ? NULL : build_sw8(span, service, instance);
    Py_XDECREF(service);
    Py_XDECREF(instance);
    return sw8;
}

PyObject *swmp_span_sw8(PyObject *span) {
    if (inject_fallback == NULL || !PyObject_TypeCheck(span, &swmp_SpanCoreType)) {
        return NULL;
    }
    return plain_sw8(span);
}

PyObject *swmp_spancore_inject(SpanCore *self, PyObject *unused) {
    if (inject_fallback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "swmp._spancore.setup_inject() was not called");
        return NULL;
    }
    PyObject *sw8 = plain_sw8((PyObject *)self);
    if (sw8 != NULL) {
        PyObject *headers = PyDict_New();
        if (headers != NULL && PyDict_SetItem(headers, s_sw8, sw8) < 0) {
            Py_CLEAR(headers);
        }
        Py_DECREF(sw8);
        return headers;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyObject_CallOneArg(inject_fallback, (PyObject *)self);
}

PyObject *swmp_span_inject(PyObject *span) {
    return swmp_spancore_inject((SpanCore *)span, NULL);
}
