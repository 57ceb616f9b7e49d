/* swmp._spancore.KafkaSend (kafka_send.c), registered by the module in spancore.c. */
#ifndef SWMP_KAFKA_SEND_H
#define SWMP_KAFKA_SEND_H
#include <Python.h>
extern PyTypeObject swmp_KafkaSendType;
#endif
