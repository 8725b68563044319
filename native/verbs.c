/* RDMA verbs backend: RC QPs per rail and channel, chained one-sided READs.
 *
 * A rail is one device port opened by this process, with one protection
 * domain and the process's memory registrations on it (one key per rail).
 * A connection holds nchan RC QPs per rail, each with its own CQ; a batch
 * takes one idle channel per rail it uses, so threads never share a CQ and
 * completions need no lock. A batch is planned (verbs_plan.c), posted as
 * chains (one ibv_post_send each) with selective signalling, and polled in
 * batches with a deadline; completions are accounted with the rules of
 * peercache/rdma/completion.py. Any error or timeout moves the channel's QP
 * to ERR, waits for the flush of its last posted WR (so the NIC no longer
 * writes into the caller's buffers), and marks the connection dead: its
 * owner drops it and connects again through the control plane (both sides
 * get fresh QPs), which is the channel reset.
 */

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "verbs.h"

#if defined(__has_include)
#if __has_include(<rdma/ib_user_verbs.h>)
#include <rdma/ib_user_verbs.h>
#define PV_HAVE_DOORBELL 1
#endif
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------- rails */

pv_rail *pv_rail_open(const char *name, int port, int gid_index, int32_t numa, char *err, size_t errlen) {
    int num = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num == 0) {
        snprintf(err, errlen, "no RDMA device: ibv_get_device_list returned 0 devices (%s)",
                 errno ? strerror(errno) : "none present");
        if (list) ibv_free_device_list(list);
        return NULL;
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < num; i++)
        if (strcmp(ibv_get_device_name(list[i]), name) == 0) dev = list[i];
    if (!dev) {
        snprintf(err, errlen, "RDMA device %s not found (see ibv_devices)", name);
        ibv_free_device_list(list);
        return NULL;
    }
    pv_rail *r = calloc(1, sizeof *r);
    if (!r) { ibv_free_device_list(list); snprintf(err, errlen, "out of memory"); return NULL; }
    atomic_init(&r->refs, 1);
    atomic_init(&r->outstanding, 0);
    atomic_init(&r->kicks, 0);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->port = port;
    r->gid_index = gid_index;
    r->numa = numa;
    pthread_rwlock_init(&r->mrlock, NULL);
    r->ctx = ibv_open_device(dev);
    ibv_free_device_list(list);
    if (!r->ctx) {
        snprintf(err, errlen, "ibv_open_device(%s): %s", name, strerror(errno));
        goto fail;
    }
    if (ibv_query_device(r->ctx, &r->dev) != 0) {
        snprintf(err, errlen, "ibv_query_device(%s): %s", name, strerror(errno));
        goto fail;
    }
    r->soft_roce = r->dev.vendor_id == PV_RXE_VENDOR_ID;
    if (ibv_query_port(r->ctx, (uint8_t)port, &r->pattr) != 0) {
        snprintf(err, errlen, "%s has no port %d (ibv_query_port: %s); check --ib-port", name, port,
                 strerror(errno));
        goto fail;
    }
    if (r->pattr.state != IBV_PORT_ACTIVE) {
        snprintf(err, errlen, "%s port %d is not ACTIVE (state %d); check the link (ibv_devinfo -d %s)",
                 name, port, (int)r->pattr.state, name);
        goto fail;
    }
    if (gid_index >= 0 && ibv_query_gid(r->ctx, (uint8_t)port, gid_index, &r->gid) != 0) {
        snprintf(err, errlen, "%s port %d has no GID index %d (ibv_query_gid: %s); check --gid-index",
                 name, port, gid_index, strerror(errno));
        goto fail;
    }
    r->pd = ibv_alloc_pd(r->ctx);
    if (!r->pd) {
        snprintf(err, errlen, "ibv_alloc_pd(%s): %s", name, strerror(errno));
        goto fail;
    }
    return r;
fail:
    if (r->ctx) ibv_close_device(r->ctx);
    pthread_rwlock_destroy(&r->mrlock);
    free(r);
    return NULL;
}

int pv_rail_port_now(pv_rail *r, int *mtu, uint16_t *lid, char *err, size_t errlen) {
    struct ibv_port_attr pa;
    if (ibv_query_port(r->ctx, (uint8_t)r->port, &pa) != 0) {
        *mtu = (int)r->pattr.active_mtu;
        *lid = r->pattr.lid;
        return 0;
    }
    if (pa.state != IBV_PORT_ACTIVE) {
        snprintf(err, errlen, "%s port %d is no longer ACTIVE (state %d); check the link (ibv_devinfo -d %s)",
                 r->name, r->port, (int)pa.state, r->name);
        return -1;
    }
    *mtu = (int)pa.active_mtu;
    *lid = pa.lid;
    return 0;
}

