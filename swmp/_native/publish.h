/* swmp._spancore.AmqpPublish (publish.c), registered by the module in spancore.c. */
#ifndef SWMP_PUBLISH_H
#define SWMP_PUBLISH_H
#include <Python.h>
extern PyTypeObject swmp_AmqpPublishType;
#endif
