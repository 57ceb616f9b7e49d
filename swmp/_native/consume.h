/* swmp._spancore's consumed-message entry (consume.c), registered by the module in spancore.c. */
#ifndef SWMP_CONSUME_H
#define SWMP_CONSUME_H
#include <Python.h>
PyObject *swmp_setup_consume(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_amqp_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_ConsumingType;
/* For within.c and deliver.c, which run a callable inside a context manager: ``cm.__enter__()``
 * and ``args[0].__exit__(*args[1:4])`` (``args``: 4, with a slot free before them), a
 * Consuming's called directly (the type is final, so its exact type is the answer the method
 * look-up would give), any other's through the look-up of ``name`` (the caller's interned
 * "__enter__" / "__exit__"). What the method returns. */
PyObject *swmp_cm_enter(PyObject *cm, PyObject *name);
PyObject *swmp_cm_exit(PyObject *const *args, PyObject *name);
PyObject *swmp_setup_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
