/* peercache._verbs: Python bindings of the verbs backend (rails, channels, the planner).
 *
 * Built only where rdma-core's headers exist. Connections are handed to
 * peercache._native as a capsule (PC_HANDOFF_CAPSULE), so the one batch path
 * of _native (read_slots) drives them like the shm and tcp backends.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "verbs.h"

#define ERRLEN 512

/* -------------------------------------------------------------------- Rail */

typedef struct {
    PyObject_HEAD
    pv_rail *r;
    PyObject *held;   /* addr -> capsule holding the Py_buffer of a registered buffer */
} RailObject;

static PyTypeObject RailType;

static void release_view(PyObject *cap) {
    Py_buffer *v = PyCapsule_GetPointer(cap, "peercache.verbs.view");
    if (v) { PyBuffer_Release(v); PyMem_Free(v); }
}

static int Rail_init(RailObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "port", "gid_index", "numa", NULL};
    const char *name;
    int port = 1, gid = -1, numa = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|iii", kwlist, &name, &port, &gid, &numa)) return -1;
    char err[ERRLEN] = "";
    pv_rail *r;
    Py_BEGIN_ALLOW_THREADS
    r = pv_rail_open(name, port, gid, numa, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (!r) { PyErr_SetString(PyExc_OSError, err); return -1; }
    self->r = r;
    self->held = PyDict_New();
    return self->held ? 0 : -1;
}

static void Rail_dealloc(RailObject *self) {
    /* Deregister here: a connection still holding the rail then fails with a local
     * protection error instead of writing into memory Python may have freed. */
    if (self->r && self->held) {
        PyObject *k, *val;
        Py_ssize_t pos = 0;
        while (PyDict_Next(self->held, &pos, &k, &val))
            pv_rail_deregister(self->r, PyLong_AsUnsignedLongLong(k));
    }
    Py_XDECREF(self->held);
    if (self->r) pv_rail_unref(self->r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Rail_info(RailObject *self, PyObject *unused) {
    (void)unused;
    pv_rail *r = self->r;
    /* The port as it is now (Soft-RoCE's MTU follows the netdev); the cached one if that fails. */
    struct ibv_port_attr pa = r->pattr;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ibv_query_port(r->ctx, (uint8_t)r->port, &pa);
    Py_END_ALLOW_THREADS
    if (rc != 0) pa = r->pattr;
    return Py_BuildValue(
        "{s:s,s:i,s:i,s:i,s:y#,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I,s:O,s:K}",
        "name", r->name, "port", r->port, "gid_index", r->gid_index, "numa", (int)r->numa,
        "gid", (const char *)r->gid.raw, (Py_ssize_t)16, "lid", (int)pa.lid,
        "mtu", (int)pa.active_mtu, "link_layer", (int)pa.link_layer,
        "state", (int)pa.state, "max_qp_rd_atom", r->dev.max_qp_rd_atom,
        "max_qp_init_rd_atom", r->dev.max_qp_init_rd_atom, "max_qp_wr", r->dev.max_qp_wr,
        "max_sge", r->dev.max_sge, "max_cqe", r->dev.max_cqe, "max_mr_size", (int)(r->dev.max_mr_size > 0x7fffffff ? 0x7fffffff : r->dev.max_mr_size),
        "vendor_id", (unsigned)r->dev.vendor_id, "soft_roce", r->soft_roce ? Py_True : Py_False,
        "doorbell_kicks", (unsigned long long)atomic_load(&r->kicks));
}

static PyObject *Rail_register(RailObject *self, PyObject *args) {
    PyObject *obj;
    int numa = -1;
    if (!PyArg_ParseTuple(args, "O|i", &obj, &numa)) return NULL;
    Py_buffer *v = PyMem_Calloc(1, sizeof *v);
    if (!v) return PyErr_NoMemory();
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) { PyMem_Free(v); return NULL; }
    if (v->len == 0) {
        PyBuffer_Release(v); PyMem_Free(v);
        return PyErr_Format(PyExc_ValueError, "cannot register an empty buffer");
    }
    char err[ERRLEN] = "";
    struct ibv_mr *mr;
    Py_BEGIN_ALLOW_THREADS
    mr = pv_rail_register(self->r, v->buf, (uint64_t)v->len, numa, -1, 0, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (!mr) { PyBuffer_Release(v); PyMem_Free(v); PyErr_SetString(PyExc_OSError, err); return NULL; }
    PyObject *cap = PyCapsule_New(v, "peercache.verbs.view", release_view);
    PyObject *key = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)v->buf);
    if (!cap || !key || PyDict_SetItem(self->held, key, cap) < 0) {
        Py_XDECREF(cap); Py_XDECREF(key);
        return NULL;
    }
    Py_DECREF(cap);
    Py_DECREF(key);
    int32_t nnuma = -1;
    pv_rail_lookup(self->r, (uint64_t)(uintptr_t)v->buf, 1, NULL, &nnuma);
    return Py_BuildValue("(KIIi)", (unsigned long long)(uintptr_t)v->buf, mr->lkey, mr->rkey, (int)nnuma);
}

