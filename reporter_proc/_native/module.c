/* reporter_proc._encode_native: the optional accelerator of reporter_proc/encode.py.
 *
 * SEGMENT and LOG records -> SkyWalking v3 protobuf bytes, exactly the bytes the pure-Python
 * encoder produces, raising reporter_proc._wire.EncodeError where it raises
 * (tests/test_encode_native.py checks both). Sources: records.c (decoded records), json.c
 * (segments straight from the worker's JSON bytes), wire.h (buffer and wire writers); this
 * file holds the Python entry points.
 */
#include "wire.h"

PyObject *swmp_EncodeError;
PyObject *swmp_Exotic;

static PyObject *native_segment_json(PyObject *module, PyObject *payload) {
    (void)module;
    if (!PyBytes_Check(payload)) {
        Py_RETURN_NONE; /* not ours: the exact path decides */
    }
    Buf b;
    buf_init(&b);
    PyObject *out;
    int r = swmp_json_segment(&b, (const unsigned char *)PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload));
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

/* ``reporter_proc.encode.<name>(rec)``: the pure-Python encoder, for a record the native walk
 * declined (swmp_Exotic). Looked up when needed: encode.py imports this module. */
static PyObject *encode_in_python(const char *name, PyObject *rec) {
    PyObject *encode = PyImport_ImportModule("reporter_proc.encode");
    if (encode == NULL) {
        return NULL;
    }
    PyObject *fn = PyObject_GetAttrString(encode, name);
    Py_DECREF(encode);
    if (fn == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_CallOneArg(fn, rec);
    Py_DECREF(fn);
    return out;
}

static PyObject *encode_with(PyObject *rec, int (*put)(Buf *, PyObject *), const char *what,
                             const char *python_encoder) {
    Buf b;
    buf_init(&b);
    PyObject *out = NULL;
    if (put(&b, rec) == 0) {
        out = PyBytes_FromStringAndSize(b.p, b.len);
    } else if (PyErr_ExceptionMatches(swmp_Exotic)) {
        PyErr_Clear();
        out = encode_in_python(python_encoder, rec);
    } else {
        as_encode_error(what);
    }
    buf_free(&b);
    return out;
}

static PyObject *native_segment(PyObject *module, PyObject *rec) {
    (void)module;
    return encode_with(rec, swmp_put_segment, "SEGMENT record -> SegmentObject", "segment_py");
}

static PyObject *native_log(PyObject *module, PyObject *rec) {
    (void)module;
    return encode_with(rec, swmp_put_log, "LOG record -> LogData", "log_py");
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
    if (swmp_Exotic == NULL) {
        swmp_Exotic = PyErr_NewException("reporter_proc._encode_native._Exotic", NULL, NULL);
        if (swmp_Exotic == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "SHORT_VALUE", SHORT_VALUE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
