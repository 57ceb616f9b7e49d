/* copy_slots(obj, descriptors): a new instance of ``type(obj)``, made as ``object.__new__``
 * makes it, holding the values ``obj`` has in the slots of ``descriptors`` (member
 * descriptors of its class; a slot ``obj`` has not set stays unset in the copy).
 *
 * Why: a traced RabbitMQ publish copies the caller's message properties so that the
 * caller's object is never modified (swmp/instrument/_props_copy.py ``shallow_copy``). pamqp's
 * ``Basic.Properties`` has fourteen slots: read and set one by one in Python, the copy took
 * ~1.6 us, more than the exit span it was made for; here it is the pointers copied.
 *
 * What ``copy.copy`` would do for such a class (its ``__reduce_ex__`` round reads each set
 * slot and sets it again on a new object) when reading and setting go straight to the slot:
 * the caller (``_props_copy._copy_plan``) hands over only classes without ``__getattribute__``,
 * ``__setattr__``, copy hooks or a ``__new__`` of their own, whose slot names all resolve to
 * the member descriptors passed. This function checks what it relies on itself (the
 * descriptors are object slots of ``type(obj)``'s layout, the type is made by
 * ``object.__new__``) and raises TypeError otherwise, so a wrong plan cannot write outside
 * the object. The instance ``__dict__``, if any, is the caller's to copy. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "slots.h"

static PyObject *no_args = NULL;

static int check_descriptor(PyObject *d, PyTypeObject *type) {
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "copy_slots: not a member descriptor");
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || !PyType_IsSubtype(type, PyDescr_TYPE(d)) ||
        m->offset < (Py_ssize_t)sizeof(PyObject) || m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "copy_slots: not a writable object slot of this type");
        return -1;
    }
    return 0;
}

PyObject *swmp_copy_slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "copy_slots(obj, descriptors: tuple)");
        return NULL;
    }
    PyObject *obj = args[0], *descriptors = args[1];
    PyTypeObject *type = Py_TYPE(obj);
    if (type->tp_new != PyBaseObject_Type.tp_new) {
        PyErr_SetString(PyExc_TypeError, "copy_slots: the type has a __new__ of its own");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(descriptors);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (check_descriptor(PyTuple_GET_ITEM(descriptors, i), type) < 0) {
            return NULL;
        }
    }
    if (no_args == NULL && (no_args = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    PyObject *copy = PyBaseObject_Type.tp_new(type, no_args, NULL); /* object.__new__(type) */
    if (copy == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t offset = ((PyMemberDescrObject *)PyTuple_GET_ITEM(descriptors, i))->d_member->offset;
        PyObject *value = *(PyObject **)((char *)obj + offset);
        PyObject **slot = (PyObject **)((char *)copy + offset);
        if (value != NULL) {
            Py_XSETREF(*slot, Py_NewRef(value)); /* a name listed twice: the same value again */
        }
    }
    return copy;
}
