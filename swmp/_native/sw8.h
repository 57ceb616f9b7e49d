/* swmp._spancore.split_sw8 (sw8.c), registered by the module in spancore.c. */
#ifndef SWMP_SW8_H
#define SWMP_SW8_H
#include <Python.h>
void swmp_sw8_init(void);
PyObject *swmp_split_sw8(PyObject *module, PyObject *value);
#endif
