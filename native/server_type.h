/* peercache._native.RegionTable (server_type.c): the Python type of the native tcp data
 * server (server.c), registered by module.c. */
#ifndef PC_SERVER_TYPE_H
#define PC_SERVER_TYPE_H
#include <Python.h>

extern PyTypeObject pc_RegionTableType;

#endif
