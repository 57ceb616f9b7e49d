/* ipc._ringwrite: the optional native fast path of a ring writer (ipc/ring_writer.py).
 *
 * Why native: a worker writes one record per finished request, between the request's own
 * I/O. Measured in a Flask worker, the pure-Python write (lock, packer, control-word stores,
 * sleeping-flag check) cost ~6.8 us of CPU per record there against ~0.8 us in a tight
 * loop: after each blocking call the CPU's caches and TLB are cold, and every bytecode and
 * object it touches is paid again. In C the same steps are a few cache lines.
 *
 * What it is: ``Writer``, the state of one ring's writer (tail, lap tag, write limit,
 * written count; readable and writable from Python) and its ``write(rtype, payload)``.
 * ``write`` does exactly what the pure-Python fast path does (same bytes, same words, same
 * order: payload and header, then the tail with one aligned store, then the written count)
 * and hands everything else (wrap, full ring, bad input, garbage words) to the Python
 * ``slow(rtype, payload)`` given at construction, which reads and writes the same state
 * through the attributes. Writers of one process are serialized by the GIL while the fast
 * path is taken and by this object's lock (the pure version's threading.RLock) around
 * ``slow``, which runs with it held; see writer_write. A write that the same
 * thread starts from inside the slow path (a signal handler that logs) is dropped and counted
 * (``reentered``), as in the pure version. tests/test_ipc_ring_native.py compares the ring's
 * bytes and words after the same writes with both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>

/* Word indexes of the control block and the status block (ipc/_layout.py; checked by
 * ring_writer.py against the layout when it builds a Writer). */
#define C_TAIL 8
#define C_WRITTEN 9
#define C_HEAD 16
#define S_SLEEPING 8

enum { F_TAIL, F_TAG, F_LIMIT, F_WRITTEN, F_INSANE };

typedef struct {
    PyObject_HEAD
    Py_buffer data;
    Py_buffer control;
    Py_buffer status;
    int have_data, have_control, have_status;
    unsigned char *d;
    uint64_t *ctl;
    uint64_t *st;
    long long cap, mask, max_payload, wake_fill;
    /* The writer's own copies (see ring_writer.py), as C integers while they fit (positions
     * are u64 words; garbage adopted from shared memory can be any of them); a value that
     * does not (a limit past 2**64 - 1, a negative one) is kept as the Python int in the
     * matching object field, and the fast path then decides as Python's ints would. */
    uint64_t tail, tag, limit, written;
    long long insane_head;
    PyObject *big[5];
    int limit_huge; /* big[F_LIMIT] is above every u64 position (not negative) */
    int problem_logged;
    PyObject *wake;   /* wake(): ring the reader's doorbell */
    PyObject *slow;   /* slow(rtype, payload) -> True | False | str, never raises */
    PyObject *report; /* report(message): log a problem (once) */
    PyObject *reentered; /* reentered(payload): count a write made from inside a write */
    PyThread_type_lock lock;
    /* The thread inside write() while ``busy`` (set after taking the lock, cleared before
     * giving it back; read and written with the GIL held). */
    unsigned long owner;
    int busy;
} Writer;

static int get_buffer(PyObject *obj, Py_buffer *view, int *have, Py_ssize_t min_len, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    *have = 1;
    if (view->len < min_len) {
        PyErr_Format(PyExc_ValueError, "%s is too small", what);
        return -1;
    }
    return 0;
}

/* The buffer views this writer holds, given back (a held view keeps its mapping from being
 * closed or resized). */
static void release_views(Writer *self) {
    if (self->have_data) {
        PyBuffer_Release(&self->data);
        self->have_data = 0;
    }
    if (self->have_control) {
        PyBuffer_Release(&self->control);
        self->have_control = 0;
    }
    if (self->have_status) {
        PyBuffer_Release(&self->status);
        self->have_status = 0;
    }
}