static PyObject *Rail_register_device(RailObject *self, PyObject *args) {
    unsigned long long addr, length, offset = 0;
    int fd = -1, numa = -1;
    if (!PyArg_ParseTuple(args, "KK|iKi", &addr, &length, &fd, &offset, &numa)) return NULL;
    char err[ERRLEN] = "";
    struct ibv_mr *mr;
    Py_BEGIN_ALLOW_THREADS
    mr = pv_rail_register(self->r, (void *)(uintptr_t)addr, length, numa, fd, offset, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (!mr) { PyErr_SetString(PyExc_OSError, err); return NULL; }
    PyObject *key = PyLong_FromUnsignedLongLong(addr);
    if (!key || PyDict_SetItem(self->held, key, Py_None) < 0) { Py_XDECREF(key); return NULL; }
    Py_DECREF(key);
    return Py_BuildValue("(KIIi)", addr, mr->lkey, mr->rkey, numa);
}

static PyObject *Rail_deregister(RailObject *self, PyObject *arg) {
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int found = pv_rail_deregister(self->r, addr);
    if (PyDict_DelItem(self->held, arg) < 0) PyErr_Clear();
    return PyBool_FromLong(found);
}

static PyObject *Rail_stats(RailObject *self, PyObject *unused) {
    (void)unused;
    pv_rail *r = self->r;
    pv_counters *n = &r->n;
    PyObject *wc = PyDict_New();
    if (!wc) return NULL;
    for (int i = 0; i < PV_WC_CODES; i++) {
        uint64_t v = atomic_load_explicit(&n->wc[i], memory_order_relaxed);
        if (!v) continue;
        PyObject *k = PyLong_FromLong(i), *x = PyLong_FromUnsignedLongLong(v);
        if (!k || !x || PyDict_SetItem(wc, k, x) < 0) { Py_XDECREF(k); Py_XDECREF(x); Py_DECREF(wc); return NULL; }
        Py_DECREF(k);
        Py_DECREF(x);
    }
    char why[sizeof r->why];
    pthread_mutex_lock(&r->smu);
    int st = atomic_load(&r->state);
    memcpy(why, r->why, sizeof why);
    pthread_mutex_unlock(&r->smu);
    static const char *names[] = {"up", "down", "probe"};
    return Py_BuildValue("{s:s,s:s,s:s,s:K,s:K,s:N,s:K,s:K,s:K,s:i}", "name", r->name,
                         "state", names[st >= 0 && st <= 2 ? st : 1], "why", why,
                         "bytes_read", (unsigned long long)atomic_load(&n->bytes),
                         "reads", (unsigned long long)atomic_load(&n->reads), "wc_errors", wc,
                         "qp_resets", (unsigned long long)atomic_load(&n->qp_resets),
                         "downs", (unsigned long long)atomic_load(&n->downs),
                         "ups", (unsigned long long)atomic_load(&n->ups),
                         "readers", atomic_load(&r->readers));
}

static PyObject *Rail_outstanding(RailObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong((unsigned long long)atomic_load(&self->r->outstanding));
}

static PyMethodDef Rail_methods[] = {
    {"info", (PyCFunction)Rail_info, METH_NOARGS, "Port, GID, MTU and device limits as a dict."},
    {"stats", (PyCFunction)Rail_stats, METH_NOARGS,
     "Counters since the rail was opened and its state: name, state ('up', 'down', 'probe': port ACTIVE "
     "again, waiting for a probe read), why (it went down), bytes_read and reads (READs completed), "
     "wc_errors ({ibv_wc_status: error completions}), qp_resets, downs, ups, readers."},
    {"register", (PyCFunction)Rail_register, METH_VARARGS,
     "register(buffer, numa=-1) -> (addr, lkey, rkey, numa); remote-readable, held until deregister."},
    {"register_device", (PyCFunction)Rail_register_device, METH_VARARGS,
     "register_device(addr, length, dmabuf_fd=-1, dmabuf_offset=0, numa=-1) -> (addr, lkey, rkey, numa); "
     "GPU memory by dma-buf (fd >= 0) or by address (nvidia-peermem)."},
    {"deregister", (PyCFunction)Rail_deregister, METH_O, "deregister(addr) -> whether it was registered."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Rail_getset[] = {
    {"outstanding", (getter)Rail_outstanding, NULL, "Bytes of READs in flight on this rail.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RailType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._verbs.Rail",
    .tp_basicsize = sizeof(RailObject),
    .tp_dealloc = (destructor)Rail_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rail(name, port=1, gid_index=-1, numa=-1): one RDMA device port with its PD and MRs.",
    .tp_methods = Rail_methods,
    .tp_getset = Rail_getset,
    .tp_init = (initproc)Rail_init,
    .tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------------- Channels */

typedef struct {
    PyObject_HEAD
    pv_conn *c;
} ChannelsObject;

static void Channels_dealloc(ChannelsObject *self) {
    if (self->c) pv_conn_close(self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Channels_init(ChannelsObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"rails", "channels", "sq_depth", "timeout_s", NULL};
    PyObject *rails_o;
    unsigned int nchan = 1, depth = 256;
    double timeout = 0;   /* no default here: the bound is peercache.timeouts' rdma_completion_s */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|IId", kwlist, &rails_o, &nchan, &depth, &timeout)) return -1;
    if (!(timeout > 0)) {
        char got[32];
        snprintf(got, sizeof got, "%g", timeout);   /* PyErr_Format has no %g */
        PyErr_Format(PyExc_ValueError, "timeout_s must be a positive number of seconds, got %s; pass "
                     "peercache.timeouts.DEFAULT.rdma_completion_s or the node's own", got);
        return -1;
    }
    PyObject *seq = PySequence_Fast(rails_o, "rails must be a sequence of Rail");
    if (!seq) return -1;
    Py_ssize_t nr = PySequence_Fast_GET_SIZE(seq);
    pv_rail *rails[PV_MAX_RAILS];
    if (nr < 1 || nr > PV_MAX_RAILS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "need 1..%d rails, got %zd", PV_MAX_RAILS, nr);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyObject_TypeCheck(o, &RailType) || !((RailObject *)o)->r) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "rails must be opened peercache._verbs.Rail objects");
            return -1;
        }
        rails[i] = ((RailObject *)o)->r;
    }
    char err[ERRLEN] = "";
    pv_conn *c;
    Py_BEGIN_ALLOW_THREADS
    c = pv_conn_new(rails, (size_t)nr, nchan, depth, timeout, err, sizeof err);
    Py_END_ALLOW_THREADS
    Py_DECREF(seq);
    if (!c) { PyErr_SetString(PyExc_OSError, err); return -1; }
    if (self->c) pv_conn_close(self->c);
    self->c = c;
    return 0;
}

static int need_conn(ChannelsObject *self) {
    if (self->c) return 0;
    PyErr_SetString(PyExc_ValueError, "these channels were handed off or closed");
    return -1;
}

/* A dict about channel k of rail r of c (a new reference), or NULL with an exception set. */
typedef PyObject *(*chan_info_fn)(pv_conn *c, size_t r, uint32_t k, pv_chan *ch);

/* [fn(rail, channel) for every rail, for every channel of it] of these channels. */
static PyObject *chan_list(ChannelsObject *self, chan_info_fn fn) {
    if (need_conn(self) < 0) return NULL;
    pv_conn *c = self->c;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (size_t r = 0; r < c->nrails; r++)
        for (uint32_t k = 0; k < c->nchan; k++) {
            PyObject *d = fn(c, r, k, &c->chans[r * c->nchan + k]);
            if (!d || PyList_Append(out, d) < 0) { Py_XDECREF(d); Py_DECREF(out); return NULL; }
            Py_DECREF(d);
        }
    return out;
}

static PyObject *chan_local_info(pv_conn *c, size_t r, uint32_t k, pv_chan *ch) {
    pv_rail *rl = c->rails[r];
    return Py_BuildValue("{s:n,s:I,s:I,s:I,s:y#,s:i,s:i,s:i}", "rail", (Py_ssize_t)r,
                         "channel", k, "qpn", ch->qp->qp_num, "psn", ch->psn, "gid",
                         (const char *)rl->gid.raw, (Py_ssize_t)16, "lid", (int)c->lid[r],
                         "mtu", c->mtu[r], "rd_atom", rl->dev.max_qp_rd_atom);
}

static PyObject *Channels_local_info(ChannelsObject *self, PyObject *unused) {
    (void)unused;
    return chan_list(self, chan_local_info);
}

static int dict_int(PyObject *d, const char *k, long long *out) {
    PyObject *v = PyDict_GetItemString(d, k);
    if (!v) { PyErr_Format(PyExc_KeyError, "remote QP info lacks %s", k); return -1; }
    *out = PyLong_AsLongLong(v);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *Channels_connect(ChannelsObject *self, PyObject *args) {
    PyObject *remote_o;
    unsigned int signal_every = 0, max_chain = 0;
    if (!PyArg_ParseTuple(args, "O|II", &remote_o, &signal_every, &max_chain)) return NULL;
    if (need_conn(self) < 0) return NULL;
    pv_conn *c = self->c;
    PyObject *seq = PySequence_Fast(remote_o, "remote must be a list of QP info dicts");
    if (!seq) return NULL;
    size_t want = c->nrails * c->nchan;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != want) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "the peer sent %zd QPs; %zu rails x %u channels need %zu",
                            PySequence_Fast_GET_SIZE(seq), c->nrails, c->nchan, want);
    }
    pv_remote_qp *rq = PyMem_Calloc(want, sizeof *rq);
    if (!rq) { Py_DECREF(seq); return PyErr_NoMemory(); }
    for (size_t i = 0; i < want; i++) {
        PyObject *d = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i);
        long long qpn, psn, lid, mtu, rd;
        PyObject *gid = PyDict_Check(d) ? PyDict_GetItemString(d, "gid") : NULL;
        if (!PyDict_Check(d) || dict_int(d, "qpn", &qpn) < 0 || dict_int(d, "psn", &psn) < 0 ||
            dict_int(d, "lid", &lid) < 0 || dict_int(d, "mtu", &mtu) < 0 || dict_int(d, "rd_atom", &rd) < 0 ||
            !gid || !PyBytes_Check(gid) || PyBytes_GET_SIZE(gid) != 16) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "remote QP info needs a 16-byte gid");
            PyMem_Free(rq);
            Py_DECREF(seq);
            return NULL;
        }
        rq[i] = (pv_remote_qp){(uint32_t)qpn, (uint32_t)psn, {0}, (uint16_t)lid, (int)mtu, (int)rd};
        memcpy(rq[i].gid, PyBytes_AS_STRING(gid), 16);
    }
    Py_DECREF(seq);
    char err[ERRLEN] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = pv_conn_connect(c, rq, signal_every, max_chain, err, sizeof err);
    Py_END_ALLOW_THREADS
    PyMem_Free(rq);
    if (rc != 0) { PyErr_SetString(PyExc_OSError, err); return NULL; }
    Py_RETURN_NONE;
}

