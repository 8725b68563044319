/* tcp data server, one connection per call: range reads served without the GIL.
 *
 * Same wire format and checks as the Python server in
 * peercache/transport/tcp.py: each op must name an exposed region with its
 * key and lie inside it; anything else gets an error status and the server
 * keeps serving. Only a lost framing (bad magic, too many ops) ends the
 * connection, after a refusal that says why.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "pc.h"
#include "server.h"

#define HEAD_BYTES 20
#define WIRE_OP_BYTES 32
#define MAX_OPS (1u << 16)
#define MAX_REPLY_BYTES (1ull << 31)
#define SEND_IOV 1024

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    uint32_t ids[PC_SHM_MAX_REGIONS];
    uint64_t rkeys[PC_SHM_MAX_REGIONS];
    Py_buffer views[PC_SHM_MAX_REGIONS];
    atomic_ullong refused;
} RegionTableObject;

static void RegionTable_dealloc(RegionTableObject *self) {
    for (Py_ssize_t i = 0; i < self->n; i++) PyBuffer_Release(&self->views[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RegionTable_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    PyObject *regions;
    if (!PyArg_ParseTuple(args, "O", &regions)) return NULL;
    PyObject *seq = PySequence_Fast(regions, "regions must be a sequence of (id, rkey, buffer)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PC_SHM_MAX_REGIONS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "%zd regions exceed the %d a server may expose", n,
                            PC_SHM_MAX_REGIONS);
    }
    RegionTableObject *self = (RegionTableObject *)t->tp_alloc(t, 0);
    if (!self) { Py_DECREF(seq); return NULL; }
    atomic_init(&self->refused, 0);
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
        self->ids[i] = id;
        self->rkeys[i] = rkey;
        self->n = i + 1;
    }
    Py_DECREF(seq);
    return (PyObject *)self;
}

static PyObject *RegionTable_get_refused(RegionTableObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->refused));
}

static PyGetSetDef RegionTable_getset[] = {
    {"refused", (getter)RegionTable_get_refused, NULL, "Ops refused so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pc_RegionTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._native.RegionTable",
    .tp_basicsize = sizeof(RegionTableObject),
    .tp_dealloc = (destructor)RegionTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RegionTable([(id, rkey, buffer), ...]): what a native data server may serve.",
    .tp_new = RegionTable_new,
    .tp_getset = RegionTable_getset,
};

static int recv_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    while (len) {
        ssize_t k = recv(fd, p, len, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int send_iov(int fd, struct iovec *iov, size_t cnt) {
    while (cnt) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = cnt > SEND_IOV ? SEND_IOV : cnt};
        ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        size_t sent = (size_t)k;
        while (cnt && sent >= iov->iov_len) {
            sent -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt) {
            iov->iov_base = (uint8_t *)iov->iov_base + sent;
            iov->iov_len -= sent;
        }
    }
    return 0;
}

/* Called without the GIL: PyGILState takes it for this thread just for the call. */
static void log_refusal(PyObject *log, const char *msg);

/* Send a refusal; the caller decides whether the connection goes on. */
static int refuse(int fd, uint64_t req_id, const char *reason) {
    uint8_t head[HEAD_BYTES + 4];
    uint32_t code = 1, zero = 0, len = (uint32_t)strlen(reason);
    memcpy(head, "PCRS", 4);
    memcpy(head + 4, &code, 4);
    memcpy(head + 8, &zero, 4);
    memcpy(head + 12, &req_id, 8);
    memcpy(head + 20, &len, 4);
    struct iovec iov[2] = {{head, sizeof head}, {(void *)reason, len}};
    return send_iov(fd, iov, 2);
}

static void log_refusal(PyObject *log, const char *msg) {
    if (log == Py_None) return;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(log, "s", msg);
    if (!r) PyErr_Clear();  /* logging must never end serving */
    Py_XDECREF(r);
    PyGILState_Release(g);
}

