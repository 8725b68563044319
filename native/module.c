/* peercache._native: Python bindings of the GIL-free batch data path.
 *
 * Every call takes whole arrays (NumPy buffers) and creates no Python object
 * per op or per key; the GIL is released while bytes move.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "handshake.h"
#include "pc.h"
#include "trace.h"
#include "server_type.h"

#define ERRLEN 512

/* ------------------------------------------------------------------ buffers */

static int get_buf(PyObject *o, Py_buffer *v, int writable, const char *what, Py_ssize_t itemsize,
                   Py_ssize_t n) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, v, flags) < 0) {
        v->obj = NULL;  /* callers release zeroed views unconditionally */
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", what,
                     writable ? " writable" : "");
        return -1;
    }
    if (itemsize && (n >= 0 ? v->len != n * itemsize : v->len % itemsize != 0)) {
        PyErr_Format(PyExc_ValueError, "%s is %zd bytes; expected %s%zd items of %zd bytes", what,
                     v->len, n >= 0 ? "" : "a multiple of ", n >= 0 ? n : 1, itemsize);
        PyBuffer_Release(v);
        v->obj = NULL;
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------------- Peer */

typedef struct {
    PyObject_HEAD
    const pc_backend *be;
    void *conn;
    int closed;
} PeerObject;

static PyTypeObject PeerType;

static void Peer_dealloc(PeerObject *self) {
    /* Only here is the connection torn down: a batch in flight holds a reference. */
    if (self->conn) self->be->close(self->conn);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *new_peer(const pc_backend *be, const void *params) {
    char err[ERRLEN] = "";
    void *conn;
    Py_BEGIN_ALLOW_THREADS
    conn = be->connect(params, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (!conn) {
        PyErr_Format(PyExc_ConnectionError, "%s: %s", be->name, err);
        return NULL;
    }
    PeerObject *p = PyObject_New(PeerObject, &PeerType);
    if (!p) { be->close(conn); return NULL; }
    p->be = be;
    p->conn = conn;
    p->closed = 0;
    return (PyObject *)p;
}

/* Validate the local side, run the backend on the valid ops, scatter statuses. */
static PyObject *Peer_read_batch(PeerObject *self, PyObject *args) {
    PyObject *ops_o, *locals_o, *status_o;
    if (!PyArg_ParseTuple(args, "OOO", &ops_o, &locals_o, &status_o)) return NULL;
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "read_batch on a closed peer; connect again");
        return NULL;
    }
    Py_buffer ops_v, st_v;
    if (get_buf(ops_o, &ops_v, 0, "ops (OP_DTYPE array)", sizeof(pc_op), -1) < 0) return NULL;
    Py_ssize_t n = ops_v.len / (Py_ssize_t)sizeof(pc_op);
    if (get_buf(status_o, &st_v, 1, "status (int32 array)", 4, n) < 0) {
        PyBuffer_Release(&ops_v);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(locals_o, "locals must be a sequence of writable buffers");
    if (!seq) { PyBuffer_Release(&ops_v); PyBuffer_Release(&st_v); return NULL; }
    Py_ssize_t nl = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *lv = PyMem_Calloc((size_t)(nl ? nl : 1), sizeof(Py_buffer));
    pc_local *locals = PyMem_Calloc((size_t)(nl ? nl : 1), sizeof(pc_local));
    pc_op *valid = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(pc_op));
    size_t *where = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(size_t));
    int32_t *vst = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (!lv || !locals || !valid || !where || !vst) { PyErr_NoMemory(); goto done; }
    for (; got < nl; got++) {
        if (get_buf(PySequence_Fast_GET_ITEM(seq, got), &lv[got], 1, "local buffer", 0, -1) < 0) goto done;
        locals[got].base = lv[got].buf;
        locals[got].len = (uint64_t)lv[got].len;
    }
    const pc_op *ops = ops_v.buf;
    int32_t *status = st_v.buf;
    char err[ERRLEN] = "";
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    size_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const pc_op *op = &ops[i];
        if (op->length == 0) { status[i] = PC_ZERO_LENGTH; continue; }
        if (op->local_region >= (uint64_t)nl || op->local_offset > locals[op->local_region].len ||
            op->length > locals[op->local_region].len - op->local_offset) {
            status[i] = PC_LOCAL_RANGE;
            continue;
        }
        valid[m] = *op;
        where[m++] = (size_t)i;
    }
    if (m) {
        rc = self->be->read_batch(self->conn, valid, m, locals, (size_t)nl, vst, err, sizeof err, NULL);
        for (size_t j = 0; j < m; j++) status[where[j]] = vst[j];
    }
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        result = PyUnicode_FromString(err[0] ? err : "batch failed");
    } else {
        result = Py_None;
        Py_INCREF(result);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&lv[i]);
    PyMem_Free(lv); PyMem_Free(locals); PyMem_Free(valid); PyMem_Free(where); PyMem_Free(vst);
    Py_DECREF(seq);
    PyBuffer_Release(&ops_v);
    PyBuffer_Release(&st_v);
    return result;
}

static PyObject *Peer_alive(PeerObject *self, PyObject *unused) {
    (void)unused;
    int a = !self->closed && (!self->be->alive || self->be->alive(self->conn));
    return PyBool_FromLong(a);
}

static PyObject *Peer_wait_stats(PeerObject *self, PyObject *unused) {
    (void)unused;
    if (!self->be->wait_stats) Py_RETURN_NONE;
    uint64_t polled = 0, slept = 0, missed = 0;
    self->be->wait_stats(self->conn, &polled, &slept, &missed);
    return Py_BuildValue("{sKsKsK}", "polled", (unsigned long long)polled, "slept", (unsigned long long)slept,
                         "missed", (unsigned long long)missed);
}

static PyObject *Peer_close(PeerObject *self, PyObject *unused) {
    (void)unused;
    self->closed = 1;  /* the connection itself goes when the last reference does */
    Py_RETURN_NONE;
}

static PyObject *Peer_backend(PeerObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(self->be->name);
}