void pv_rail_ref(pv_rail *r) { atomic_fetch_add(&r->refs, 1); }

void pv_rail_unref(pv_rail *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    for (size_t i = 0; i < r->nmrs; i++) ibv_dereg_mr(r->mrs[i].mr);
    free(r->mrs);
    if (r->pd) ibv_dealloc_pd(r->pd);
    if (r->ctx) ibv_close_device(r->ctx);
    pthread_rwlock_destroy(&r->mrlock);
    free(r);
}

/* NUMA node of the page at addr (-1 unknown): move_pages with no target queries it. */
static int32_t numa_of(void *addr) {
    void *page = (void *)((uintptr_t)addr & ~(uintptr_t)4095);
    int status = -1;
    if (syscall(SYS_move_pages, 0, 1UL, &page, NULL, &status, 0) != 0 || status < 0) return -1;
    return status;
}

struct ibv_mr *pv_rail_register(pv_rail *r, void *addr, uint64_t len, int32_t numa, int dmabuf_fd,
                                uint64_t dmabuf_offset, char *err, size_t errlen) {
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr;
    if (dmabuf_fd >= 0) {
        mr = ibv_reg_dmabuf_mr(r->pd, dmabuf_offset, len, (uint64_t)(uintptr_t)addr, dmabuf_fd, access);
        if (!mr) {
            snprintf(err, errlen, "ibv_reg_dmabuf_mr on %s: %s (the NIC driver or kernel lacks dma-buf "
                     "support)", r->name, strerror(errno));
            return NULL;
        }
    } else {
        mr = ibv_reg_mr(r->pd, addr, len, access | IBV_ACCESS_RELAXED_ORDERING);
        if (!mr && errno == EINVAL) mr = ibv_reg_mr(r->pd, addr, len, access);
        if (!mr) {
            snprintf(err, errlen, "ibv_reg_mr of %llu bytes on %s: %s%s", (unsigned long long)len, r->name,
                     strerror(errno), errno == ENOMEM || errno == EPERM
                         ? " (raise the locked-memory limit: ulimit -l unlimited)" : "");
            return NULL;
        }
    }
    if (numa < 0 && dmabuf_fd < 0) numa = numa_of(addr);  /* pages are resident once registered */
    pthread_rwlock_wrlock(&r->mrlock);
    if (r->nmrs == r->capmrs) {
        size_t cap = r->capmrs ? r->capmrs * 2 : 8;
        pv_mr *g = realloc(r->mrs, cap * sizeof *g);
        if (!g) {
            pthread_rwlock_unlock(&r->mrlock);
            ibv_dereg_mr(mr);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        r->mrs = g;
        r->capmrs = cap;
    }
    r->mrs[r->nmrs++] = (pv_mr){(uint64_t)(uintptr_t)addr, len, mr, numa};
    pthread_rwlock_unlock(&r->mrlock);
    return mr;
}

int pv_rail_deregister(pv_rail *r, uint64_t addr) {
    int found = 0;
    pthread_rwlock_wrlock(&r->mrlock);
    for (size_t i = 0; i < r->nmrs; i++) {
        if (r->mrs[i].addr != addr) continue;
        ibv_dereg_mr(r->mrs[i].mr);
        r->mrs[i] = r->mrs[--r->nmrs];
        found = 1;
        break;
    }
    pthread_rwlock_unlock(&r->mrlock);
    return found;
}

int pv_rail_lookup(pv_rail *r, uint64_t addr, uint64_t len, uint32_t *lkey, int32_t *numa) {
    int rc = -1;
    pthread_rwlock_rdlock(&r->mrlock);
    for (size_t i = 0; i < r->nmrs; i++) {
        const pv_mr *m = &r->mrs[i];
        if (addr >= m->addr && addr - m->addr <= m->len && len <= m->len - (addr - m->addr)) {
            if (lkey) *lkey = m->mr->lkey;
            if (numa) *numa = m->numa;
            rc = 0;
            break;
        }
    }
    pthread_rwlock_unlock(&r->mrlock);
    return rc;
}

/* -------------------------------------------------------------- connections */

static uint32_t random_psn(void) {
    uint32_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = (uint32_t)(now_s() * 1e6) ^ (uint32_t)getpid();
    return v & 0xFFFFFF;
}

static void chan_free(pv_chan *ch) {
    if (ch->qp) ibv_destroy_qp(ch->qp);
    if (ch->cq) ibv_destroy_cq(ch->cq);
    if (ch->scratch_mr) ibv_dereg_mr(ch->scratch_mr);
    free(ch->scratch);
    memset(ch, 0, sizeof *ch);
}

void pv_conn_close(void *p) {
    pv_conn *c = p;
    if (!c) return;
    if (c->chans)
        for (size_t i = 0; i < c->nrails * c->nchan; i++) chan_free(&c->chans[i]);
    free(c->chans);
    for (size_t r = 0; r < c->nrails; r++) pv_rail_unref(c->rails[r]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

pv_conn *pv_conn_new(pv_rail **rails, size_t nrails, uint32_t nchan, uint32_t sq_depth, double timeout_s,
                     char *err, size_t errlen) {
    if (nrails == 0 || nrails > PV_MAX_RAILS || nchan == 0 || nchan > PV_MAX_CHANNELS) {
        snprintf(err, errlen, "need 1..%d rails and 1..%d channels (got %zu, %u)", PV_MAX_RAILS,
                 PV_MAX_CHANNELS, nrails, nchan);
        return NULL;
    }
    pv_conn *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return NULL; }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->nrails = nrails;
    c->nchan = nchan;
    c->timeout_s = timeout_s > 0 ? timeout_s : 5.0;
    for (size_t r = 0; r < nrails; r++) { pv_rail_ref(rails[r]); c->rails[r] = rails[r]; }
    c->chans = calloc(nrails * nchan, sizeof *c->chans);
    if (!c->chans) { snprintf(err, errlen, "out of memory"); goto fail; }
    uint32_t rd = UINT32_MAX, sge = PV_MAX_SGE;
    for (size_t r = 0; r < nrails; r++) {
        pv_rail *rl = rails[r];
        uint32_t depth = sq_depth;
        if ((int)depth > rl->dev.max_qp_wr) depth = (uint32_t)rl->dev.max_qp_wr;
        if ((int)depth > rl->dev.max_cqe) depth = (uint32_t)rl->dev.max_cqe;
        if (depth < sq_depth) sq_depth = depth;
        if ((uint32_t)rl->dev.max_qp_init_rd_atom < rd) rd = (uint32_t)rl->dev.max_qp_init_rd_atom;
        if ((uint32_t)rl->dev.max_sge < sge) sge = (uint32_t)rl->dev.max_sge;
    }
    c->lim = (pv_limits){sq_depth, rd ? rd : 1, sge ? sge : 1, 16, 64};
    for (size_t r = 0; r < nrails; r++)
        if (pv_rail_port_now(rails[r], &c->mtu[r], &c->lid[r], err, errlen) != 0) goto fail;
    for (size_t r = 0; r < nrails; r++) {
        for (uint32_t k = 0; k < nchan; k++) {
            pv_chan *ch = &c->chans[r * nchan + k];
            /* One CQ entry per send slot: a CQ overrun would be a fatal async error. */
            ch->cq = ibv_create_cq(rails[r]->ctx, (int)sq_depth + 1, NULL, NULL, 0);
            if (!ch->cq) {
                snprintf(err, errlen, "ibv_create_cq on %s: %s", rails[r]->name, strerror(errno));
                goto fail;
            }
            struct ibv_qp_init_attr ia = {
                .send_cq = ch->cq, .recv_cq = ch->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 0,
                .cap = {.max_send_wr = sq_depth, .max_recv_wr = 1, .max_send_sge = c->lim.max_sge,
                        .max_recv_sge = 1},
            };
            ch->qp = ibv_create_qp(rails[r]->pd, &ia);
            if (!ch->qp) {
                snprintf(err, errlen, "ibv_create_qp (RC, %u send WRs) on %s: %s", sq_depth,
                         rails[r]->name, strerror(errno));
                goto fail;
            }
            struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0,
                                    .port_num = (uint8_t)rails[r]->port,
                                    .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
            if (ibv_modify_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                              IBV_QP_ACCESS_FLAGS) != 0) {
                snprintf(err, errlen, "QP to INIT on %s: %s", rails[r]->name, strerror(errno));
                goto fail;
            }
            ch->psn = random_psn();
        }
    }
    return c;
fail:
    pv_conn_close(c);
    return NULL;
}

int pv_conn_connect(pv_conn *c, const pv_remote_qp *remote, uint32_t signal_every, uint32_t max_chain,
                    char *err, size_t errlen) {
    uint32_t rd = c->lim.max_rd_atom;
    for (size_t r = 0; r < c->nrails; r++) {
        pv_rail *rl = c->rails[r];
        for (uint32_t k = 0; k < c->nchan; k++) {
            pv_chan *ch = &c->chans[r * c->nchan + k];
            const pv_remote_qp *q = &remote[r * c->nchan + k];
            /* The smaller of the two ports' MTUs as they are now (both sides take the minimum). */
            enum ibv_mtu mtu = (enum ibv_mtu)(c->mtu[r] < q->mtu ? c->mtu[r] : q->mtu);
            if (mtu < IBV_MTU_256) mtu = IBV_MTU_256;
            /* Our READs may not exceed what the peer's QP accepts as responder. */
            uint32_t out = rd;
            if (q->rd_atom > 0 && (uint32_t)q->rd_atom < out) out = (uint32_t)q->rd_atom;
            if (out < c->lim.max_rd_atom) c->lim.max_rd_atom = out ? out : 1;
            struct ibv_qp_attr a = {
                .qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = q->qpn, .rq_psn = q->psn,
                .max_dest_rd_atomic = (uint8_t)(rl->dev.max_qp_rd_atom > 0 ? rl->dev.max_qp_rd_atom : 1),
                .min_rnr_timer = 12,
                .ah_attr = {.dlid = q->lid, .sl = 0, .src_path_bits = 0, .port_num = (uint8_t)rl->port},
            };
            if (rl->gid_index >= 0) {
                /* RoCE (and routed IB) needs the GRH: the peer is addressed by its GID. */
                a.ah_attr.is_global = 1;
                memcpy(a.ah_attr.grh.dgid.raw, q->gid, 16);
                a.ah_attr.grh.sgid_index = (uint8_t)rl->gid_index;
                a.ah_attr.grh.hop_limit = 64;
                a.ah_attr.grh.traffic_class = 0;
                a.ah_attr.grh.flow_label = 0;
            }
            if (ibv_modify_qp(ch->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
                snprintf(err, errlen, "QP to RTR on %s (remote qpn %u, mtu %d): %s%s", rl->name, q->qpn,
                         (int)mtu, strerror(errno),
                         rl->gid_index < 0 && rl->pattr.link_layer == IBV_LINK_LAYER_ETHERNET
                             ? "; RoCE needs a GID index (--gid-index)" : "");
                return -1;
            }
            struct ibv_qp_attr s = {
                .qp_state = IBV_QPS_RTS, .sq_psn = ch->psn,
                /* 4.096 us * 2^14 = 67 ms per try, 7 retries: a dead peer shows as
                 * IBV_WC_RETRY_EXC_ERR in about half a second, well inside the poll timeout. */
                .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = (uint8_t)out,
            };
            if (ibv_modify_qp(ch->qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                              IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
                snprintf(err, errlen, "QP to RTS on %s: %s", rl->name, strerror(errno));
                return -1;
            }
        }
    }
    if (signal_every) c->lim.signal_every = signal_every;
    if (max_chain) c->lim.max_chain = max_chain;
    return 0;
}

/* ---------------------------------------------------------------- data path */

/* Soft-RoCE's requester can stall with WRs queued: it checks a condition (a fenced WR waiting
 * for earlier READs, too many unacknowledged PSNs, no READ credit), the completer then retires
 * what it waited for and finds no waiter flag set, and only then does the requester set the
 * flag and go to sleep (rxe_req.c sets wait_fence / wait_psn after its check; nothing orders
 * the two tasks). Nothing wakes it until the next post: the batch would sit until the poll
 * timeout and reset a healthy connection. rdma-core's rxe provider rings its doorbell with an
 * empty post_send command, which just reruns the requester; this sends the same command when
 * a Soft-RoCE channel goes quiet with WRs outstanding. Never used on other devices. */
static int rxe_doorbell(struct ibv_qp *qp) {
#ifdef PV_HAVE_DOORBELL
    struct ib_uverbs_cmd_hdr hdr;
    struct ib_uverbs_post_send cmd;
    struct ib_uverbs_post_send_resp resp;
    uint8_t buf[sizeof hdr + sizeof cmd];
    memset(&cmd, 0, sizeof cmd);
    hdr.command = IB_USER_VERBS_CMD_POST_SEND;
    hdr.in_words = (uint16_t)(sizeof buf / 4);
    hdr.out_words = (uint16_t)(sizeof resp / 4);
    cmd.response = (uint64_t)(uintptr_t)&resp;
    cmd.qp_handle = qp->handle;
    cmd.wr_count = 0;
    cmd.sge_count = 0;
    cmd.wqe_size = sizeof(struct ib_uverbs_send_wr);
    memcpy(buf, &hdr, sizeof hdr);
    memcpy(buf + sizeof hdr, &cmd, sizeof cmd);
    return write(qp->context->cmd_fd, buf, sizeof buf) == (ssize_t)sizeof buf ? 0 : -1;
#else
    (void)qp;
    return -1;
#endif
}

static pv_chan *acquire(pv_conn *c, size_t rail, double deadline) {
    pthread_mutex_lock(&c->mu);
    for (;;) {
        int usable = 0;
        for (uint32_t k = 0; k < c->nchan; k++) {
            pv_chan *ch = &c->chans[rail * c->nchan + k];
            if (ch->broken) continue;
            usable = 1;
            if (!ch->busy) {
                ch->busy = 1;
                pthread_mutex_unlock(&c->mu);
                return ch;
            }
        }
        if (!usable || now_s() > deadline) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void release(pv_conn *c, pv_chan *ch, int broken, const char *why) {
    pthread_mutex_lock(&c->mu);
    ch->busy = 0;
    if (broken) {
        ch->broken = 1;
        if (!atomic_load(&c->dead)) snprintf(c->why, sizeof c->why, "%s", why);
        atomic_store(&c->dead, 1);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int ensure_scratch(pv_rail *r, pv_chan *ch, uint64_t need) {
    if (need <= ch->scratch_len) return 0;
    uint64_t len = ch->scratch_len ? ch->scratch_len : 65536;
    while (len < need) len *= 2;
    if (ch->scratch_mr) ibv_dereg_mr(ch->scratch_mr);
    free(ch->scratch);
    ch->scratch_mr = NULL;
    ch->scratch_len = 0;
    if (posix_memalign((void **)&ch->scratch, 4096, len) != 0) { ch->scratch = NULL; return -1; }
    ch->scratch_mr = ibv_reg_mr(r->pd, ch->scratch, len, IBV_ACCESS_LOCAL_WRITE);
    if (!ch->scratch_mr) { free(ch->scratch); ch->scratch = NULL; return -1; }
    ch->scratch_len = len;
    return 0;
}

typedef struct bounce { uint8_t *dst; const uint8_t *src; uint32_t len; uint32_t wr; } bounce;

/* Per channel of one batch: its WR range and accounting state. */
typedef struct run {
    pv_chan *ch;
    size_t rail;
    size_t first, count;      /* WR index range of this channel */
    size_t posted, retired;   /* WRs posted; WRs retired (positions < retired are accounted) */
    int failed, quiet, active;
    const char *why;
    int wc;
} run;

static const pv_region *find_region(const pv_conn *c, uint32_t id) {
    for (size_t i = 0; i < c->nregions; i++)
        if (c->regions[i].id == id) return &c->regions[i];
    return NULL;
}

static int verbs_read_batch(void *cp, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                            int32_t *status, char *err, size_t errlen) {
    pv_conn *c = cp;
    int rc = 0;
    if (atomic_load(&c->dead)) {
        for (size_t i = 0; i < n; i++) status[i] = PC_CONNECTION;
        snprintf(err, errlen, "rdma connection was reset after an error (%s); it is reconnected on the "
                 "next batch", c->why);
        return -1;
    }
    pc_op *v = malloc(n * sizeof *v);
    size_t *where = malloc(n * sizeof *where);
    int32_t *lnuma = malloc((nlocals ? nlocals : 1) * sizeof *lnuma);
    pv_wr *wrs = malloc(n * sizeof *wrs);
    int32_t *refused = malloc(n * sizeof *refused), *wst = malloc(n * sizeof *wst), *vst = malloc(n * sizeof *vst);
    struct ibv_send_wr *sw = calloc(n ? n : 1, sizeof *sw);
    struct ibv_sge *sg = calloc(n ? n : 1, sizeof *sg);   /* one SGE per op at most */
    bounce *bn = malloc(n * sizeof *bn);
    run runs[PV_MAX_RAILS];
    size_t nruns = 0, nb = 0;
    memset(runs, 0, sizeof runs);
    if (!v || !where || !lnuma || !wrs || !refused || !wst || !vst || !sw || !sg || !bn) {
        for (size_t i = 0; i < n; i++) status[i] = PC_CONNECTION;
        snprintf(err, errlen, "out of memory planning %zu reads", n);
        rc = -1;
        goto out;
    }
    /* 1. The remote side (region, capability, range) and local registration. */
    pv_rail *r0 = c->rails[0];
    for (size_t j = 0; j < nlocals; j++) {
        lnuma[j] = -1;
        pv_rail_lookup(r0, (uint64_t)(uintptr_t)locals[j].base, locals[j].len, NULL, &lnuma[j]);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const pc_op *op = &ops[i];
        const pv_region *rg = find_region(c, op->region);
        if (!rg || rg->cap != op->rkey) { status[i] = PC_BAD_REGION; continue; }
        if (op->remote_offset > rg->size || op->length > rg->size - op->remote_offset) {
            status[i] = PC_OUT_OF_RANGE;
            continue;
        }
        uint64_t a = (uint64_t)(uintptr_t)(locals[op->local_region].base + op->local_offset);
        if (op->length > PV_BOUNCE_MAX && pv_rail_lookup(r0, a, op->length, NULL, NULL) != 0) {
            status[i] = PC_LOCAL_RANGE;
            if (!err[0])
                snprintf(err, errlen, "destination %#llx (+%llu B) is not registered with the rdma "
                         "transport; register the receive buffer first", (unsigned long long)a,
                         (unsigned long long)op->length);
            continue;
        }
        v[m] = *op;
        where[m++] = i;
    }
    if (!m) { rc = err[0] ? -1 : 0; goto out; }

    /* 2. Plan over the rails with their current load (bytes in flight from every thread). */
    int32_t rnuma[PV_MAX_RAILS];
    uint64_t load[PV_MAX_RAILS];
    for (size_t r = 0; r < c->nrails; r++) {
        rnuma[r] = c->rails[r]->numa;
        load[r] = atomic_load(&c->rails[r]->outstanding);
    }
    size_t nw = 0;
    if (pv_plan(v, m, lnuma, nlocals, rnuma, load, c->nrails, &c->lim, 1, wrs, &nw, refused) != 0) {
        for (size_t i = 0; i < m; i++) status[where[i]] = PC_CONNECTION;
        snprintf(err, errlen, "out of memory planning %zu reads", m);
        rc = -1;
        goto out;
    }
    double deadline = now_s() + c->timeout_s;
    /* 3. One channel per rail used; WRs of a channel are one contiguous range. */
    for (size_t w = 0; w < nw; w++) {
        if (nruns && runs[nruns - 1].rail == wrs[w].rail) { runs[nruns - 1].count++; continue; }
        runs[nruns] = (run){.rail = wrs[w].rail, .first = w, .count = 1};
        nruns++;
    }
    for (size_t k = 0; k < nruns; k++) {
        run *u = &runs[k];
        u->ch = acquire(c, u->rail, deadline);
        if (!u->ch) {
            u->failed = 1;
            u->quiet = 1;
            u->why = "no usable channel on this rail (all reset, or busy past the timeout)";
        }
    }
    /* 4. Work requests and scatter lists. */
    uint64_t bounce_need[PV_MAX_RAILS] = {0};
    for (size_t k = 0; k < nruns; k++) {
        run *u = &runs[k];
        if (u->failed) continue;
        pv_rail *rl = c->rails[u->rail];
        for (size_t w = u->first; w < u->first + u->count; w++)
            for (uint32_t s = 0; s < wrs[w].nsge; s++) {
                const pc_op *op = &v[wrs[w].op[s]];
                uint64_t a = (uint64_t)(uintptr_t)(locals[op->local_region].base + op->local_offset);
                if (pv_rail_lookup(rl, a, op->length, NULL, NULL) != 0) bounce_need[k] += (op->length + 7) & ~7ull;
            }
        if (bounce_need[k] && ensure_scratch(rl, u->ch, bounce_need[k]) != 0) {
            u->failed = 1;
            u->quiet = 1;
            u->why = "cannot register bounce scratch";
        }
    }
    size_t nsg = 0;
    for (size_t k = 0; k < nruns; k++) {
        run *u = &runs[k];
        uint64_t boff = 0;
        pv_rail *rl = c->rails[u->rail];
        if (!u->failed) u->ch->epoch++;
        uint64_t bytes = 0;
        for (size_t w = u->first; w < u->first + u->count; w++) {
            wst[w] = PC_CONNECTION;
            if (u->failed) continue;
            const pv_wr *p = &wrs[w];
            const pv_region *rg = find_region(c, p->region);
            struct ibv_send_wr *x = &sw[w];
            x->wr_id = ((uint64_t)u->ch->epoch << PV_WR_INDEX_BITS) | (uint64_t)w;
            x->opcode = IBV_WR_RDMA_READ;
            x->send_flags = (p->signaled ? IBV_SEND_SIGNALED : 0) | (p->fence ? IBV_SEND_FENCE : 0);
            x->wr.rdma.remote_addr = rg->addr[u->rail] + p->remote_offset;
            x->wr.rdma.rkey = rg->rkey[u->rail];
            x->sg_list = &sg[nsg];
            x->num_sge = (int)p->nsge;
            x->next = NULL;
            for (uint32_t s = 0; s < p->nsge; s++) {
                const pc_op *op = &v[p->op[s]];
                uint8_t *dst = locals[op->local_region].base + op->local_offset;
                uint32_t lkey;
                if (pv_rail_lookup(rl, (uint64_t)(uintptr_t)dst, op->length, &lkey, NULL) == 0) {
                    sg[nsg++] = (struct ibv_sge){(uint64_t)(uintptr_t)dst, (uint32_t)op->length, lkey};
                } else {
                    uint8_t *tmp = u->ch->scratch + boff;
                    sg[nsg++] = (struct ibv_sge){(uint64_t)(uintptr_t)tmp, (uint32_t)op->length,
                                                 u->ch->scratch_mr->lkey};
                    bn[nb++] = (bounce){dst, tmp, (uint32_t)op->length, (uint32_t)w};
                    boff += (op->length + 7) & ~7ull;
                }
            }
            bytes += p->length;
            /* Chain: the next WR of the same chain follows in the array. */
            if (w + 1 < u->first + u->count && wrs[w + 1].chain == p->chain) x->next = &sw[w + 1];
        }
        if (!u->failed) { u->active = 1; atomic_fetch_add(&rl->outstanding, bytes); }
    }
    /* 5. Post chains within the send-queue window, poll completions in batches. */
    struct ibv_wc wc[PV_POLL_BATCH];
    uint32_t depth = c->lim.sq_depth;
    double last_progress = now_s(), last_kick = last_progress;
    unsigned spins = 0;
    for (;;) {
        int pending = 0, progress = 0;
        for (size_t k = 0; k < nruns; k++) {
            run *u = &runs[k];
            if (u->quiet) continue;
            pending = 1;
            while (!u->failed && u->posted < u->count) {
                size_t s = u->posted, e = s;
                while (e < u->count && wrs[u->first + e].chain == wrs[u->first + s].chain) e++;
                if ((u->posted - u->retired) + (e - s) > depth) break;
                struct ibv_send_wr *bad = NULL;
                int prc = ibv_post_send(u->ch->qp, &sw[u->first + s], &bad);
                if (prc != 0) {
                    /* Nothing at or after bad was queued; what was posted still completes. */
                    size_t got = bad ? (size_t)(bad - &sw[u->first]) : s;
                    u->posted = got;
                    u->failed = 1;
                    u->why = "ibv_post_send failed";
                    u->wc = -prc;
                    struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
                    ibv_modify_qp(u->ch->qp, &ea, IBV_QP_STATE);
                    break;
                }
                u->posted = e;
                progress = 1;
            }
            int got = ibv_poll_cq(u->ch->cq, PV_POLL_BATCH, wc);
            if (got < 0) {
                u->failed = 1;
                u->quiet = 1;
                u->why = "ibv_poll_cq failed";
                continue;
            }
            for (int j = 0; j < got; j++) {
                uint64_t id = wc[j].wr_id;
                size_t w = (size_t)(id & ((1ull << PV_WR_INDEX_BITS) - 1));
                if ((uint16_t)(id >> PV_WR_INDEX_BITS) != u->ch->epoch || w < u->first ||
                    w >= u->first + u->count)
                    continue;   /* a late completion of an earlier batch */
                size_t p = w - u->first;
                progress = 1;
                if (u->failed) {
                    /* Waiting for the flush of the last posted WR: the QP is quiet after it. */
                    if (p + 1 >= u->posted) u->quiet = 1;
                    continue;
                }
                if (p < u->retired) continue;
                if (wc[j].status == IBV_WC_SUCCESS) {
                    for (size_t q = u->retired; q <= p; q++) wst[u->first + q] = PC_OK;
                    u->retired = p + 1;
                    continue;
                }
                if (wc[j].status != IBV_WC_WR_FLUSH_ERR)
                    for (size_t q = u->retired; q < p; q++) wst[u->first + q] = PC_OK;
                wst[w] = pv_wc_status(wc[j].status);
                u->retired = u->count;
                u->failed = 1;
                u->wc = wc[j].status;
                u->why = ibv_wc_status_str(wc[j].status);
                if (p + 1 >= u->posted) {
                    u->quiet = 1;
                } else {
                    struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
                    ibv_modify_qp(u->ch->qp, &ea, IBV_QP_STATE);
                }
            }
            if (!u->failed && u->retired == u->count) u->quiet = 1;
            if (u->failed && u->posted == 0) u->quiet = 1;
        }
        if (!pending) break;
        if (progress) {
            last_progress = now_s();
            spins = 0;
            continue;
        }
        if (++spins % 256 == 0) {
            double t = now_s();
            if (t - last_progress > PV_KICK_S && t - last_kick > PV_KICK_S) {
                last_kick = t;
                for (size_t k = 0; k < nruns; k++) {
                    run *u = &runs[k];
                    pv_rail *rl = c->rails[u->rail];
                    if (rl->soft_roce && !u->quiet && !u->failed && u->posted > u->retired &&
                        rxe_doorbell(u->ch->qp) == 0)
                        atomic_fetch_add(&rl->kicks, 1);
                }
            }
            if (t - last_progress > c->timeout_s) {
                /* Nothing moved for the whole timeout: fail the channels still busy, flush
                 * their QPs and give the flush a short bounded wait. */
                int again = 0;
                for (size_t k = 0; k < nruns; k++) {
                    run *u = &runs[k];
                    if (u->quiet) continue;
                    if (!u->failed) {
                        u->failed = 1;
                        u->why = "no completion within the poll timeout";
                        struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
                        ibv_modify_qp(u->ch->qp, &ea, IBV_QP_STATE);
                        again = 1;
                    } else {
                        u->quiet = 1;   /* the flush did not come either: give up, never hang */
                    }
                }
                last_progress = again ? t - c->timeout_s + 1.0 : t;  /* 1 s for the flush */
            }
            sched_yield();
        }
    }
    /* 6. Statuses: per op the first failing WR; bounce copies of good WRs. */
    for (size_t i = 0; i < m; i++) vst[i] = refused[i] >= 0 ? refused[i] : PC_OK;
    for (size_t w = 0; w < nw; w++)
        for (uint32_t s = 0; s < wrs[w].nsge; s++) {
            uint32_t o = wrs[w].op[s];
            if (vst[o] == PC_OK && wst[w] != PC_OK) vst[o] = wst[w];
        }
    for (size_t b = 0; b < nb; b++)
        if (wst[bn[b].wr] == PC_OK) memcpy(bn[b].dst, bn[b].src, bn[b].len);
    for (size_t i = 0; i < m; i++) status[where[i]] = vst[i];
    for (size_t k = 0; k < nruns; k++) {
        run *u = &runs[k];
        if (u->failed && !err[0])
            snprintf(err, errlen, "%s rail %zu: %s (wc %d)", c->rails[u->rail]->name, u->rail,
                     u->why ? u->why : "failed", u->wc);
        if (u->failed) rc = -1;
        if (u->active) {
            uint64_t bytes = 0;
            for (size_t w = u->first; w < u->first + u->count; w++) bytes += wrs[w].length;
            atomic_fetch_sub(&c->rails[u->rail]->outstanding, bytes);
        }
        if (u->ch) release(c, u->ch, u->failed, err);
    }
out:
    free(v); free(where); free(lnuma); free(wrs); free(refused); free(wst); free(vst); free(sw); free(sg); free(bn);
    return rc;
}

static int verbs_alive(void *cp) {
    pv_conn *c = cp;
    return !atomic_load(&c->dead);
}

static void *verbs_connect_unused(const void *params, char *err, size_t errlen) {
    (void)params;
    snprintf(err, errlen, "verbs connections are made by peercache._verbs.Channels");
    return NULL;
}

const pc_backend pc_verbs_backend = {
    .name = "rdma",
    .connect = verbs_connect_unused,
    .read_batch = verbs_read_batch,
    .alive = verbs_alive,
    .close = pv_conn_close,
};
