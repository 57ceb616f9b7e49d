/* thread_skipped(thread) and runs_in_own_context(executor, fn, ...): the two checks of
 * swmp/instrument/threads.py (``_skipped`` and ``_own_context``) in C, as the ``passes``
 * predicates of the Gates on ``Thread.start`` and ``ThreadPoolExecutor.submit``.
 *
 * Why: inside a request these checks usually answer "nothing to do". Django under ASGI
 * starts two pool threads and submits two work items that run in a copy of the caller's
 * context on every request; the Python wrappers and checks were ~170 bytecodes of the ~600
 * its instrumentation added per request. Here a span being current, the thread's target
 * module or the work item's owner is read without a Python frame; the Python code runs
 * only when a snapshot is actually taken.
 *
 * Both take the patched method's arguments unchanged (the Gate hands them over) and answer
 * exactly as the Python checks do; where those would raise, the answer is "passes" (the
 * Python wrapper caught the error and left the call untraced too). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "threads.h"

/* Set by setup_threads(): the module-name prefixes (tuple of str) and exact names (frozenset)
 * of skipped thread targets, the classes whose bound method as a partial's func runs the
 * work in a copy of the caller's context (a set that grows when asgiref is imported), and
 * functools.partial. */
static PyObject *skip_prefixes = NULL, *skip_exact = NULL, *copying_owners = NULL, *s_target = NULL, *s_run = NULL,
                *s_module = NULL, *s_func = NULL, *s_self = NULL;
static PyTypeObject *partial_type = NULL;
/* Module name -> True/False: a program starts threads from a handful of modules, and the
 * prefix test costs ~250 instructions a thread where the look-up costs a few dozen. */
static PyObject *skip_cache = NULL;
#define SKIP_CACHE_MAX 512

PyObject *swmp_setup_threads(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_CheckExact(args[0]) || !PyFrozenSet_CheckExact(args[1]) || !PySet_CheckExact(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "setup_threads(skip_prefixes: tuple[str, ...], skip_exact: frozenset[str], "
                        "copying_owners: set[type], partial: type)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[0]); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(args[0], i))) {
            PyErr_SetString(PyExc_TypeError, "setup_threads(): the prefixes must be str");
            return NULL;
        }
    }
    if (s_target == NULL && ((s_target = PyUnicode_InternFromString("_target")) == NULL ||
                             (s_run = PyUnicode_InternFromString("run")) == NULL ||
                             (s_module = PyUnicode_InternFromString("__module__")) == NULL ||
                             (s_func = PyUnicode_InternFromString("func")) == NULL ||
                             (s_self = PyUnicode_InternFromString("__self__")) == NULL)) {
        return NULL;
    }
    Py_XSETREF(skip_prefixes, Py_NewRef(args[0]));
    Py_XSETREF(skip_exact, Py_NewRef(args[1]));
    Py_XSETREF(copying_owners, Py_NewRef(args[2]));
    Py_XSETREF(partial_type, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(skip_cache, PyDict_New());
    if (skip_cache == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* getattr(obj, name, None) as a new reference; NULL only with an error other than AttributeError. */
static PyObject *attr_or_none(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    return value;
}

/* 1 when the thread's code belongs to a module whose threads are skipped, 0 when not, -1 on error. */
static int thread_skipped(PyObject *thread) {
    PyObject *target = attr_or_none(thread, s_target);
    if (target == NULL) {
        return -1;
    }
    if (target == Py_None) {
        Py_SETREF(target, PyObject_GetAttr((PyObject *)Py_TYPE(thread), s_run));
        if (target == NULL) {
            return -1;
        }
    }
    PyObject *name = attr_or_none(target, s_module);
    Py_DECREF(target);
    if (name == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(name); /* ``... or ""`` */
    int skipped;
    PyObject *known;
    if (truth <= 0) {
        skipped = truth; /* "" is skipped by no prefix nor name */
    } else if (!PyUnicode_Check(name)) {
        skipped = -1; /* Python's str.startswith would raise on it */
    } else if (PyUnicode_CheckExact(name) && (known = PyDict_GetItemWithError(skip_cache, name)) != NULL) {
        skipped = known == Py_True;
    } else if (PyErr_Occurred()) {
        skipped = -1;
    } else {
        skipped = 0;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(skip_prefixes) && skipped == 0; i++) {
            Py_ssize_t hit = PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(skip_prefixes, i), 0, PY_SSIZE_T_MAX, -1);
            skipped = hit < 0 ? -1 : hit > 0;
        }
        if (skipped == 0) {
            skipped = PySet_Contains(skip_exact, name);
        }
        if (skipped >= 0 && PyUnicode_CheckExact(name)) {
            if (PyDict_GET_SIZE(skip_cache) >= SKIP_CACHE_MAX) {
                PyDict_Clear(skip_cache);
            }
            if (PyDict_SetItem(skip_cache, name, skipped ? Py_True : Py_False) < 0) {
                skipped = -1;
            }
        }
    }
    Py_DECREF(name);
    return skipped;
}

/* 1 when ``fn`` runs in a copy of the submitting context already, 0 when not, -1 on error. */
static int own_context(PyObject *fn) {
    if (Py_IS_TYPE(fn, partial_type)) {
        PyObject *func = PyObject_GetAttr(fn, s_func);
        PyObject *owner = func == NULL ? NULL : attr_or_none(func, s_self);
        Py_XDECREF(func);
        if (owner == NULL) {
            return -1;
        }
        int r = PySet_Contains(copying_owners, (PyObject *)Py_TYPE(owner));
        Py_DECREF(owner);
        return r;
    }
    /* grpc's server submits ``context.run`` itself (the handler's copied context). */
    return Py_IS_TYPE(fn, &PyCFunction_Type) && PyCFunction_GET_SELF(fn) != NULL &&
           PyContext_CheckExact(PyCFunction_GET_SELF(fn));
}

static PyObject *answer(int r) {
    if (r < 0) {
        return NULL; /* the Gate takes an error for "passes" */
    }
    return Py_NewRef(r ? Py_True : Py_False);
}

PyObject *swmp_thread_skipped(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (skip_prefixes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_threads() was not called");
        return NULL;
    }
    /* start(self): any other form is the original's to refuse, untraced */
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        Py_RETURN_TRUE;
    }
    return answer(thread_skipped(args[0]));
}

PyObject *swmp_runs_in_own_context(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (copying_owners == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup_threads() was not called");
        return NULL;
    }
    /* submit(self, fn, /, *args, **kwargs): without ``fn`` the original refuses the call */
    if (PyVectorcall_NARGS(nargsf) < 2) {
        Py_RETURN_TRUE;
    }
    return answer(own_context(args[1]));
}