static PyObject *Channels_set_regions(ChannelsObject *self, PyObject *arg) {
    if (need_conn(self) < 0) return NULL;
    pv_conn *c = self->c;
    PyObject *seq = PySequence_Fast(arg, "regions must be a list of (id, cap, size, [(addr, rkey), ...])");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > PC_SHM_MAX_REGIONS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "at most %d regions per peer", PC_SHM_MAX_REGIONS);
    }
    pv_region regs[PC_SHM_MAX_REGIONS];
    memset(regs, 0, sizeof regs);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned int id;
        unsigned long long cap, size;
        PyObject *per;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IKKO", &id, &cap, &size, &per)) {
            Py_DECREF(seq);
            return NULL;
        }
        PyObject *ps = PySequence_Fast(per, "per-rail keys must be a list of (addr, rkey)");
        if (!ps) { Py_DECREF(seq); return NULL; }
        if ((size_t)PySequence_Fast_GET_SIZE(ps) != c->nrails) {
            Py_ssize_t got = PySequence_Fast_GET_SIZE(ps);
            Py_DECREF(ps); Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "region %u has keys for %zd rails; this connection has %zu "
                                "(both sides need the same number of rails)", id, got, c->nrails);
        }
        regs[i].id = id;
        regs[i].cap = cap;
        regs[i].size = size;
        for (size_t r = 0; r < c->nrails; r++) {
            unsigned long long addr;
            unsigned int rkey;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(ps, (Py_ssize_t)r), "KI", &addr, &rkey)) {
                Py_DECREF(ps); Py_DECREF(seq);
                return NULL;
            }
            regs[i].addr[r] = addr;
            regs[i].rkey[r] = rkey;
        }
        Py_DECREF(ps);
    }
    Py_DECREF(seq);
    memcpy(c->regions, regs, sizeof regs);
    c->nregions = (size_t)n;
    Py_RETURN_NONE;
}