static PyMethodDef Peer_methods[] = {
    {"read_batch", (PyCFunction)Peer_read_batch, METH_VARARGS,
     "read_batch(ops, locals, status) -> None or the error text; executes OP_DTYPE ops without the GIL."},
    {"alive", (PyCFunction)Peer_alive, METH_NOARGS, "Whether the peer is still usable."},
    {"close", (PyCFunction)Peer_close, METH_NOARGS, "Refuse further batches on this handle."},
    {"wait_stats", (PyCFunction)Peer_wait_stats, METH_NOARGS,
     "{'polled': replies a poll caught, 'slept': waits that slept, 'missed': polls that ran out first} (tcp), "
     "or None for a backend without waits."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Peer_getset[] = {
    {"backend", (getter)Peer_backend, NULL, "Name of the backend.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PeerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._native.Peer",
    .tp_basicsize = sizeof(PeerObject),
    .tp_dealloc = (destructor)Peer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A connection to one producer through one backend.",
    .tp_methods = Peer_methods,
    .tp_getset = Peer_getset,
};

static PyObject *py_shm_connect(PyObject *mod, PyObject *args) {
    (void)mod;
    int pid;
    unsigned long long start;
    PyObject *regions;
    if (!PyArg_ParseTuple(args, "iKO", &pid, &start, &regions)) return NULL;
    PyObject *seq = PySequence_Fast(regions, "regions must be a sequence of (id, rkey, path, size)");
    if (!seq) return NULL;
    pc_shm_params p = {.pid = pid, .start_time = start, .nregions = 0};
    Py_ssize_t nr = PySequence_Fast_GET_SIZE(seq);
    if (nr > PC_SHM_MAX_REGIONS || nr == 0) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "an shm peer needs 1..%d regions, got %zd",
                            PC_SHM_MAX_REGIONS, nr);
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        unsigned int id;
        unsigned long long rkey, size;
        const char *path;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IKsK", &id, &rkey, &path, &size)) {
            Py_DECREF(seq);
            return NULL;
        }
        p.regions[i] = (pc_shm_region_param){id, rkey, path, size};
        p.nregions++;
    }
    PyObject *r = new_peer(&pc_shm_backend, &p);  /* paths live while seq does */
    Py_DECREF(seq);
    return r;
}

static PyObject *py_tcp_connect(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *host;
    int port, maxch, poll_us = 0;
    double timeout;
    PyObject *key = Py_None;
    if (!PyArg_ParseTuple(args, "siid|Oi", &host, &port, &maxch, &timeout, &key, &poll_us)) return NULL;
    if (!(timeout > 0)) {
        char got[32];
        snprintf(got, sizeof got, "%g", timeout);   /* PyErr_Format has no %g */
        return PyErr_Format(PyExc_ValueError, "timeout_s must be a positive number of seconds, got %s; pass "
                            "peercache.timeouts' io bound (the node's)", got);
    }
    if (poll_us < 0 || poll_us > 1000000)
        return PyErr_Format(PyExc_ValueError, "poll_us must be 0..1000000 microseconds, got %d", poll_us);
    if (key != Py_None && (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != PC_HS_KEY_BYTES))
        return PyErr_Format(PyExc_ValueError, "the data key must be None or %d bytes", PC_HS_KEY_BYTES);
    pc_tcp_params p = {host, port, maxch, timeout, poll_us,
                       key == Py_None ? NULL : (const uint8_t *)PyBytes_AS_STRING(key)};
    return new_peer(&pc_tcp_backend, &p);
}

/* handshake_macs(key, transcript, seq, request): what handshake.c computes, for the test that
 * the Python side (peercache.auth.DataKey) computes the same. */
static PyObject *py_handshake_macs(PyObject *mod, PyObject *args) {
    (void)mod;
    Py_buffer key, t, req;
    unsigned long long seq;
    if (!PyArg_ParseTuple(args, "y*y*Ky*", &key, &t, &seq, &req)) return NULL;
    PyObject *r = NULL;
    if (key.len != PC_HS_KEY_BYTES || t.len != PC_HS_TRANSCRIPT_BYTES || req.len < PC_HS_HEAD_BYTES) {
        PyErr_Format(PyExc_ValueError, "handshake_macs takes a %d-byte key, a %d-byte transcript and a "
                     "request of at least its %d-byte header", PC_HS_KEY_BYTES, PC_HS_TRANSCRIPT_BYTES,
                     PC_HS_HEAD_BYTES);
    } else {
        uint8_t out[4][PC_HS_MAC_BYTES];
        pc_hs_mac(out[0], key.buf, PC_HS_SERVER, t.buf);
        pc_hs_mac(out[1], key.buf, PC_HS_CLIENT, t.buf);
        pc_hs_mac(out[2], key.buf, PC_HS_SESSION, t.buf);
        pc_hs_request_tag(out[3], out[2], seq, req.buf, (const uint8_t *)req.buf + PC_HS_HEAD_BYTES,
                          (size_t)req.len - PC_HS_HEAD_BYTES);
        r = Py_BuildValue("(y#y#y#y#)", out[0], (Py_ssize_t)PC_HS_MAC_BYTES, out[1], (Py_ssize_t)PC_HS_MAC_BYTES,
                          out[2], (Py_ssize_t)PC_HS_MAC_BYTES, out[3], (Py_ssize_t)PC_HS_MAC_BYTES);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&t);
    PyBuffer_Release(&req);
    return r;
}

/* A Peer around a connection another extension made (the verbs backend). */
static PyObject *py_adopt(PyObject *mod, PyObject *cap) {
    (void)mod;
    pc_handoff *h = PyCapsule_GetPointer(cap, PC_HANDOFF_CAPSULE);
    if (!h) return NULL;
    if (!h->be || !h->conn)
        return PyErr_Format(PyExc_ValueError, "this connection was already adopted by a Peer");
    PeerObject *p = PyObject_New(PeerObject, &PeerType);
    if (!p) return NULL;
    p->be = h->be;
    p->conn = h->conn;
    p->closed = 0;
    h->conn = NULL;  /* the Peer owns it now */
    return (PyObject *)p;
}

/* ----------------------------------------------------------------- LocCache */

typedef struct {
    PyObject_HEAD
    pc_map *map;
    atomic_ullong hits;
    atomic_ullong misses;
} LocCacheObject;

static PyObject *LocCache_new(PyTypeObject *t, PyObject *a, PyObject *k) {
    (void)a; (void)k;
    LocCacheObject *self = (LocCacheObject *)t->tp_alloc(t, 0);
    if (!self) return NULL;
    self->map = pc_map_new();
    if (!self->map) { Py_DECREF(self); return PyErr_NoMemory(); }
    atomic_init(&self->hits, 0);
    atomic_init(&self->misses, 0);
    return (PyObject *)self;
}

static void LocCache_dealloc(LocCacheObject *self) {
    pc_map_free(self->map);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

typedef pc_bytes keyref;

/* Borrow the bytes of every key (with a reference held) so the GIL can go. */
static PyObject *grab_keys(PyObject *keys, keyref **out, Py_ssize_t *n) {
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence of bytes");
    if (!seq) return NULL;
    *n = PySequence_Fast_GET_SIZE(seq);
    *out = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof(keyref));
    if (!*out) { Py_DECREF(seq); PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (!PyBytes_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "key %zd is %s, not bytes", i, Py_TYPE(items[i])->tp_name);
            for (Py_ssize_t j = 0; j < i; j++) Py_DECREF(items[j]);
            PyMem_Free(*out);
            Py_DECREF(seq);
            return NULL;
        }
        Py_INCREF(items[i]);
        (*out)[i].p = (const uint8_t *)PyBytes_AS_STRING(items[i]);
        (*out)[i].n = (size_t)PyBytes_GET_SIZE(items[i]);
    }
    return seq;
}

