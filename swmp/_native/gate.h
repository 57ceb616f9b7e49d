/* swmp._spancore.Gate (gate.c), registered by the module in spancore.c. */
#ifndef SWMP_GATE_H
#define SWMP_GATE_H
#include <Python.h>
extern PyTypeObject swmp_GateType;
#endif