PyObject *pc_serve_connection(PyObject *mod, PyObject *args) {
    (void)mod;
    int fd;
    PyObject *table_o, *log;
    if (!PyArg_ParseTuple(args, "iO!O", &fd, &pc_RegionTableType, &table_o, &log)) return NULL;
    RegionTableObject *t = (RegionTableObject *)table_o;
    size_t cap = 0;
    uint8_t *wire = NULL;
    int32_t *status = NULL;
    struct iovec *iov = NULL;
    uint64_t served = 0;
    char why[256];
    Py_INCREF(t);
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        uint8_t head[HEAD_BYTES];
        if (recv_all(fd, head, HEAD_BYTES) < 0) break;
        uint32_t n;
        uint64_t req_id;
        memcpy(&n, head + 8, 4);
        memcpy(&req_id, head + 12, 8);
        if (memcmp(head, "PCRQ", 4) != 0) {
            snprintf(why, sizeof why, "bad request magic %.4s; not a PeerCache client?", (const char *)head);
            refuse(fd, req_id, why);
            atomic_fetch_add(&t->refused, 1);
            log_refusal(log, why);
            break;
        }
        if (n > MAX_OPS) {
            snprintf(why, sizeof why, "%u ops in one request exceeds %u; split the batch", n, MAX_OPS);
            refuse(fd, req_id, why);
            atomic_fetch_add(&t->refused, 1);
            log_refusal(log, why);
            break;
        }
        if (n > cap) {
            size_t c = n < 256 ? 256 : n;
            uint8_t *w = realloc(wire, c * WIRE_OP_BYTES);
            if (w) wire = w;
            int32_t *s = realloc(status, c * 4);
            if (s) status = s;
            struct iovec *v = realloc(iov, (c + 2) * sizeof *iov);
            if (v) iov = v;
            if (!w || !s || !v) break;
            cap = c;
        }
        if (n && recv_all(fd, wire, (size_t)n * WIRE_OP_BYTES) < 0) break;
        size_t k = 2, bad = 0;
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *w = wire + (size_t)i * WIRE_OP_BYTES;
            uint32_t region;
            uint64_t rkey, off, len;
            memcpy(&region, w, 4);
            memcpy(&rkey, w + 8, 8);
            memcpy(&off, w + 16, 8);
            memcpy(&len, w + 24, 8);
            Py_ssize_t r = 0;
            while (r < t->n && t->ids[r] != region) r++;
            if (r == t->n || t->rkeys[r] != rkey) { status[i] = PC_BAD_REGION; bad++; continue; }
            uint64_t size = (uint64_t)t->views[r].len;
            if (len == 0) { status[i] = PC_ZERO_LENGTH; bad++; continue; }
            if (off > size || len > size - off) { status[i] = PC_OUT_OF_RANGE; bad++; continue; }
            status[i] = PC_OK;
            iov[k].iov_base = (uint8_t *)t->views[r].buf + off;
            iov[k].iov_len = len;
            total += len;
            k++;
        }
        if (bad) {
            atomic_fetch_add(&t->refused, bad);
            snprintf(why, sizeof why, "tcp data server refused %zu of %u ops (bad region/key, zero "
                     "length or out of range)", bad, n);
            log_refusal(log, why);
        }
        if (total > MAX_REPLY_BYTES) {
            snprintf(why, sizeof why, "request asks for %llu bytes, more than %llu; split the batch",
                     (unsigned long long)total, MAX_REPLY_BYTES);
            if (refuse(fd, req_id, why) < 0) break;
            atomic_fetch_add(&t->refused, 1);
            log_refusal(log, why);
            continue;
        }
        uint8_t rhead[HEAD_BYTES];
        uint32_t zero = 0;
        memcpy(rhead, "PCRS", 4);
        memcpy(rhead + 4, &zero, 4);
        memcpy(rhead + 8, &n, 4);
        memcpy(rhead + 12, &req_id, 8);
        iov[0].iov_base = rhead;
        iov[0].iov_len = HEAD_BYTES;
        iov[1].iov_base = status;
        iov[1].iov_len = (size_t)n * 4;
        if (send_iov(fd, iov, k) < 0) break;
        served++;
    }
    Py_END_ALLOW_THREADS
    free(wire);
    free(status);
    free(iov);
    Py_DECREF(t);
    return PyLong_FromUnsignedLongLong(served);
}