static void drop_keys(PyObject *seq, keyref *k, Py_ssize_t n) {
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) Py_DECREF(items[i]);
    PyMem_Free(k);
    Py_DECREF(seq);
}

/* The lookup of LocCache.lookup (read_cached's too): how many keys were found, *total the keys, or
 * -1 with an exception set. */
static Py_ssize_t cache_lookup(LocCacheObject *self, PyObject *keys, double now, PyObject *locs_o, PyObject *want_o,
                               Py_ssize_t *total) {
    keyref *k;
    Py_ssize_t n;
    PyObject *seq = grab_keys(keys, &k, &n);
    if (!seq) return -1;
    Py_buffer lv, wv = {0};
    if (get_buf(locs_o, &lv, 1, "locs (LOC_DTYPE array)", sizeof(pc_loc), n) < 0) {
        drop_keys(seq, k, n);
        return -1;
    }
    if (want_o != Py_None && get_buf(want_o, &wv, 1, "want (uint64 array)", 8, n) < 0) {
        PyBuffer_Release(&lv);
        drop_keys(seq, k, n);
        return -1;
    }
    pc_loc *locs = lv.buf;
    uint64_t *want = wv.buf;
    Py_ssize_t found = 0;
    pc_trace(PC_TR_DIR_ENTER, 0);
    Py_BEGIN_ALLOW_THREADS
    found = (Py_ssize_t)pc_map_get_many(self->map, k, (size_t)n, now, locs, want, PC_ABSENT);
    Py_END_ALLOW_THREADS
    pc_trace(PC_TR_DIR_EXIT, 0);
    atomic_fetch_add(&self->hits, (unsigned long long)found);
    atomic_fetch_add(&self->misses, (unsigned long long)(n - found));
    PyBuffer_Release(&wv);
    PyBuffer_Release(&lv);
    drop_keys(seq, k, n);
    *total = n;
    return found;
}

static PyObject *LocCache_lookup(LocCacheObject *self, PyObject *args) {
    PyObject *keys, *locs_o, *want_o = Py_None;
    double now;
    if (!PyArg_ParseTuple(args, "OdO|O", &keys, &now, &locs_o, &want_o)) return NULL;
    Py_ssize_t n, found = cache_lookup(self, keys, now, locs_o, want_o, &n);
    return found < 0 ? NULL : PyLong_FromSsize_t(found);
}

static PyObject *LocCache_put(LocCacheObject *self, PyObject *args) {
    PyObject *keys, *locs_o;
    double expiry;
    Py_ssize_t max_entries;
    if (!PyArg_ParseTuple(args, "OOdn", &keys, &locs_o, &expiry, &max_entries)) return NULL;
    keyref *k;
    Py_ssize_t n;
    PyObject *seq = grab_keys(keys, &k, &n);
    if (!seq) return NULL;
    Py_buffer lv;
    if (get_buf(locs_o, &lv, 0, "locs (LOC_DTYPE array)", sizeof(pc_loc), n) < 0) {
        drop_keys(seq, k, n);
        return NULL;
    }
    const pc_loc *locs = lv.buf;
    int fail = 0;
    Py_BEGIN_ALLOW_THREADS
    if ((Py_ssize_t)pc_map_len(self->map) + n > max_entries) pc_map_clear(self->map);
    for (Py_ssize_t i = 0; i < n && !fail; i++)
        if (locs[i].node != PC_ABSENT && pc_map_put(self->map, k[i].p, k[i].n, &locs[i], expiry) < 0) fail = 1;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lv);
    drop_keys(seq, k, n);
    if (fail) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *LocCache_invalidate(LocCacheObject *self, PyObject *keys) {
    keyref *k;
    Py_ssize_t n, removed = 0;
    PyObject *seq = grab_keys(keys, &k, &n);
    if (!seq) return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) removed += pc_map_del(self->map, k[i].p, k[i].n);
    Py_END_ALLOW_THREADS
    drop_keys(seq, k, n);
    return PyLong_FromSsize_t(removed);
}

static PyObject *LocCache_drop_node(LocCacheObject *self, PyObject *arg) {
    unsigned long node = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) return NULL;
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = pc_map_drop_node(self->map, (uint32_t)node);
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(n);
}

static PyObject *LocCache_clear(LocCacheObject *self, PyObject *unused) {
    (void)unused;
    pc_map_clear(self->map);
    Py_RETURN_NONE;
}

static Py_ssize_t LocCache_len(LocCacheObject *self) { return (Py_ssize_t)pc_map_len(self->map); }

static PyObject *LocCache_get_hits(LocCacheObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->hits));
}

static PyObject *LocCache_get_misses(LocCacheObject *self, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(atomic_load(&self->misses));
}

static PyObject *LocCache_count_miss(LocCacheObject *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0 && PyErr_Occurred()) return NULL;
    atomic_fetch_add(&self->misses, (unsigned long long)n);
    Py_RETURN_NONE;
}

