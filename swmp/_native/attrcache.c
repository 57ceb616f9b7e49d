/* swmp_slot_attr(obj, name, cache): ``getattr(obj, name)`` for the agent's own settings and
 * state objects (Limits, Stats, the sampling policy, the ignore rules, the process identity:
 * classes with ``__slots__``), read on every span or segment.
 *
 * Why: the attribute protocol looks the name up in the type's MRO and calls the member
 * descriptor each time, ~150 instructions and several cache lines of type dictionaries,
 * which are cold after the application's own work; a request read about ten of them. The
 * interpreter caches this per bytecode (LOAD_ATTR_SLOT); C calls do not get that cache, so
 * each call site keeps one: when the object's type is the one seen before and unchanged
 * since (its version tag: any change to the class or a base gives it a new one), and the name
 * the same object, the slot is read where it lies, which is exactly what the member descriptor would return. Anything
 * else (another type, a class with its own ``__getattribute__`` or ``__setattr__``, a name
 * that is not a plain writable object slot, a slot never set) goes through
 * ``PyObject_GetAttr`` as before. ``swmp_slot_ref`` gives the slot itself, for a caller that
 * also sets it (emit.c's counters). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "attrcache.h"

static int valid_tag(PyTypeObject *type) {
    return PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG) && type->tp_version_tag != 0;
}

PyObject **swmp_slot_ref(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyTypeObject *type = Py_TYPE(obj);
    if (name == cache->name && type == cache->type && valid_tag(type) && type->tp_version_tag == cache->version) {
        return (PyObject **)((char *)obj + cache->offset);
    }
    cache->type = NULL;
    cache->version = 0;
    /* Both generic: reading and setting the name on an instance both go to its descriptor. */
    if (type->tp_getattro != PyObject_GenericGetAttr || type->tp_setattro != PyObject_GenericSetAttr ||
        !PyUnicode_CheckExact(name)) {
        return NULL;
    }
    PyObject *d = _PyType_Lookup(type, name); /* borrowed; gives the type a version tag */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) || !valid_tag(type)) {
        return NULL;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || !PyType_IsSubtype(type, PyDescr_TYPE(d))) {
        return NULL;
    }
    Py_XSETREF(cache->name, Py_NewRef(name));
    cache->type = type;
    cache->version = type->tp_version_tag;
    cache->offset = m->offset;
    return (PyObject **)((char *)obj + m->offset);
}

PyObject *swmp_slot_attr(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyObject **slot = swmp_slot_ref(obj, name, cache);
    if (slot != NULL && *slot != NULL) {
        return Py_NewRef(*slot);
    }
    return PyObject_GetAttr(obj, name); /* anything else, a slot never set included: as always */
}

PyObject *swmp_slot_attr_optional(PyObject *obj, PyObject *name, swmp_AttrCache *cache) {
    PyObject **slot = swmp_slot_ref(obj, name, cache);
    if (slot != NULL && *slot != NULL) {
        return Py_NewRef(*slot);
    }
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    return v;
}

/* slot_attr(obj, name): swmp_slot_attr through one cache of its own (for the tests). */
PyObject *swmp_slot_attr_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    static swmp_AttrCache cache;
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_attr(obj, name: str)");
        return NULL;
    }
    return swmp_slot_attr(args[0], args[1], &cache);
}