static int writer_init(Writer *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"data", "control", "status", "capacity", "wake", "report", NULL};
    PyObject *data, *control, *status, *wake, *report;
    long long cap;
    if (self->lock != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Writer already initialized");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOLOO", kwlist, &data, &control, &status, &cap, &wake,
                                     &report)) {
        return -1;
    }
    if (cap < 4096 || (cap & (cap - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "capacity must be a power of two >= 4096");
        return -1;
    }
    if (!PyCallable_Check(wake) || !PyCallable_Check(report)) {
        PyErr_SetString(PyExc_TypeError, "wake and report must be callable");
        return -1;
    }
    /* A failed __init__ gives back the views it took: the caller may close the mapping, or
     * call __init__ again. */
    if (get_buffer(data, &self->data, &self->have_data, (Py_ssize_t)cap, "data") < 0 ||
        get_buffer(control, &self->control, &self->have_control, (C_HEAD + 1) * 8, "control") < 0 ||
        get_buffer(status, &self->status, &self->have_status, (S_SLEEPING + 1) * 8, "status") < 0) {
        release_views(self);
        return -1;
    }
    if (((uintptr_t)self->control.buf & 7) != 0 || ((uintptr_t)self->status.buf & 7) != 0 ||
        ((uintptr_t)self->data.buf & 7) != 0) {
        PyErr_SetString(PyExc_ValueError, "ring buffers must be 8-byte aligned");
        release_views(self);
        return -1;
    }
    self->d = (unsigned char *)self->data.buf;
    self->ctl = (uint64_t *)self->control.buf;
    self->st = (uint64_t *)self->status.buf;
    self->cap = cap;
    self->mask = cap - 1;
    self->max_payload = cap / 2 - 8;
    self->wake_fill = cap >> 2;
    self->insane_head = -1;
    for (int i = 0; i < 5; i++) {
        Py_CLEAR(self->big[i]);
    }
    Py_XSETREF(self->wake, Py_NewRef(wake));
    Py_XSETREF(self->report, Py_NewRef(report));
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        PyErr_NoMemory();
        release_views(self);
        return -1;
    }
    return 0;
}

static int writer_traverse(Writer *self, visitproc visit, void *arg) {
    for (int i = 0; i < 5; i++) {
        Py_VISIT(self->big[i]);
    }
    Py_VISIT(self->wake);
    Py_VISIT(self->slow);
    Py_VISIT(self->report);
    Py_VISIT(self->reentered);
    return 0;
}

static int writer_clear(Writer *self) {
    for (int i = 0; i < 5; i++) {
        Py_CLEAR(self->big[i]);
    }
    Py_CLEAR(self->wake);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->report);
    Py_CLEAR(self->reentered);
    return 0;
}

