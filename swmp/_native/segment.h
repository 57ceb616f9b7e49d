/* The span core's SegmentCore (segment.c), shared by its other sources (see span.h). */
#ifndef SWMP_SEGMENT_H
#define SWMP_SEGMENT_H
#include <Python.h>

#include "attrcache.h"

typedef struct {
    PyObject_HEAD
    PyObject *trace_id;
    PyObject *segment_id;
    PyObject *finished;  /* spans in the order they finished */
    Py_ssize_t next_id;  /* the next span's id (0 is the first span's): see SpanIds */
    PyObject *open;      /* one token per open span */
    PyObject *token;     /* [True]: the right to emit, taken once */
    PyObject *first;
    PyObject *size_limited;
    PyObject *skip_analysis;
    PyObject *encoded;
    PyObject *correlation;
    PyObject *profile;
    PyObject *ended_op; /* the first span's operation name once the segment is emitted */
} SegmentCore;

extern PyTypeObject swmp_SegmentCoreType;
extern PyTypeObject swmp_SpanIdsType;

/* A list or object field of a segment: the struct's own for ours, by attribute otherwise
 * (a pure-Python segment). New reference. */
#define SEG_FIELD(seg, member, name) \
    (PyObject_TypeCheck((seg), &swmp_SegmentCoreType) ? Py_NewRef(((SegmentCore *)(seg))->member) \
                                                       : PyObject_GetAttr((seg), (name)))

/* Set by set_segments(): the identity (its service and instance, base64 too) and the "no
 * correlation" value a new segment starts with. */
extern PyObject *swmp_seg_identity, *swmp_no_correlation;
/* Interned by swmp_segment_init(): the names of ``_open`` and ``_token`` (SEG_FIELD's for a
 * pure-Python segment), and "" (the empty operation name). */
extern PyObject *swmp_s_open, *swmp_s_token, *swmp_empty_op;

/* ``holder.pid`` (kept by the fork hooks, no system call) or, with no holder, ``fn()``;
 * -1 with an error. */
long long swmp_pid_of(PyObject *holder, PyObject *fn, swmp_AttrCache *cache);
PyObject *swmp_set_ids(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_new_id(PyObject *module, PyObject *unused);
PyObject *swmp_set_segments(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int swmp_segment_init(void);
#endif