static PyMethodDef LocCache_methods[] = {
    {"lookup", (PyCFunction)LocCache_lookup, METH_VARARGS,
     "lookup(keys, now, locs[, want]) -> found; fills LOC_DTYPE rows, node=ABSENT where absent or expired, "
     "and the uint64 array want (if given) with each key's hash, tags.key_hash (kept since the key was "
     "cached, else computed now)."},
    {"put", (PyCFunction)LocCache_put, METH_VARARGS,
     "put(keys, locs, expiry, max_entries); rows with node=ABSENT are skipped."},
    {"invalidate", (PyCFunction)LocCache_invalidate, METH_O, "invalidate(keys) -> removed."},
    {"drop_node", (PyCFunction)LocCache_drop_node, METH_O, "drop_node(node_index) -> removed."},
    {"clear", (PyCFunction)LocCache_clear, METH_NOARGS, "Forget everything."},
    {"count_miss", (PyCFunction)LocCache_count_miss, METH_O, "Add to the miss counter."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LocCache_getset[] = {
    {"hits", (getter)LocCache_get_hits, NULL, "Keys found so far.", NULL},
    {"misses", (getter)LocCache_get_misses, NULL, "Keys not found so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods LocCache_seq = {.sq_length = (lenfunc)LocCache_len};

static PyTypeObject LocCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "peercache._native.LocCache",
    .tp_basicsize = sizeof(LocCacheObject),
    .tp_dealloc = (destructor)LocCache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sharded hash map key bytes -> location with expiry.",
    .tp_new = LocCache_new,
    .tp_methods = LocCache_methods,
    .tp_getset = LocCache_getset,
    .tp_as_sequence = &LocCache_seq,
};

/* --------------------------------------------------------------- read_slots */

/* read_slots: the arrays of the batch and a handle per node of it, taken
 * while the GIL is held; the reads themselves are pc_read_slots (slots.c). */
/* read_slots' work on its parsed arguments (read_cached's too). */
/* raw: the locations, key hashes and codes as C arrays of raw->n (read_cached's own), instead of
 * locs_o, want_o and code_o; res: the result is put there (and None returned) instead of a tuple. */
typedef struct raw_slots { const pc_loc *locs; const uint64_t *want; int32_t *codes; Py_ssize_t n; } raw_slots;

static PyObject *read_slots_of(PyObject *peers, PyObject *locs_o, PyObject *want_o, PyObject *dest_o,
                               PyObject *off_o, PyObject *caps_o, PyObject *st_o, PyObject *len_o, PyObject *gen_o,
                               PyObject *code_o, unsigned int checks, const raw_slots *raw, pc_slot_result *res) {
    if (checks & ~(unsigned)(PC_CHECK_PATTERN | PC_CHECK_INTEGRITY))
        return PyErr_Format(PyExc_ValueError, "checks 0x%x: only CHECK_PATTERN and CHECK_INTEGRITY exist", checks);
    if (!PyList_Check(peers)) return PyErr_Format(PyExc_TypeError, "peers must be a list");
    /* Zeroed views: PyBuffer_Release ignores the ones never filled. */
    Py_buffer lv = {0}, wv = {0}, dv = {0}, ov = {0}, cv = {0}, sv = {0}, lnv = {0}, gv = {0}, kv = {0};
    int have_caps = caps_o != Py_None;
    /* dest: one buffer (payloads at offsets of it), or a list of one buffer per key */
    int many = PyList_Check(dest_o);
    if (!raw && get_buf(locs_o, &lv, 0, "locs (LOC_DTYPE array)", sizeof(pc_loc), -1) < 0) return NULL;
    Py_ssize_t n = raw ? raw->n : lv.len / (Py_ssize_t)sizeof(pc_loc);
    if (many && PyList_GET_SIZE(dest_o) != n) {
        PyBuffer_Release(&lv);
        return PyErr_Format(PyExc_ValueError, "dest is a list of %zd buffers for %zd keys; give one per key",
                            PyList_GET_SIZE(dest_o), n);
    }
    if ((!raw && get_buf(want_o, &wv, 0, "want (uint64 array: the key hash of each key asked for)", 8, n) < 0) ||
        (!many && get_buf(dest_o, &dv, 1, "dest", 0, -1) < 0) ||
        get_buf(off_o, &ov, 0, "offsets (uint64 array)", 8, n) < 0 ||
        (have_caps && get_buf(caps_o, &cv, 0, "capacities (uint64 array)", 8, n) < 0) ||
        get_buf(st_o, &sv, 1, "status (int8 array)", 1, n) < 0 ||
        get_buf(len_o, &lnv, 1, "lengths (uint64 array)", 8, n) < 0 ||
        get_buf(gen_o, &gv, 1, "generations (uint64 array)", 8, n) < 0 ||
        (!raw && get_buf(code_o, &kv, 1, "codes (int32 array)", 4, n) < 0)) {
        PyBuffer_Release(&kv); PyBuffer_Release(&gv); PyBuffer_Release(&lnv); PyBuffer_Release(&sv);
        PyBuffer_Release(&cv); PyBuffer_Release(&ov); PyBuffer_Release(&dv); PyBuffer_Release(&wv);
        PyBuffer_Release(&lv);
        return NULL;
    }
    pc_slot_batch b = {
        .n = (size_t)n, .locs = raw ? raw->locs : lv.buf, .want = raw ? raw->want : wv.buf, .dest = dv.buf,
        .destlen = (uint64_t)dv.len, .offsets = ov.buf, .caps = have_caps ? cv.buf : NULL, .status = sv.buf,
        .codes = raw ? raw->codes : kv.buf, .lengths = lnv.buf, .gens = gv.buf, .checks = checks,
    };
    /* The distinct nodes of the batch, then the open Peer of each (its index in peers),
     * held until the reads are done. */
    PyObject *result = NULL;
    size_t nn = 0, cap_nodes = 8;
    Py_ssize_t got = 0;   /* views of dests taken */
    Py_buffer *dvs = NULL;
    pc_local *dests = NULL;
    pc_slot_peer *nodes = PyMem_Malloc(cap_nodes * sizeof *nodes);
    void *scratch = PyMem_Malloc(pc_slot_scratch_bytes(b.n));
    if (!nodes || !scratch) { PyErr_NoMemory(); goto out; }
    if (many) {
        dvs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *dvs);
        dests = PyMem_Malloc((n ? (size_t)n : 1) * sizeof *dests);
        if (!dvs || !dests) { PyErr_NoMemory(); goto out; }
        for (; got < n; got++) {
            if (get_buf(PyList_GET_ITEM(dest_o, got), &dvs[got], 1, "each buffer of dest", 0, -1) < 0) goto out;
            dests[got] = (pc_local){dvs[got].buf, (uint64_t)dvs[got].len};
        }
        b.dests = dests;
    }
    for (size_t i = 0; (i = pc_slot_nodes(b.locs, i, b.n, nodes, cap_nodes, &nn)) < b.n;) {
        cap_nodes *= 2;
        pc_slot_peer *g = PyMem_Realloc(nodes, cap_nodes * sizeof *g);
        if (!g) { PyErr_NoMemory(); goto out; }
        nodes = g;
    }
    Py_ssize_t npeers = PyList_GET_SIZE(peers);
    for (size_t d = 0; d < nn; d++) {
        uint32_t nd = nodes[d].node;
        PyObject *p = (Py_ssize_t)nd < npeers ? PyList_GET_ITEM(peers, nd) : NULL;
        if (p && Py_IS_TYPE(p, &PeerType) && !((PeerObject *)p)->closed) {
            Py_INCREF(p);
            nodes[d].owner = p;
            nodes[d].be = ((PeerObject *)p)->be;
            nodes[d].conn = ((PeerObject *)p)->conn;
        }
    }
    pc_slot_result r;
    Py_BEGIN_ALLOW_THREADS
    pc_trace(PC_TR_READ_NOGIL, 0);
    pc_read_slots(&b, nodes, nn, scratch, &r);
    pc_trace(PC_TR_READ_CHECKED, 0);
    Py_END_ALLOW_THREADS
    pc_trace(PC_TR_READ_GIL, 0);
    if (res) {
        *res = r;
        Py_INCREF(Py_None);
        result = Py_None;
        goto out;
    }
    result = Py_BuildValue("(nnnniIsnnnn)", (Py_ssize_t)r.hits, (Py_ssize_t)r.stale, (Py_ssize_t)r.need_peer,
                           (Py_ssize_t)r.errors, (int)r.err_code, (unsigned)r.err_node, r.err,
                           (Py_ssize_t)r.content_bad, (Py_ssize_t)r.checksum_bad,
                           (Py_ssize_t)r.checksum_missing, (Py_ssize_t)r.redirected);
out:
    for (size_t d = 0; d < nn; d++) Py_XDECREF((PyObject *)nodes[d].owner);
    for (Py_ssize_t j = 0; j < got; j++) PyBuffer_Release(&dvs[j]);
    PyMem_Free(dvs);
    PyMem_Free(dests);
    PyMem_Free(nodes);
    PyMem_Free(scratch);
    PyBuffer_Release(&kv); PyBuffer_Release(&gv); PyBuffer_Release(&lnv); PyBuffer_Release(&sv);
    PyBuffer_Release(&cv); PyBuffer_Release(&ov); PyBuffer_Release(&dv); PyBuffer_Release(&wv);
    PyBuffer_Release(&lv);
    return result;
}

static PyObject *py_read_slots(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *peers, *locs_o, *want_o, *dest_o, *off_o, *caps_o, *st_o, *len_o, *gen_o, *code_o;
    unsigned int checks = 0;
    pc_trace(PC_TR_READ_ENTER, 0);
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO|I", &peers, &locs_o, &want_o, &dest_o, &off_o, &caps_o, &st_o,
                          &len_o, &gen_o, &code_o, &checks))
        return NULL;
    PyObject *r = read_slots_of(peers, locs_o, want_o, dest_o, off_o, caps_o, st_o, len_o, gen_o, code_o, checks,
                                NULL, NULL);
    pc_trace(PC_TR_READ_EXIT, 0);
    return r;
}

