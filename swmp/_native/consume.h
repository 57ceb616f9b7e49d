/* swmp._spancore's consumed-message entry (consume.c), registered by the module in spancore.c. */
#ifndef SWMP_CONSUME_H
#define SWMP_CONSUME_H
#include <Python.h>
PyObject *swmp_setup_consume(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_amqp_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_ConsumingType;
/* For within.c and deliver.c: a Consuming's ``__exit__(type, value, tb)`` (``args``: 3) called
 * without the method look-up (the type is final, so its exact type is the answer the look-up
 * would give): what the method returns. */
PyObject *swmp_consuming_exit(PyObject *c, PyObject *const *args);
PyObject *swmp_setup_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_kafka_consumed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
