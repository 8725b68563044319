/* Native tcp data server (server.c), registered by module.c. */
#ifndef PC_SERVER_H
#define PC_SERVER_H
#include <Python.h>

extern PyTypeObject pc_RegionTableType;

#endif