static void writer_dealloc(Writer *self) {
    PyObject_GC_UnTrack(self);
    writer_clear(self);
    release_views(self);
    if (self->lock != NULL) {
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void lock(Writer *self) {
    if (!PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        /* Another thread of this process is writing (or in the slow path, which may have
         * let the GIL go): wait without holding the GIL. */
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

/* The fast path; 1 written, 0 not for the fast path (the caller takes the slow one). */
static int fast(Writer *self, PyObject *rtype_obj, PyObject *payload) {
    /* What the pure version's packer takes (struct's "s": bytes and bytearray); the rest
     * (memoryview...) goes the slow path's generic way there too. */
    const char *bytes;
    long long n;
    if (PyBytes_CheckExact(payload)) {
        bytes = PyBytes_AS_STRING(payload);
        n = (long long)PyBytes_GET_SIZE(payload);
    } else if (PyByteArray_CheckExact(payload)) {
        bytes = PyByteArray_AS_STRING(payload);
        n = (long long)PyByteArray_GET_SIZE(payload);
    } else {
        return 0;
    }
    if (!PyLong_Check(rtype_obj)) { /* int or a subclass (bool), as struct takes them */
        return 0;
    }
    int overflow = 0;
    long long rtype = PyLong_AsLongLongAndOverflow(rtype_obj, &overflow);
    if (overflow || rtype < 0 || rtype > 0xFFFF) {
        return 0; /* the slow path refuses it, counts and reports it */
    }
    if (n > self->max_payload) {
        return 0;
    }
    if (self->big[F_TAIL] != NULL || self->big[F_WRITTEN] != NULL || self->big[F_TAG] != NULL ||
        (self->big[F_LIMIT] != NULL && !self->limit_huge) || self->written == UINT64_MAX) {
        return 0;
    }
    uint64_t t = self->tail;
    uint64_t span = (uint64_t)((n + 15) & -8LL);
    if (t > UINT64_MAX - span) {
        return 0; /* the tail word cannot hold the end: Python's store would fail too */
    }
    uint64_t end = t + span;
    if (self->big[F_LIMIT] == NULL && end >= self->limit) {
        return 0;
    }
    unsigned char *at = self->d + (t & (uint64_t)self->mask);
    uint64_t check = ((uint64_t)n ^ (uint64_t)rtype ^ self->tag) & 0xFFFF;
    uint64_t header = (uint64_t)(uint32_t)n | ((uint64_t)rtype << 32) | (check << 48);
    memcpy(at + 8, bytes, (size_t)n);
    memcpy(at, &header, 8); /* little-endian: u32 length, u16 type, u16 check */
    /* Publish: one aligned 8-byte store, after the bytes (release: not moved before them). */
    __atomic_store_n(&self->ctl[C_TAIL], end, __ATOMIC_RELEASE);
    self->tail = end;
    self->written += 1;
    __atomic_store_n(&self->ctl[C_WRITTEN], self->written, __ATOMIC_RELAXED);
    return 1;
}

/* tail - head >= wake_fill, as Python computes it (a garbage tail is a Python int). */
static int wake_due(Writer *self, uint64_t head) {
    if (self->big[F_TAIL] == NULL) {
        return head <= self->tail && self->tail - head >= (uint64_t)self->wake_fill;
    }
    PyObject *h = PyLong_FromUnsignedLongLong(head);
    PyObject *d = h == NULL ? NULL : PyNumber_Subtract(self->big[F_TAIL], h);
    PyObject *f = d == NULL ? NULL : PyLong_FromLongLong(self->wake_fill);
    int due = f == NULL ? 0 : PyObject_RichCompareBool(d, f, Py_GE);
    Py_XDECREF(h);
    Py_XDECREF(d);
    Py_XDECREF(f);
    if (due < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return due;
}

/* After a record went in: ring the reader's doorbell if it sleeps and the ring is due; True. */
static PyObject *written(Writer *self) {
    /* The tail store must be visible before the sleeping flag is loaded (the pure version
     * gets this from its lock's release). */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&self->st[S_SLEEPING], __ATOMIC_RELAXED) != 0) {
        uint64_t head = __atomic_load_n(&self->ctl[C_HEAD], __ATOMIC_RELAXED);
        if (wake_due(self, head)) {
            PyObject *r = PyObject_CallNoArgs(self->wake);
            if (r == NULL) {
                PyErr_Clear(); /* the reader's timer still comes */
            }
            Py_XDECREF(r);
        }
    }
    Py_RETURN_TRUE;
}

static PyObject *writer_write(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(rtype, payload)");
        return NULL;
    }
    if (self->lock == NULL || self->slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Writer not initialized");
        return NULL;
    }
#ifndef Py_GIL_DISABLED
    /* Nobody inside write(): the fast path runs whole under the GIL (it calls no Python code
     * and never lets the GIL go), so no other thread of this process can be between two of
     * its stores, and it needs no lock. ``busy`` is set only while a thread is in the slow
     * path, whose Python code may let the GIL go: then everyone takes the lock below. A thread
     * that has just won the lock but not yet the GIL back has not set ``busy``; writing before
     * it is the same as writing before it won. Why: the lock's acquire and release were ~10
     * lines of libpython and libc code per record, each a miss when a request starts cold. */
    if (!self->busy && fast(self, args[0], args[1])) {
        return written(self);
    }
#endif
    unsigned long me = PyThread_get_thread_ident();
    if (self->busy && self->owner == me) {
        /* This thread is already inside write(), in the slow path's Python code: a signal
         * handler or a finalizer that logs ran there. Waiting for the lock would never end:
         * the record is dropped and counted (by ``reentered``), the ring left to the outer
         * write. The fast path runs no Python code, so nothing re-enters from it. */
        if (self->reentered != NULL) {
            PyObject *r = PyObject_CallOneArg(self->reentered, args[1]);
            if (r == NULL) {
                PyErr_Clear();
            }
            Py_XDECREF(r);
        }
        Py_RETURN_FALSE;
    }
    PyObject *outcome = NULL; /* NULL: written by the fast path */
    lock(self);
    self->owner = me;
    self->busy = 1;
    if (!fast(self, args[0], args[1])) {
        outcome = PyObject_Vectorcall(self->slow, args, 2, NULL);
        if (outcome == NULL) {
            PyErr_Clear(); /* slow() never raises; if it did, the record is dropped */
            outcome = Py_NewRef(Py_False);
        }
    }
    self->busy = 0;
    PyThread_release_lock(self->lock);
    if (outcome == NULL || outcome == Py_True) {
        Py_XDECREF(outcome);
        return written(self);
    }
    if (outcome != Py_False && !self->problem_logged) {
        self->problem_logged = 1;
        PyObject *r = PyObject_CallOneArg(self->report, outcome);
        if (r == NULL) {
            PyErr_Clear();
        }
        Py_XDECREF(r);
    }
    Py_DECREF(outcome);
    Py_RETURN_FALSE;
}

static PyObject *writer_set_slow(Writer *self, PyObject *slow) {
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "slow must be callable");
        return NULL;
    }
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_RETURN_NONE;
}

