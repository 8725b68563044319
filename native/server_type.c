/* peercache._native.RegionTable: the Python type of the native tcp data server.
 *
 * A RegionTable holds what the server may serve (views of the exposed
 * buffers, kept for its lifetime) and the state its workers share (a
 * pc_srv_table); serve() parses and checks a worker's arguments and runs the
 * epoll loop of server.c without the GIL; stats() reads the counters. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <string.h>

#include "pc.h"
#include "server.h"
#include "server_type.h"

typedef struct {
    PyObject_HEAD
    Py_buffer views[PC_SHM_MAX_REGIONS];   /* of t.bufs: held until dealloc */
    pc_srv_table t;
} RegionTableObject;

static void RegionTable_dealloc(RegionTableObject *self) {
    for (size_t i = 0; i < self->t.n; i++) PyBuffer_Release(&self->views[i]);
    pc_srv_table_free(&self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RegionTable_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *regions, *key = Py_None;
    (void)kw;
    if (!PyArg_ParseTuple(args, "O|O", &regions, &key)) return NULL;
    if (key != Py_None && (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != PC_SRV_KEY_BYTES))
        return PyErr_Format(PyExc_ValueError, "the data key must be None or %d bytes", PC_SRV_KEY_BYTES);
    PyObject *seq = PySequence_Fast(regions, "regions must be a sequence of (id, rkey, buffer)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PC_SHM_MAX_REGIONS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "%zd regions exceed the %d a server may expose", n,
                            PC_SHM_MAX_REGIONS);
    }
    RegionTableObject *self = (RegionTableObject *)type->tp_alloc(type, 0);
    if (!self) { Py_DECREF(seq); return NULL; }
    pc_srv_table *t = &self->t;
    pc_srv_table_init(t);
    if (key != Py_None) {
        t->has_key = 1;
        memcpy(t->key, PyBytes_AS_STRING(key), PC_SRV_KEY_BYTES);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned int id;
        unsigned long long rkey;
        PyObject *buf;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IKO", &id, &rkey, &buf) ||
            PyObject_GetBuffer(buf, &self->views[i], PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        t->ids[i] = id;
        t->rkeys[i] = rkey;
        t->bufs[i] = self->views[i].buf;
        t->lens[i] = (uint64_t)self->views[i].len;
        t->n = (size_t)i + 1;
    }
    Py_DECREF(seq);
    return (PyObject *)self;
}

static PyObject *RegionTable_get_refused(RegionTableObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->t.refused));
}

static PyObject *RegionTable_get_connections(RegionTableObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(atomic_load(&self->t.nconns));
}

/* RegionTable.serve(listen_fd, stop_fd, max_connections, idle_timeout, request_timeout,
 *                   hello_timeout, max_greeting, max_greeting_per_source, reply_memory, send_buffer[, poll_us]) */