static PyObject *Channels_limits(ChannelsObject *self, PyObject *unused) {
    (void)unused;
    if (need_conn(self) < 0) return NULL;
    pv_limits *l = &self->c->lim;
    return Py_BuildValue("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "sq_depth", l->sq_depth, "max_rd_atom", l->max_rd_atom,
                         "max_sge", l->max_sge, "signal_every", l->signal_every, "max_chain", l->max_chain,
                         "cadence", pv_signal_cadence(l), "chain_length", pv_chain_length(l));
}

static PyObject *chan_qp_info(pv_conn *c, size_t r, uint32_t k, pv_chan *ch) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    memset(&a, 0, sizeof a);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ibv_query_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                      IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_TIMEOUT |
                      IBV_QP_RETRY_CNT | IBV_QP_CAP, &ia);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_Format(PyExc_OSError, "ibv_query_qp on %s: %s", c->rails[r]->name, strerror(rc));
    int bytes = a.path_mtu >= IBV_MTU_256 && a.path_mtu <= IBV_MTU_4096 ? 128 << a.path_mtu : 0;
    return Py_BuildValue(
        "{s:n,s:I,s:s,s:I,s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:I}", "rail", (Py_ssize_t)r, "channel", k,
        "device", c->rails[r]->name, "qpn", ch->qp->qp_num, "dest_qpn", a.dest_qp_num,
        "state", (int)a.qp_state, "path_mtu", (int)a.path_mtu, "path_mtu_bytes", bytes,
        "port_mtu", c->mtu[r], "max_rd_atomic", (int)a.max_rd_atomic,
        "max_dest_rd_atomic", (int)a.max_dest_rd_atomic, "timeout", (int)a.timeout,
        "max_send_wr", a.cap.max_send_wr);
}

