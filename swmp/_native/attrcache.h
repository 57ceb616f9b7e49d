/* An inline cache for reading a __slots__ attribute from C (attrcache.c). */
#ifndef SWMP_ATTRCACHE_H
#define SWMP_ATTRCACHE_H
#include <Python.h>

/* One per call site (a zeroed static): the name and type last seen there, the type's version
 * tag then, and the slot's offset in its instances. */
typedef struct {
    PyObject *name;     /* held: its identity is compared */
    PyTypeObject *type; /* borrowed: compared with the version tag, never dereferenced alone */
    unsigned int version;
    Py_ssize_t offset;
} swmp_AttrCache;

/* ``getattr(obj, name)``: a new reference, or NULL with the error getattr raises. */
/* Where ``name``'s slot lies in ``obj`` when getting and setting it on ``obj`` go straight
 * to that slot (its value there may be NULL: never set), else NULL (no error). */
PyObject **swmp_slot_ref(PyObject *obj, PyObject *name, swmp_AttrCache *cache);
PyObject *swmp_slot_attr(PyObject *obj, PyObject *name, swmp_AttrCache *cache);
/* ``getattr(obj, name)`` the same way, but NULL without an error set when ``obj`` has no
 * such attribute (an AttributeError: the caller's default applies). */
PyObject *swmp_slot_attr_optional(PyObject *obj, PyObject *name, swmp_AttrCache *cache);
PyObject *swmp_slot_attr_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
