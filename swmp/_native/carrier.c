/* The incoming carrier (see spancore.c).
 *
 * decode_carrier(value): decode_sw8's common case whole, a plain header (split as split_sw8
 * does) from a caller whose four fields ``callers`` (swmp.propagation's cache of them)
 * already holds, as a ContextCarrier filled here the way its __init__ fills it (no
 * correlation, no skip_analysis); None for anything else, and decode_sw8 goes its own way.
 * Why: the carrier's Python __init__ (ten slot stores) and decode_sw8's frame were ~5,000
 * instructions of every consumed message, task run and request with a caller, twice what
 * the split costs. The slots are written at the offsets their descriptors give. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#include "carrier.h"
#include "spancore.h"
#include "start.h"
#include "sw8.h"

static const char *const carrier_field_names[CF_COUNT] = {
    "trace_id", "segment_id", "span_id", "service", "instance", "endpoint", "address", "sampled", "correlation",
    "skip_analysis"};
static Py_ssize_t carrier_offsets[CF_COUNT];
PyTypeObject *swmp_carrier_class = NULL;
static PyObject *known_callers = NULL;

PyObject *swmp_setup_carrier(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_carrier(carrier_class: type, callers: dict)");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    Py_ssize_t offsets[CF_COUNT];
    for (int i = 0; i < CF_COUNT; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, carrier_field_names[i]);
        if (d == NULL) {
            return NULL;
        }
        int slot = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX;
        if (slot) {
            offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        }
        Py_DECREF(d);
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "setup_carrier(): %s is not a __slots__ field", carrier_field_names[i]);
            return NULL;
        }
    }
    memcpy(carrier_offsets, offsets, sizeof(offsets));
    Py_XSETREF(swmp_carrier_class, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(known_callers, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* segment.cross_process_ref(carrier), the list of the kind and the caller's seven fields,
 * read from the carrier's slots: the Python function was a frame on every request, task
 * run or message that continues a caller. The kind (the list's first item) is the one the
 * Python function gave on its first call, which also covers anything unusual (another
 * carrier class, a slot never set). */
PyObject *swmp_ref_kind = NULL;

PyObject *swmp_caller_ref(PyObject *carrier) {
    if (swmp_ref_kind != NULL && swmp_carrier_class != NULL && Py_TYPE(carrier) == swmp_carrier_class) {
        PyObject *ref = PyList_New(1 + CF_ADDRESS + 1);
        if (ref == NULL) {
            return NULL;
        }
        PyList_SET_ITEM(ref, 0, Py_NewRef(swmp_ref_kind));
        int i = CF_TRACE_ID;
        for (; i <= CF_ADDRESS; i++) {
            PyObject *v = *(PyObject **)((char *)carrier + carrier_offsets[i]);
            if (v == NULL) {
                break;
            }
            PyList_SET_ITEM(ref, 1 + i, Py_NewRef(v));
        }
        if (i > CF_ADDRESS) {
            return ref;
        }
        Py_DECREF(ref); /* an unset slot: Python raises for it as it always did */
    }
    PyObject *ref = PyObject_CallOneArg(swmp_cross_process_ref, carrier);
    if (ref != NULL && swmp_ref_kind == NULL && PyList_CheckExact(ref) && PyList_GET_SIZE(ref) == 1 + CF_ADDRESS + 1) {
        swmp_ref_kind = Py_NewRef(PyList_GET_ITEM(ref, 0));
    }
    return ref;
}

/* The caller's four fields (a new reference to the cached tuple) for the tail of ``value``
 * from ``tail_at``, or NULL (an error set, or none: decode_sw8 decides). The last tail
 * and its fields are remembered: a consumer or server hears from the same few callers, and
 * comparing the bytes spares the tail's copy, its hash and the look-up. */
static PyObject *last_tail = NULL, *last_caller = NULL;

static PyObject *last_caller_fields(PyObject *value, Py_ssize_t tail_at) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(value) - tail_at;
    const Py_UCS1 *tail_bytes = PyUnicode_1BYTE_DATA(value) + tail_at;
    if (last_tail != NULL && PyUnicode_GET_LENGTH(last_tail) == n &&
        memcmp(PyUnicode_1BYTE_DATA(last_tail), tail_bytes, (size_t)n) == 0) {
        return Py_NewRef(last_caller);
    }
    PyObject *tail = PyUnicode_Substring(value, tail_at, PyUnicode_GET_LENGTH(value));
    if (tail == NULL) {
        return NULL;
    }
    PyObject *caller = PyDict_GetItemWithError(known_callers, tail); /* borrowed */
    if (caller == NULL || !PyTuple_CheckExact(caller) || PyTuple_GET_SIZE(caller) != 4) {
        Py_DECREF(tail);
        return NULL;
    }
    Py_XSETREF(last_tail, tail); /* compact ASCII, as a substring of ASCII text */
    Py_XSETREF(last_caller, Py_NewRef(caller));
    return Py_NewRef(caller);
}

int swmp_sw8_read(PyObject *value, SwmpSw8 *out) {
    if (swmp_carrier_class == NULL) {
        return 0;
    }
    Py_ssize_t tail_at;
    if (!swmp_sw8_parts(value, &out->sampled, &out->trace_id, &out->segment_id, &out->span_id, &tail_at)) {
        return 0;
    }
    out->caller = last_caller_fields(value, tail_at);
    if (out->caller == NULL) {
        Py_CLEAR(out->trace_id);
        Py_CLEAR(out->segment_id);
        return PyErr_Occurred() ? -1 : 0; /* not seen yet, or a bad caller: decode_sw8 decides */
    }
    return 1;
}

void swmp_sw8_clear(SwmpSw8 *p) {
    Py_CLEAR(p->trace_id);
    Py_CLEAR(p->segment_id);
    Py_CLEAR(p->caller);
}

PyObject *swmp_sw8_carrier(const SwmpSw8 *p) {
    PyObject *span = PyLong_FromLongLong(p->span_id);
    PyObject *correlation = span == NULL ? NULL : PyDict_New();
    PyObject *obj = correlation == NULL ? NULL : swmp_carrier_class->tp_alloc(swmp_carrier_class, 0);
    if (obj == NULL) {
        Py_XDECREF(span);
        Py_XDECREF(correlation);
        return NULL;
    }
    PyObject *fields[CF_COUNT] = {
        Py_NewRef(p->trace_id),
        Py_NewRef(p->segment_id),
        span,
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 0)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 1)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 2)),
        Py_NewRef(PyTuple_GET_ITEM(p->caller, 3)),
        Py_NewRef(p->sampled ? Py_True : Py_False),
        correlation,
        Py_NewRef(Py_False),
    };
    for (int i = 0; i < CF_COUNT; i++) { /* the references move into the new object's slots */
        *(PyObject **)((char *)obj + carrier_offsets[i]) = fields[i];
    }
    return obj;
}

PyObject *swmp_decode_carrier(PyObject *module, PyObject *value) {
    SwmpSw8 p;
    int r = swmp_sw8_read(value, &p);
    if (r <= 0) {
        return r < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *carrier = swmp_sw8_carrier(&p);
    swmp_sw8_clear(&p);
    return carrier;
}