static PyObject *Channels_qp_info(ChannelsObject *self, PyObject *unused) {
    (void)unused;
    return chan_list(self, chan_qp_info);
}

static void handoff_destroy(PyObject *cap) {
    pc_handoff *h = PyCapsule_GetPointer(cap, PC_HANDOFF_CAPSULE);
    if (!h) { PyErr_Clear(); return; }
    if (h->conn) h->be->close(h->conn);   /* never adopted */
    PyMem_Free(h);
}

static PyObject *Channels_handoff(ChannelsObject *self, PyObject *unused) {
    (void)unused;
    if (need_conn(self) < 0) return NULL;
    pc_handoff *h = PyMem_Malloc(sizeof *h);
    if (!h) return PyErr_NoMemory();
    h->be = &pc_verbs_backend;
    h->conn = self->c;
    pv_conn_reader(self->c);
    PyObject *cap = PyCapsule_New(h, PC_HANDOFF_CAPSULE, handoff_destroy);
    if (!cap) { PyMem_Free(h); return NULL; }
    self->c = NULL;
    return cap;
}

static PyObject *Channels_close(ChannelsObject *self, PyObject *unused) {
    (void)unused;
    if (self->c) { pv_conn_close(self->c); self->c = NULL; }
    Py_RETURN_NONE;
}

