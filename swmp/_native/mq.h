/* swmp._spancore's message-queue producer steps (mq.c), registered by the module in spancore.c. */
#ifndef SWMP_MQ_H
#define SWMP_MQ_H
#include <Python.h>
PyObject *swmp_setup_mq(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_kafka_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames);
PyObject *swmp_amqp_send_span(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames);
PyObject *swmp_kafka_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *swmp_amqp_headers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* For consume.c (after setup_mq()): 1 when every value (exact strs) fits the tag limit, 0
 * when the Python form must decide (a value to clip, or an Exception reading the limit,
 * cleared), -1 with an error that is not an Exception; and a span's mq.* tags (the
 * one list when it is of the recorded class without tags yet, else the Python tag_mq;
 * ``queue`` NULL for none): 0 or -1. */
int swmp_mq_ready(void); /* setup_mq() was called */
int swmp_mq_fit(PyObject *const *values, int n);
int swmp_mq_tags(PyObject *span, PyObject *broker, PyObject *topic, PyObject *queue);
/* For attach.c: amqp_headers(span, headers) (after setup_mq()). */
PyObject *swmp_amqp_merge(PyObject *span, PyObject *headers);
#endif