static PyObject *writer_set_reentered(Writer *self, PyObject *reentered) {
    if (!PyCallable_Check(reentered)) {
        PyErr_SetString(PyExc_TypeError, "reentered must be callable");
        return NULL;
    }
    Py_XSETREF(self->reentered, Py_NewRef(reentered));
    Py_RETURN_NONE;
}

static PyMethodDef writer_methods[] = {
    {"write", (PyCFunction)(void (*)(void))writer_write, METH_FASTCALL,
     "write(rtype, payload) -> bool: append one record (see ipc/ring_writer.py)."},
    {"set_slow", (PyCFunction)writer_set_slow, METH_O, "set_slow(slow): the slow path (called with the lock held)."},
    {"set_reentered", (PyCFunction)writer_set_reentered, METH_O,
     "set_reentered(reentered): counts a write made from inside a write of the same thread (dropped)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *field_get(Writer *self, void *closure) {
    int which = (int)(intptr_t)closure;
    if (self->big[which] != NULL) {
        return Py_NewRef(self->big[which]);
    }
    switch (which) {
    case F_TAIL: return PyLong_FromUnsignedLongLong(self->tail);
    case F_TAG: return PyLong_FromUnsignedLongLong(self->tag);
    case F_LIMIT: return PyLong_FromUnsignedLongLong(self->limit);
    case F_WRITTEN: return PyLong_FromUnsignedLongLong(self->written);
    default: return PyLong_FromLongLong(self->insane_head);
    }
}

static int field_set(Writer *self, PyObject *value, void *closure) {
    int which = (int)(intptr_t)closure;
    if (value == NULL || !PyLong_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "an int is required");
        return -1;
    }
    if (which == F_INSANE) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || v < -1) {
            Py_XSETREF(self->big[which], Py_NewRef(value));
        } else {
            Py_CLEAR(self->big[which]);
            self->insane_head = v;
        }
        return 0;
    }
    int sign = _PyLong_Sign(value);
    unsigned long long v = sign < 0 ? 0 : PyLong_AsUnsignedLongLong(value);
    if (sign < 0 || (v == (unsigned long long)-1 && PyErr_Occurred())) {
        PyErr_Clear(); /* negative, or past 2**64 - 1 */
        Py_XSETREF(self->big[which], Py_NewRef(value));
        if (which == F_LIMIT) {
            self->limit_huge = sign > 0;
        }
        return 0;
    }
    Py_CLEAR(self->big[which]);
    switch (which) {
    case F_TAIL: self->tail = v; break;
    case F_TAG: self->tag = v; break;
    case F_LIMIT: self->limit = v; break;
    default: self->written = v; break;
    }
    return 0;
}

#define FIELD(name, which, doc) \
    {name, (getter)field_get, (setter)field_set, doc, (void *)(intptr_t)(which)}
static PyGetSetDef writer_getset[] = {
    FIELD("tail", F_TAIL, "the writer's tail (its own copy)"),
    FIELD("tag", F_TAG, "the lap tag of the check word"),
    FIELD("limit", F_LIMIT, "the fast path writes below this position"),
    FIELD("written", F_WRITTEN, "records written over the slot's life"),
    FIELD("insane_head", F_INSANE, "a head found inconsistent (-1: none)"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ipc._ringwrite.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state and fast path of one ring writer (see ipc/ring_writer.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_traverse = (traverseproc)writer_traverse,
    .tp_clear = (inquiry)writer_clear,
    .tp_methods = writer_methods,
    .tp_getset = writer_getset,
};

static struct PyModuleDef ringwrite_module = {
    PyModuleDef_HEAD_INIT, "ipc._ringwrite", "The native fast path of a ring writer (see ringwrite.c).", -1, NULL,
};

PyMODINIT_FUNC PyInit__ringwrite(void) {
    if (PyType_Ready(&WriterType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&ringwrite_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddIntConstant(m, "C_TAIL", C_TAIL) < 0 || PyModule_AddIntConstant(m, "C_WRITTEN", C_WRITTEN) < 0 ||
        PyModule_AddIntConstant(m, "C_HEAD", C_HEAD) < 0 || PyModule_AddIntConstant(m, "S_SLEEPING", S_SLEEPING) < 0 ||
        PyModule_AddIntConstant(m, "WAKE_FILL_SHIFT", 2) < 0 || PyModule_AddIntConstant(m, "HEADER_SIZE", 8) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