static PyObject *RegionTable_serve(RegionTableObject *self, PyObject *args) {
    pc_srv_config c;
    int poll_us = 0;
    if (!PyArg_ParseTuple(args, "iildddllLi|i", &c.listen_fd, &c.stop_fd, &c.max_conns, &c.idle_s,
                          &c.request_s, &c.hello_s, &c.max_greet, &c.max_greet_src, &c.mem_cap, &c.sndbuf,
                          &poll_us))
        return NULL;
    if (c.max_conns < 1 || !(c.idle_s > 0) || !(c.request_s > 0) || !(c.hello_s > 0) || c.max_greet < 1 ||
        c.max_greet_src < 1 || c.mem_cap < 1 || c.sndbuf < 0 || poll_us < 0 || poll_us > 1000000)
        return PyErr_Format(PyExc_ValueError, "max_connections, idle_timeout, request_timeout, hello_timeout, "
                            "max_greeting, max_greeting_per_source and reply_memory must be positive, "
                            "send_buffer not negative, poll_us 0 to 1000000");
    c.poll_s = poll_us * 1e-6;
    int rc;
    Py_INCREF(self);
    Py_BEGIN_ALLOW_THREADS
    rc = pc_srv_serve(&self->t, &c);
    Py_END_ALLOW_THREADS
    if (rc < 0) PyErr_SetFromErrno(PyExc_OSError);
    Py_DECREF(self);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *RegionTable_stats(RegionTableObject *self, PyObject *unused) {
    (void)unused;
    pc_srv_table *t = &self->t;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < PC_SRV_N_STATS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(atomic_load(&t->stats[i]));
        if (!v || PyDict_SetItemString(d, pc_srv_stat_names[i], v) < 0) { Py_XDECREF(v); Py_DECREF(d); return NULL; }
        Py_DECREF(v);
    }
    struct { const char *name; PyObject *v; } more[] = {
        {"connections", PyLong_FromLong(atomic_load(&t->nconns))},
        {"serving", PyLong_FromLong(atomic_load(&t->nserving))},
        {"greeting", PyLong_FromLong(atomic_load(&t->ngreeting))},
        {"reply_memory", PyLong_FromLongLong(atomic_load(&t->reserved))},
        {"accept_errno", PyLong_FromLong(atomic_load(&t->accept_errno))},
        {"accept_failing", PyBool_FromLong(atomic_load(&t->accept_failing))},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        bad |= !more[i].v || PyDict_SetItemString(d, more[i].name, more[i].v) < 0;
        Py_XDECREF(more[i].v);
    }
    if (bad) { Py_DECREF(d); return NULL; }
    /* each serving worker's connections (the hand-off keeps them within one of each other) */
    PyObject *per = PyList_New(0);
    if (!per) { Py_DECREF(d); return NULL; }
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < PC_SRV_MAX_WORKERS && !bad; i++) {
        if (t->handoff_w[i] < 0) continue;
        PyObject *v = PyLong_FromLong(atomic_load(&t->worker_conns[i]));
        bad |= !v || PyList_Append(per, v) < 0;
        Py_XDECREF(v);
    }
    pthread_mutex_unlock(&t->mu);
    if (bad || PyDict_SetItemString(d, "worker_connections", per) < 0) { Py_DECREF(per); Py_DECREF(d); return NULL; }
    Py_DECREF(per);
    return d;
}

static PyMethodDef RegionTable_methods[] = {
    {"serve", (PyCFunction)RegionTable_serve, METH_VARARGS,
     "serve(listen_fd, stop_fd, max_connections, idle_timeout, request_timeout, hello_timeout, "
     "max_greeting, max_greeting_per_source, reply_memory, send_buffer[, poll_us]): one worker of the data "
     "server (poll_us: after serving, poll this long for the next request before sleeping; 0, the "
     "default, sleeps at once); accepts on the non-blocking listen_fd (shared by all workers) and serves its "
     "connections without the GIL until stop_fd becomes readable, then closes them. max_greeting "
     "and max_greeting_per_source are this worker's; max_connections and reply_memory are the "
     "table's (all workers)."},
    {"stats", (PyCFunction)RegionTable_stats, METH_NOARGS,
     "stats() -> dict of the counters of every worker of this table (accepted, served, refusals "
     "by kind, connections closed idle or slow, accept errors) and its state now (connections "
     "open, serving and greeting, reply memory taken, accept failing)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef RegionTable_getset[] = {
    {"refused", (getter)RegionTable_get_refused, NULL, "Ops and requests refused so far.", NULL},
    {"connections", (getter)RegionTable_get_connections, NULL, "Connections open now.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pc_RegionTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._native.RegionTable",
    .tp_basicsize = sizeof(RegionTableObject),
    .tp_dealloc = (destructor)RegionTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RegionTable([(id, rkey, buffer), ...], key=None): what a native data server may serve, "
              "and the 32-byte data key its connections' handshake proves (None: no handshake).",
    .tp_new = RegionTable_new,
    .tp_methods = RegionTable_methods,
    .tp_getset = RegionTable_getset,
};
