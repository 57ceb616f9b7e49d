/* name_request (route.c): a routed request's entry span named after its route. */
#ifndef SWMP_ROUTE_H
#define SWMP_ROUTE_H
#include <Python.h>
PyObject *swmp_setup_route(PyObject *module, PyObject *fallback);
PyObject *swmp_name_request(PyObject *module, PyObject *template);
#endif