static PyMethodDef Channels_methods[] = {
    {"local_info", (PyCFunction)Channels_local_info, METH_NOARGS,
     "QP number, PSN, GID, LID, MTU and responder READ limit of every (rail, channel)."},
    {"connect", (PyCFunction)Channels_connect, METH_VARARGS,
     "connect(remote_infos, signal_every=0, max_chain=0): INIT -> RTR -> RTS against the peer's QPs."},
    {"set_regions", (PyCFunction)Channels_set_regions, METH_O,
     "set_regions([(id, cap, size, [(addr, rkey) per rail]), ...]): what the peer exposes."},
    {"limits", (PyCFunction)Channels_limits, METH_NOARGS, "Queue limits, cadence and chain length in use."},
    {"qp_info", (PyCFunction)Channels_qp_info, METH_NOARGS,
     "ibv_query_qp of every (rail, channel): state, path MTU (enum and bytes), the port MTU the connection "
     "was made with, READ limits as requester (max_rd_atomic) and responder (max_dest_rd_atomic)."},
    {"handoff", (PyCFunction)Channels_handoff, METH_NOARGS,
     "A capsule for peercache._native.adopt(); these channels are then owned by the Peer."},
    {"close", (PyCFunction)Channels_close, METH_NOARGS, "Destroy the QPs now."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ChannelsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._verbs.Channels",
    .tp_basicsize = sizeof(ChannelsObject),
    .tp_dealloc = (destructor)Channels_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Channels(rails, channels=1, sq_depth=256, timeout_s): RC QPs per rail and channel; timeout_s: the completion bound (peercache.timeouts).",
    .tp_methods = Channels_methods,
    .tp_init = (initproc)Channels_init,
    .tp_new = PyType_GenericNew,
};

/* --------------------------------------------------------- module functions */

static int int_list(PyObject *o, int32_t *out, size_t n, const char *what) {
    PyObject *seq = PySequence_Fast(o, what);
    if (!seq) return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: expected %zu items", what, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) out[i] = (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i));
    Py_DECREF(seq);
    return PyErr_Occurred() ? -1 : 0;
}

/* The ops array (OP_DTYPE, C-contiguous) as a buffer view and its op count; -1 with the error set. */
static int ops_buffer(PyObject *ops_o, Py_buffer *ov, size_t *n) {
    if (PyObject_GetBuffer(ops_o, ov, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (ov->len % (Py_ssize_t)sizeof(pc_op)) {
        PyBuffer_Release(ov);
        PyErr_Format(PyExc_ValueError, "ops must be an OP_DTYPE array");
        return -1;
    }
    *n = (size_t)ov->len / sizeof(pc_op);
    return 0;
}

static PyObject *py_plan(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *ops_o, *lnuma_o, *rnuma_o, *load_o, *up_o = Py_None;
    pv_limits lim;
    unsigned int channels;
    if (!PyArg_ParseTuple(args, "OOOO(IIIII)I|O", &ops_o, &lnuma_o, &rnuma_o, &load_o, &lim.sq_depth,
                          &lim.max_rd_atom, &lim.max_sge, &lim.signal_every, &lim.max_chain, &channels, &up_o))
        return NULL;
    Py_buffer ov;
    size_t n;
    if (ops_buffer(ops_o, &ov, &n) < 0) return NULL;
    Py_ssize_t nl = PySequence_Size(lnuma_o), nr = PySequence_Size(rnuma_o);
    if (nl < 0 || nr < 1 || nr > PV_MAX_RAILS) {
        PyBuffer_Release(&ov);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "need 1..16 rails");
        return NULL;
    }
    int32_t lnuma[64], rnuma[PV_MAX_RAILS], loadi[PV_MAX_RAILS], upi[PV_MAX_RAILS];
    uint64_t load[PV_MAX_RAILS];
    uint8_t up[PV_MAX_RAILS];
    if (nl > 64 || int_list(lnuma_o, lnuma, (size_t)nl, "local_numa") < 0 ||
        int_list(rnuma_o, rnuma, (size_t)nr, "rail_numa") < 0 || int_list(load_o, loadi, (size_t)nr, "load") < 0 ||
        (up_o != Py_None && int_list(up_o, upi, (size_t)nr, "up") < 0)) {
        PyBuffer_Release(&ov);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "at most 64 local buffers");
        return NULL;
    }
    for (Py_ssize_t r = 0; r < nr; r++) {
        load[r] = (uint64_t)loadi[r];
        up[r] = up_o == Py_None || upi[r] != 0;
    }
    pv_wr *wrs = PyMem_Malloc((n ? n : 1) * sizeof *wrs);
    int32_t *refused = PyMem_Malloc((n ? n : 1) * sizeof *refused);
    size_t nw = 0;
    if (!wrs || !refused ||
        pv_plan(ov.buf, n, lnuma, (size_t)nl, rnuma, load, up, (size_t)nr, &lim, channels, wrs, &nw, refused) != 0) {
        PyMem_Free(wrs); PyMem_Free(refused); PyBuffer_Release(&ov);
        return PyErr_NoMemory();
    }
    PyBuffer_Release(&ov);
    PyObject *wl = PyList_New((Py_ssize_t)nw), *rl = PyList_New((Py_ssize_t)n), *ll = PyList_New(nr);
    for (size_t w = 0; wl && w < nw; w++) {
        PyObject *opsl = PyTuple_New(wrs[w].nsge);
        for (uint32_t s = 0; opsl && s < wrs[w].nsge; s++) PyTuple_SET_ITEM(opsl, s, PyLong_FromUnsignedLong(wrs[w].op[s]));
        PyList_SET_ITEM(wl, (Py_ssize_t)w, Py_BuildValue("(IIIKKIINI)", wrs[w].rail, wrs[w].channel, wrs[w].region,
                                                         (unsigned long long)wrs[w].remote_offset,
                                                         (unsigned long long)wrs[w].length, wrs[w].signaled,
                                                         wrs[w].chain, opsl, wrs[w].fence));
    }
    for (size_t i = 0; rl && i < n; i++) PyList_SET_ITEM(rl, (Py_ssize_t)i, PyLong_FromLong(refused[i]));
    for (Py_ssize_t r = 0; ll && r < nr; r++) PyList_SET_ITEM(ll, r, PyLong_FromUnsignedLongLong(load[r]));
    PyMem_Free(wrs);
    PyMem_Free(refused);
    if (!wl || !rl || !ll) { Py_XDECREF(wl); Py_XDECREF(rl); Py_XDECREF(ll); return NULL; }
    return Py_BuildValue("(NNN)", wl, rl, ll);
}

static PyObject *py_units(PyObject *mod, PyObject *ops_o) {
    (void)mod;
    Py_buffer ov;
    size_t n;
    if (ops_buffer(ops_o, &ov, &n) < 0) return NULL;
    uint32_t *u = PyMem_Malloc((n ? n : 1) * sizeof *u);
    if (!u) { PyBuffer_Release(&ov); return PyErr_NoMemory(); }
    pv_units(ov.buf, n, u);
    PyBuffer_Release(&ov);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) PyList_SET_ITEM(l, (Py_ssize_t)i, PyLong_FromUnsignedLong(u[i]));
    PyMem_Free(u);
    return l;
}

