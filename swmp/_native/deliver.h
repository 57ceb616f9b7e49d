/* swmp._spancore's delivered RabbitMQ message facts and callback (deliver.c), registered by
 * the module in spancore.c. */
#ifndef SWMP_DELIVER_H
#define SWMP_DELIVER_H
#include <Python.h>
PyObject *swmp_pika_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_aiormq_consuming(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_pika_peer(PyObject *module, PyObject *channel);
PyObject *swmp_aiormq_peer(PyObject *module, PyObject *channel);
PyObject *swmp_pika_callback(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject swmp_PikaCallbackType;
#endif