/* read_cached: the fast path of a batch whose keys are all cached and all hits. The cache's lookup
 * of every key (LocCache.lookup's: its counters too), then, when it held them all, the slot reads
 * (read_slots' work) on those locations, into scratch of its own for the locations, key hashes and
 * codes. True when every key was a hit (status, lengths and gens filled); None when a key was not
 * cached (nothing read) or the read was anything but all hits (a node to connect, a stale or
 * redirected slot, a failed op, a payload check that failed): the caller then reads the batch by
 * its full path, which says what happened to each key. */
static PyObject *py_read_cached(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *cache, *keys, *peers, *dest_o, *off_o, *caps_o, *st_o, *len_o, *gen_o;
    double now;
    unsigned int checks = 0;
    if (!PyArg_ParseTuple(args, "OOdOOOOOOO|I", &cache, &keys, &now, &peers, &dest_o, &off_o, &caps_o, &st_o,
                          &len_o, &gen_o, &checks))
        return NULL;
    if (!Py_IS_TYPE(cache, &LocCacheType)) return PyErr_Format(PyExc_TypeError, "cache must be a LocCache");
    LocCacheObject *lc = (LocCacheObject *)cache;
    keyref *k;
    Py_ssize_t n;
    PyObject *seq = grab_keys(keys, &k, &n);
    if (!seq) return NULL;
    size_t m = n ? (size_t)n : 1;
    pc_loc *locs = PyMem_Malloc(m * sizeof *locs);
    uint64_t *want = PyMem_Malloc(m * sizeof *want);
    int32_t *codes = PyMem_Malloc(m * sizeof *codes);
    PyObject *result = NULL;
    if (!locs || !want || !codes) { PyErr_NoMemory(); goto out; }
    size_t found;
    pc_trace(PC_TR_DIR_ENTER, 0);
    Py_BEGIN_ALLOW_THREADS
    found = pc_map_get_many(lc->map, k, (size_t)n, now, locs, want, PC_ABSENT);
    Py_END_ALLOW_THREADS
    pc_trace(PC_TR_DIR_EXIT, 0);
    if (found < (size_t)n) {   /* the full path looks them up again, and counts them */
        result = Py_NewRef(Py_None);
        goto out;
    }
    raw_slots raw = {locs, want, codes, n};
    pc_slot_result r;
    pc_trace(PC_TR_READ_ENTER, 0);
    result = read_slots_of(peers, NULL, NULL, dest_o, off_o, caps_o, st_o, len_o, gen_o, NULL, checks, &raw, &r);
    pc_trace(PC_TR_READ_EXIT, 0);
    if (result && (r.hits != (size_t)n || r.content_bad)) {   /* not all plain hits: the full path reads it again */
        Py_SETREF(result, Py_NewRef(Py_None));
    } else if (result) {   /* answered here: the keys' cache hits are counted here */
        atomic_fetch_add(&lc->hits, (unsigned long long)found);
        Py_SETREF(result, Py_NewRef(Py_True));
    }
out:
    PyMem_Free(codes);
    PyMem_Free(want);
    PyMem_Free(locs);
    drop_keys(seq, k, n);
    return result;
}

/* ------------------------------------------------------------ directory table */

/* table_lookup: the keys, the table's source (a Peer, or the table's own memory on its
 * host) and the caller's member numbers taken while the GIL is held; the hashing, the
 * read and the checks are pc_table_read (dirtable.c). */
