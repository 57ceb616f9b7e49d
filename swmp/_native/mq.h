/* swmp._spancore's message-queue producer steps (mq.c), registered by the module in spancore.c. */
#ifndef SWMP_MQ_H
#define SWMP_MQ_H
#include <Python.h>
PyObject *swmp_setup_mq(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_kafka_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames);
PyObject *swmp_amqp_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames);
PyObject *swmp_kafka_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_amqp_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
#endif
