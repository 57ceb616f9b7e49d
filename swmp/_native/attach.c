/* amqp_attach(factory, shallow_copy, native_plan): the attach step of a traced RabbitMQ
 * publish (what amqp_send_span calls with the span and the caller's properties), as one C
 * callable instead of the instrumentations' ``_with_headers`` functions (pika.py, aiormq.py:
 * the Python forms, the reference and what runs without the native core):
 *
 *     props = factory() if properties is None else shallow_copy(properties)
 *     props.headers = amqp_headers(span, props.headers)
 *     return props
 *
 * Why: those were two Python frames per publish (``_with_headers``, then ``shallow_copy``
 * of swmp/instrument/_props_copy.py), entered with the CPU caches cold between the
 * application's work and the client's.
 *
 * The copy is ``shallow_copy``'s: for a class ``native_plan(cls)`` answers with a tuple of
 * member descriptors (a class copy.copy would copy slot by slot and through its
 * ``__dict__``: no copy hooks, no ``__new__`` of its own; the tuple is empty for a class
 * with only a ``__dict__``), the slots are copied by copy_slots (slots.c) and the
 * ``__dict__`` updated as ``new.__dict__.update(obj.__dict__)`` does; for any other class
 * (None) ``shallow_copy`` itself is called. The answer is remembered per class, as
 * ``shallow_copy`` remembers its plan. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "attach.h"
#include "mq.h"
#include "slots.h"

static PyObject *s_headers = NULL, *s_dict = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *factory;      /* the properties of a message published without any */
    PyObject *shallow_copy; /* the Python copy, for classes it copies some other way */
    PyObject *native_plan;  /* cls -> descriptors tuple, or None */
    PyObject *plans;        /* {cls: descriptors tuple or None} */
    vectorcallfunc vectorcall;
} Attach;

static int attach_traverse(Attach *self, visitproc visit, void *arg) {
    Py_VISIT(self->factory);
    Py_VISIT(self->shallow_copy);
    Py_VISIT(self->native_plan);
    Py_VISIT(self->plans);
    return 0;
}

static int attach_clear(Attach *self) {
    Py_CLEAR(self->factory);
    Py_CLEAR(self->shallow_copy);
    Py_CLEAR(self->native_plan);
    Py_CLEAR(self->plans);
    return 0;
}

static void attach_dealloc(Attach *self) {
    PyObject_GC_UnTrack(self);
    attach_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The class's descriptors tuple, Py_None for shallow_copy's own way (a new reference either way), NULL
 * on error. */
static PyObject *plan_of(Attach *self, PyObject *cls) {
    PyObject *plan = PyDict_GetItemWithError(self->plans, cls);
    if (plan != NULL || PyErr_Occurred()) {
        return Py_XNewRef(plan);
    }
    PyObject *made = PyObject_CallOneArg(self->native_plan, cls);
    if (made == NULL) {
        return NULL;
    }
    if (made != Py_None && !PyTuple_CheckExact(made)) {
        Py_DECREF(made);
        PyErr_SetString(PyExc_TypeError, "amqp_attach: native_plan must return a tuple or None");
        return NULL;
    }
    if (PyDict_SetItem(self->plans, cls, made) < 0) {
        Py_DECREF(made);
        return NULL;
    }
    return made;
}

/* ``shallow_copy(obj)``: a new reference or NULL. */
static PyObject *copy_of(Attach *self, PyObject *obj) {
    /* A new reference: the plans dict is its only owner, and Python code may run below. */
    PyObject *plan = plan_of(self, (PyObject *)Py_TYPE(obj));
    if (plan == NULL) {
        return NULL;
    }
    if (plan == Py_None) {
        Py_DECREF(plan);
        return PyObject_CallOneArg(self->shallow_copy, obj);
    }
    PyObject *args[2] = {obj, plan};
    PyObject *copy = swmp_copy_slots(NULL, args, 2);
    Py_DECREF(plan);
    if (copy == NULL) {
        return NULL;
    }
    /* state = getattr(obj, "__dict__", None); if state: new.__dict__.update(state) */
    PyObject *state = PyObject_GetAttr(obj, s_dict);
    if (state == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(copy);
            return NULL;
        }
        PyErr_Clear();
        return copy;
    }
    int some = PyObject_IsTrue(state);
    int ok = some >= 0;
    if (some > 0) {
        PyObject *target = PyObject_GetAttr(copy, s_dict);
        if (target != NULL && PyDict_CheckExact(target) && PyDict_CheckExact(state)) {
            ok = PyDict_Update(target, state) == 0;
        } else {
            PyObject *r = target == NULL ? NULL : PyObject_CallMethod(target, "update", "O", state);
            ok = r != NULL;
            Py_XDECREF(r);
        }
        Py_XDECREF(target);
    }
    Py_DECREF(state);
    if (!ok) {
        Py_DECREF(copy);
        return NULL;
    }
    return copy;
}

static PyObject *attach_vectorcall(Attach *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "attach(span, properties) takes 2 positional arguments");
        return NULL;
    }
    PyObject *span = args[0], *properties = args[1];
    PyObject *props = properties == Py_None ? PyObject_CallNoArgs(self->factory) : copy_of(self, properties);
    if (props == NULL) {
        return NULL;
    }
    PyObject *headers = PyObject_GetAttr(props, s_headers);
    PyObject *table = headers == NULL ? NULL : swmp_amqp_merge(span, headers);
    Py_XDECREF(headers);
    if (table == NULL || PyObject_SetAttr(props, s_headers, table) < 0) {
        Py_XDECREF(table);
        Py_DECREF(props);
        return NULL;
    }
    Py_DECREF(table);
    return props;
}

PyTypeObject swmp_AttachType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "swmp._spancore.AmqpAttach",
    .tp_basicsize = sizeof(Attach),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "attach(span, properties): a copy of the properties (or the factory's) with the span's headers table.",
    .tp_dealloc = (destructor)attach_dealloc,
    .tp_traverse = (traverseproc)attach_traverse,
    .tp_clear = (inquiry)attach_clear,
    .tp_vectorcall_offset = offsetof(Attach, vectorcall),
    .tp_call = PyVectorcall_Call,
};

PyObject *swmp_amqp_attach(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "amqp_attach(factory, shallow_copy, native_plan): three callables");
        return NULL;
    }
    if (s_dict == NULL && ((s_headers = PyUnicode_InternFromString("headers")) == NULL ||
                           (s_dict = PyUnicode_InternFromString("__dict__")) == NULL)) {
        return NULL;
    }
    PyObject *plans = PyDict_New();
    if (plans == NULL) {
        return NULL;
    }
    Attach *self = PyObject_GC_New(Attach, &swmp_AttachType);
    if (self == NULL) {
        Py_DECREF(plans);
        return NULL;
    }
    self->factory = Py_NewRef(args[0]);
    self->shallow_copy = Py_NewRef(args[1]);
    self->native_plan = Py_NewRef(args[2]);
    self->plans = plans;
    self->vectorcall = (vectorcallfunc)attach_vectorcall;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}