static PyObject *py_table_lookup(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *src, *keys, *spec_o, *nums_o, *epoch_o, *rows_o, *state_o;
    unsigned long long lim;
    if (!PyArg_ParseTuple(args, "OOOOKOOO", &src, &keys, &spec_o, &nums_o, &lim, &epoch_o, &rows_o, &state_o))
        return NULL;
    if (!PyBytes_Check(spec_o) || PyBytes_GET_SIZE(spec_o) != (Py_ssize_t)sizeof(pc_table_spec))
        return PyErr_Format(PyExc_ValueError, "spec must be the %zu bytes of TableView.native_spec",
                            sizeof(pc_table_spec));
    pc_table_spec spec;
    memcpy(&spec, PyBytes_AS_STRING(spec_o), sizeof spec);
    if (spec.ways < 1 || spec.ways > 63 || spec.buckets == 0)
        return PyErr_Format(PyExc_ValueError, "table of %u ways x %llu buckets is not one this version reads",
                            spec.ways, (unsigned long long)spec.buckets);
    pc_table_batch b = {.spec = &spec, .slot_limit = lim};
    if (epoch_o != Py_None) {
        b.expect_epoch = PyLong_AsUnsignedLongLong(epoch_o);
        if (PyErr_Occurred()) return NULL;
        b.have_epoch = 1;
    }
    PeerObject *peer = NULL;
    Py_buffer mv = {0}, nv = {0}, rv = {0}, sv = {0};
    if (Py_IS_TYPE(src, &PeerType)) {
        peer = (PeerObject *)src;
        if (peer->closed)
            return PyErr_Format(PyExc_ValueError, "table_lookup on a closed peer; connect again");
        Py_INCREF(peer);
        b.be = peer->be;
        b.conn = peer->conn;
    } else {
        if (PyObject_GetBuffer(src, &mv, PyBUF_SIMPLE) < 0) {
            PyErr_Format(PyExc_TypeError, "the table source must be a Peer or the table's memory (a buffer), "
                         "not %s", Py_TYPE(src)->tp_name);
            return NULL;
        }
        b.mem = mv.buf;
        b.memlen = (uint64_t)mv.len;
    }
    keyref *k = NULL;
    Py_ssize_t n = 0;
    PyObject *seq = NULL, *result = NULL;
    if (!(seq = grab_keys(keys, &k, &n))) goto out;
    if (get_buf(nums_o, &nv, 0, "nums (uint32 array)", 4, -1) < 0 ||
        get_buf(rows_o, &rv, 1, "rows (LOC_DTYPE array)", sizeof(pc_loc), n) < 0 ||
        get_buf(state_o, &sv, 1, "state (int8 array)", 1, n) < 0)
        goto out;
    b.n = (size_t)n;
    b.keys = k;
    b.nums = nv.buf;
    b.nnums = (size_t)nv.len / 4;
    b.rows = rv.buf;
    b.state = sv.buf;
    pc_table_result r;
    pc_trace(PC_TR_TABLE_ENTER, 0);
    Py_BEGIN_ALLOW_THREADS
    pc_table_read(&b, &r);
    Py_END_ALLOW_THREADS
    pc_trace(PC_TR_TABLE_EXIT, 0);
    result = Py_BuildValue("(iKnis)", r.code, (unsigned long long)r.epoch, (Py_ssize_t)r.resolved,
                           (int)r.err_code, r.err);
out:
    if (seq) drop_keys(seq, k, n);
    PyBuffer_Release(&sv); PyBuffer_Release(&rv); PyBuffer_Release(&nv); PyBuffer_Release(&mv);
    Py_XDECREF(peer);
    return result;
}

static PyObject *py_table_map(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *rows_o, *state_o, *nums_o;
    unsigned long long lim;
    int final;
    if (!PyArg_ParseTuple(args, "OOOKp", &rows_o, &state_o, &nums_o, &lim, &final)) return NULL;
    Py_buffer rv = {0}, sv = {0}, nv = {0};
    if (get_buf(rows_o, &rv, 1, "rows (LOC_DTYPE array)", sizeof(pc_loc), -1) < 0) return NULL;
    Py_ssize_t n = rv.len / (Py_ssize_t)sizeof(pc_loc);
    if (get_buf(state_o, &sv, 1, "state (int8 array)", 1, n) < 0 ||
        get_buf(nums_o, &nv, 0, "nums (uint32 array)", 4, -1) < 0) {
        PyBuffer_Release(&sv); PyBuffer_Release(&rv);
        return NULL;
    }
    size_t unknown = 0;
    pc_table_map(rv.buf, sv.buf, (size_t)n, nv.buf, (size_t)nv.len / 4, lim, final, &unknown);
    size_t resolved = pc_table_count_resolved(sv.buf, (size_t)n);
    PyBuffer_Release(&nv); PyBuffer_Release(&sv); PyBuffer_Release(&rv);
    return Py_BuildValue("(nn)", (Py_ssize_t)unknown, (Py_ssize_t)resolved);
}

static PyObject *py_key_hashes(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *keys, *out_o;
    if (!PyArg_ParseTuple(args, "OO", &keys, &out_o)) return NULL;
    keyref *k;
    Py_ssize_t n;
    PyObject *seq = grab_keys(keys, &k, &n);
    if (!seq) return NULL;
    Py_buffer ov;
    if (get_buf(out_o, &ov, 1, "out (uint64 array)", 8, n) < 0) { drop_keys(seq, k, n); return NULL; }
    uint64_t *out = ov.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) out[i] = pc_key_hash(k[i].p, k[i].n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ov);
    drop_keys(seq, k, n);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------ payload checksum */