static PyObject *py_wc_statuses(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    PyObject *l = PyList_New(IBV_WC_GENERAL_ERR + 1);
    for (int i = 0; l && i <= IBV_WC_GENERAL_ERR; i++) PyList_SET_ITEM(l, i, PyLong_FromLong(pv_wc_status(i)));
    return l;
}

static PyObject *py_limits(PyObject *mod, PyObject *args) {
    (void)mod;
    pv_limits l;
    if (!PyArg_ParseTuple(args, "IIIII", &l.sq_depth, &l.max_rd_atom, &l.max_sge, &l.signal_every, &l.max_chain))
        return NULL;
    return Py_BuildValue("(II)", pv_signal_cadence(&l), pv_chain_length(&l));
}

static PyObject *py_devices(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    int num = 0;
    errno = 0;
    struct ibv_device **list;
    Py_BEGIN_ALLOW_THREADS
    list = ibv_get_device_list(&num);
    Py_END_ALLOW_THREADS
    int e = errno;
    PyObject *names = PyList_New(0);
    if (!names) { if (list) ibv_free_device_list(list); return NULL; }
    for (int i = 0; list && i < num; i++) {
        PyObject *s = PyUnicode_FromString(ibv_get_device_name(list[i]));
        if (!s || PyList_Append(names, s) < 0) { Py_XDECREF(s); Py_DECREF(names); ibv_free_device_list(list); return NULL; }
        Py_DECREF(s);
    }
    if (list) ibv_free_device_list(list);
    return Py_BuildValue("(Ns)", names, list ? "" : strerror(e));
}