static PyObject *py_checksum(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *buf_o;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "OK", &buf_o, &seed)) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(buf_o, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = pc_checksum(v.buf, (size_t)v.len, seed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(h);
}

/* ------------------------------------------------------------ tag checking */

static PyObject *py_check_tags(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *tags_o, *locs_o, *want_o, *out_o;
    if (!PyArg_ParseTuple(args, "OOOO", &tags_o, &locs_o, &want_o, &out_o)) return NULL;
    Py_buffer tv = {0}, lv = {0}, wv = {0}, ov = {0};
    if (get_buf(locs_o, &lv, 0, "locs (LOC_DTYPE array)", sizeof(pc_loc), -1) < 0) return NULL;
    Py_ssize_t n = lv.len / (Py_ssize_t)sizeof(pc_loc);
    if (get_buf(tags_o, &tv, 0, "tags ((n, TAG_WORDS) uint64 array)", PC_TAG_BYTES, n) < 0 ||
        get_buf(want_o, &wv, 0, "want (uint64 array)", 8, n) < 0 ||
        get_buf(out_o, &ov, 1, "out (int32 array)", 4, n) < 0) {
        PyBuffer_Release(&wv); PyBuffer_Release(&tv); PyBuffer_Release(&lv);
        return NULL;
    }
    const uint64_t *t = tv.buf, *w = wv.buf;
    const pc_loc *l = lv.buf;
    int32_t *o = ov.buf;
    Py_ssize_t good = 0;
    for (Py_ssize_t i = 0; i < n; i++) good += (o[i] = pc_tag_check(&t[i * PC_TAG_WORDS], &l[i], w[i])) == PC_OK;
    PyBuffer_Release(&lv); PyBuffer_Release(&tv); PyBuffer_Release(&wv); PyBuffer_Release(&ov);
    return PyLong_FromSsize_t(good);
}

/* ------------------------------------------------------------- copy_pages */

static PyObject *py_copy_pages(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *src_o, *dst_o, *so_o, *do_o;
    unsigned long long length;
    if (!PyArg_ParseTuple(args, "OOOOK", &src_o, &dst_o, &so_o, &do_o, &length)) return NULL;
    Py_buffer sv, dv, sov, dov;
    if (get_buf(src_o, &sv, 0, "src", 0, -1) < 0) return NULL;
    if (get_buf(dst_o, &dv, 1, "dst", 0, -1) < 0) { PyBuffer_Release(&sv); return NULL; }
    if (get_buf(so_o, &sov, 0, "src_offsets (uint64 array)", 8, -1) < 0) {
        PyBuffer_Release(&sv); PyBuffer_Release(&dv);
        return NULL;
    }
    Py_ssize_t n = sov.len / 8;
    if (get_buf(do_o, &dov, 0, "dst_offsets (uint64 array)", 8, n) < 0) {
        PyBuffer_Release(&sv); PyBuffer_Release(&dv); PyBuffer_Release(&sov);
        return NULL;
    }
    const uint64_t *so = sov.buf, *dof = dov.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (so[i] > (uint64_t)sv.len || length > (uint64_t)sv.len - so[i] || dof[i] > (uint64_t)dv.len ||
            length > (uint64_t)dv.len - dof[i]) {
            PyBuffer_Release(&sv); PyBuffer_Release(&dv); PyBuffer_Release(&sov); PyBuffer_Release(&dov);
            return PyErr_Format(PyExc_ValueError, "copy %zd is out of range", i);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        memcpy((uint8_t *)dv.buf + dof[i], (const uint8_t *)sv.buf + so[i], length);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sv); PyBuffer_Release(&dv); PyBuffer_Release(&sov); PyBuffer_Release(&dov);
    Py_RETURN_NONE;
}


/* The offsets in a host KV pool's buffer of the objects of the pages whose token indices are given (SGLang's
 * page_first layouts: page row r's object j at bases[j] + r * stride, the row being a page's first token
 * index // tokens, as the pool's get_page_buffer_meta has it), each checked to leave obj bytes before
 * the buffer's end: what PeerCacheStore's batch_get_v1 did in eight numpy calls, each of which costs
 * tens of microseconds right after a batch's copy has pushed numpy's own data out of the caches. */
static PyObject *py_page_offsets(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *idx_o, *bases_o, *out_o;
    unsigned long long tokens, stride, limit;
    if (!PyArg_ParseTuple(args, "OKKOKO", &idx_o, &tokens, &stride, &bases_o, &limit, &out_o)) return NULL;
    if (tokens == 0) return PyErr_Format(PyExc_ValueError, "page_offsets: tokens per page must be 1 or more");
    Py_buffer iv, bv, ov;
    if (get_buf(idx_o, &iv, 0, "indices (int64 array)", 8, -1) < 0) return NULL;
    if (get_buf(bases_o, &bv, 0, "bases (uint64 array)", 8, -1) < 0) { PyBuffer_Release(&iv); return NULL; }
    Py_ssize_t ni = iv.len / 8, nb = bv.len / 8;
    if (nb == 0 || ni % (Py_ssize_t)tokens) {
        PyBuffer_Release(&iv); PyBuffer_Release(&bv);
        return PyErr_Format(PyExc_ValueError, "page_offsets: %zd token indices are not whole pages of %llu "
                            "(or no object offsets)", ni, tokens);
    }
    Py_ssize_t pages = ni / (Py_ssize_t)tokens;
    if (get_buf(out_o, &ov, 1, "out (uint64 array)", 8, pages * nb) < 0) {
        PyBuffer_Release(&iv); PyBuffer_Release(&bv);
        return NULL;
    }
    const int64_t *idx = iv.buf;
    const uint64_t *bases = bv.buf;
    uint64_t *out = ov.buf;
    Py_ssize_t bad = -1;
    int64_t first = 0;
    for (Py_ssize_t p = 0; p < pages && bad < 0; p++) {
        first = idx[p * (Py_ssize_t)tokens];
        uint64_t at;
        if (first < 0 || __builtin_mul_overflow((uint64_t)first / tokens, stride, &at)) { bad = p; break; }
        for (Py_ssize_t j = 0; j < nb; j++) {
            uint64_t off;
            if (__builtin_add_overflow(at, bases[j], &off) || off > limit) { bad = p; break; }
            out[p * nb + j] = off;
        }
    }
    PyBuffer_Release(&iv); PyBuffer_Release(&bv); PyBuffer_Release(&ov);
    if (bad >= 0)
        return PyErr_Format(PyExc_ValueError, "page %zd of the batch (token index %lld) lies outside the buffer",
                            bad, (long long)first);
    Py_RETURN_NONE;
}


/* ------------------------------------------------------------------ latency trace */

static PyObject *py_trace_start(PyObject *mod, PyObject *arg) {
    (void)mod;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n <= 0 || n > ((Py_ssize_t)1 << 26))
        return PyErr_Format(PyExc_ValueError, "trace_start(%zd): give a capacity of 1 to 2**26 records", n);
    if (pc_trace_start((size_t)n) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_trace_stop(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    pc_trace_rec *recs = NULL;
    uint64_t dropped = 0;
    size_t n = pc_trace_stop(&recs, &dropped);
    PyObject *b = PyBytes_FromStringAndSize((const char *)recs, (Py_ssize_t)(n * sizeof *recs));
    if (!b) return NULL;
    return Py_BuildValue("(NK)", b, (unsigned long long)dropped);
}

static PyObject *py_copy_way(PyObject *mod, PyObject *args) {
    (void)mod;
    const char *set = NULL;
    if (!PyArg_ParseTuple(args, "|z", &set)) return NULL;
    const char *way = pc_copy_way(set);
    if (!way) return PyErr_Format(PyExc_ValueError, "shm copy way %R: glibc or stream", PyTuple_GET_ITEM(args, 0));
    return PyUnicode_FromString(way);
}

/* ------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"copy_way", py_copy_way, METH_VARARGS,
     "copy_way([way]) -> how this process's shm copies of 64 KiB or more are made: 'glibc' (memcpy) or "
     "'stream' (stores past the cache; the default on AMD CPUs); way (one of the two) sets it from now on."},
    {"shm_connect", py_shm_connect, METH_VARARGS,
     "shm_connect(pid, start_time, [(region, rkey, path, size), ...]) -> Peer (maps read-only)."},
    {"tcp_connect", py_tcp_connect, METH_VARARGS,
     "tcp_connect(host, port, max_channels, timeout_s, key=None, poll_us=0) -> Peer; poll_us: poll a "
     "reply this long before sleeping; with a 32-byte data key (peercache.auth.data_key) every "
     "connection opens with the handshake of native/handshake.h and tags its requests."},
    {"handshake_macs", py_handshake_macs, METH_VARARGS,
     "handshake_macs(key, transcript, seq, request) -> (server proof, client proof, session key, tag "
     "of request number seq): the MACs of native/handshake.c (transcript: cn || sn || address), for "
     "tests."},
    {"adopt", py_adopt, METH_O,
     "adopt(capsule) -> Peer around a connection made by another backend module (peercache._verbs)."},
    {"read_slots", py_read_slots, METH_VARARGS,
     "read_slots(peers, locs, want, dest, offsets, caps, status, lengths, gens, codes[, checks]) -> "
     "(hits, stale, need_peer, errors, first_error_code, first_error_node, first_error_text, "
     "content_bad, checksum_bad, checksum_missing, redirected); want: the key hash (tags.key_hash) of "
     "each key asked for, which its slot tag must hold (never the one its location carries); dest: one "
     "buffer (each payload at offsets[i] of it) or a list of one buffer per key (at offsets[i] of its own); checks "
     "(optional) is CHECK_PATTERN | CHECK_INTEGRITY, run on each hit right after its tag check."},
    {"read_cached", py_read_cached, METH_VARARGS,
     "read_cached(cache, keys, now, peers, dest, offsets, caps, status, lengths, gens[, checks]) -> True "
     "when the LocCache cache held every key and every key was a hit (status, lengths, gens filled, as "
     "read_slots fills them), else None: a key not cached (nothing read), or a read that was anything but "
     "all hits; the caller then reads the batch by its full path."},
    {"table_lookup", py_table_lookup, METH_VARARGS,
     "table_lookup(source, keys, spec, nums, slot_limit, epoch, rows, state) -> (code, epoch, resolved, "
     "first_status, error_text); reads the keys' buckets of a directory table (source: its node's Peer, "
     "or the table's memory) in one batch without the GIL and fills LOC_DTYPE rows and TABLE_* states; "
     "see peercache.node.table_reader.TableReader._native_read."},
    {"table_map", py_table_map, METH_VARARGS,
     "table_map(rows, state, nums, slot_limit, final) -> (unknown, resolved); maps the member numbers "
     "of found rows (after table_lookup returned TABLE_REMAP)."},
    {"key_hashes", py_key_hashes, METH_VARARGS,
     "key_hashes(keys, out): tags.key_hash of each key into the uint64 array out."},
    {"checksum", py_checksum, METH_VARARGS,
     "checksum(buffer, seed) -> the slot checksum (XXH3-64, never 0) of buffer; see peercache.tags.checksum."},
    {"check_tags", py_check_tags, METH_VARARGS,
     "check_tags(tags, locs, want, out) -> count of good tags; out (int32): 0, TAG_MISMATCH or "
     "KEY_MISMATCH per key (the tag check of read_slots, want the key hash of each key asked for)."},
    {"copy_pages", py_copy_pages, METH_VARARGS,
     "copy_pages(src, dst, src_offsets, dst_offsets, length): plain memcpy loop without the GIL."},
    {"page_offsets", py_page_offsets, METH_VARARGS,
     "page_offsets(indices, tokens, stride, bases, limit, out): each page's objects' offsets (bases[j] + "
     "(first token index // tokens) * stride) into out, page by page; ValueError for one past limit."},
    {"trace_start", py_trace_start, METH_O,
     "trace_start(capacity): record timestamps at the read path's and the tcp server's points "
     "(native/trace.h, TRACE_POINTS) until trace_stop; off by default (peercache.trace; the get_trace point kind)."},
    {"trace_stop", py_trace_stop, METH_NOARGS,
     "trace_stop() -> (records, dropped): the records as bytes of TRACE_DTYPE's layout (u64 ns on "
     "CLOCK_MONOTONIC, u64 request id, u32 point, u32 thread id), and how many found no room."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "peercache._native", "GIL-free batch data path of PeerCache.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&PeerType) < 0 || PyType_Ready(&LocCacheType) < 0 ||
        PyType_Ready(&pc_RegionTableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&PeerType);
    PyModule_AddObject(m, "Peer", (PyObject *)&PeerType);
    Py_INCREF(&LocCacheType);
    PyModule_AddObject(m, "LocCache", (PyObject *)&LocCacheType);
    Py_INCREF(&pc_RegionTableType);
    PyModule_AddObject(m, "RegionTable", (PyObject *)&pc_RegionTableType);
    PyModule_AddIntConstant(m, "ABSENT", (long)PC_ABSENT);
    PyModule_AddIntConstant(m, "NEED_PEER", PC_NEED_PEER);
    PyModule_AddIntConstant(m, "TAG_MISMATCH", PC_TAG_MISMATCH);
    PyModule_AddIntConstant(m, "KEY_MISMATCH", PC_KEY_MISMATCH);
    PyModule_AddIntConstant(m, "TOO_BIG", PC_TOO_BIG);
    PyModule_AddIntConstant(m, "CONTENT_MISMATCH", PC_CONTENT_MISMATCH);
    PyModule_AddIntConstant(m, "CHECKSUM_MISMATCH", PC_CHECKSUM_MISMATCH);
    PyModule_AddIntConstant(m, "CHECKSUM_MISSING", PC_CHECKSUM_MISSING);
    PyModule_AddIntConstant(m, "CHECK_PATTERN", PC_CHECK_PATTERN);
    PyModule_AddIntConstant(m, "CHECK_INTEGRITY", PC_CHECK_INTEGRITY);
    PyModule_AddIntConstant(m, "TAG_BYTES", PC_TAG_BYTES);
    PyModule_AddIntConstant(m, "OP_ITEMSIZE", (long)sizeof(pc_op));
    PyModule_AddIntConstant(m, "LOC_ITEMSIZE", (long)sizeof(pc_loc));
    PyModule_AddIntConstant(m, "REQ_OPS", PC_TCP_REQ_OPS);
    PyModule_AddIntConstant(m, "REQ_BYTES", (long)PC_TCP_REQ_BYTES);
    PyModule_AddIntConstant(m, "WINDOW", PC_TCP_WINDOW);
    PyModule_AddIntConstant(m, "TABLE_DONE", PC_TABLE_DONE);
    PyModule_AddIntConstant(m, "TABLE_READ_FAILED", PC_TABLE_READ_FAILED);
    PyModule_AddIntConstant(m, "TABLE_BAD_HEADER", PC_TABLE_BAD_HEADER);
    PyModule_AddIntConstant(m, "TABLE_REMAP", PC_TABLE_REMAP);
    PyModule_AddIntConstant(m, "TABLE_DOUBT", PC_TABLE_DOUBT);
    PyModule_AddIntConstant(m, "TABLE_FOUND", PC_TABLE_FOUND);
    PyModule_AddIntConstant(m, "TABLE_ABSENT", PC_TABLE_ABSENT);
    PyObject *names = PyTuple_New(PC_TR_N);
    if (!names) return NULL;
    for (int i = 0; i < PC_TR_N; i++) PyTuple_SET_ITEM(names, i, PyUnicode_FromString(pc_trace_names[i]));
    PyModule_AddObject(m, "TRACE_POINTS", names);
    PyModule_AddIntConstant(m, "TRACE_RECORD_BYTES", (long)sizeof(pc_trace_rec));
    return m;
}