static PyMethodDef module_methods[] = {
    {"plan", py_plan, METH_VARARGS,
     "plan(ops, local_numa, rail_numa, load, (sq_depth, max_rd_atom, max_sge, signal_every, max_chain), "
     "channels, up=None) -> (wrs, refused, load): the native planner (up: whether each rail may carry reads; "
     "None: all), for tests against their oracle, tests/oracles/rdma_plan.py."},
    {"units", py_units, METH_O, "units(ops) -> [unit of each op]: the planner's grouping of ops that stay on one QP."},
    {"wc_statuses", py_wc_statuses, METH_NOARGS, "Per-op status of each ibv_wc_status 0..21."},
    {"limits", py_limits, METH_VARARGS, "limits(sq_depth, max_rd_atom, max_sge, signal_every, max_chain) -> (k, chain)."},
    {"devices", py_devices, METH_NOARGS, "devices() -> (names, error text when the list could not be read)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "peercache._verbs", "RDMA verbs backend of PeerCache (rdma-core).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__verbs(void) {
    if (PyType_Ready(&RailType) < 0 || PyType_Ready(&ChannelsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&RailType);
    PyModule_AddObject(m, "Rail", (PyObject *)&RailType);
    Py_INCREF(&ChannelsType);
    PyModule_AddObject(m, "Channels", (PyObject *)&ChannelsType);
    PyModule_AddIntConstant(m, "MAX_RAILS", PV_MAX_RAILS);
    PyModule_AddIntConstant(m, "MAX_CHANNELS", PV_MAX_CHANNELS);
    PyModule_AddIntConstant(m, "WR_INDEX_BITS", PV_WR_INDEX_BITS);
    PyModule_AddIntConstant(m, "OP_ITEMSIZE", (long)sizeof(pc_op));
    PyModule_AddStringConstant(m, "HANDOFF_CAPSULE", PC_HANDOFF_CAPSULE);
    return m;
}
