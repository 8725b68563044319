/* RDMA verbs backend: RC QPs per rail and channel, chained one-sided READs.
 *
 * A rail is one device port opened by this process, with one protection
 * domain and the process's memory registrations on it (one key per rail).
 * A connection holds nchan RC QPs per rail, each with its own CQ; a batch
 * takes one idle channel per rail it uses, so threads never share a CQ and
 * completions need no lock. A batch is planned (verbs_plan.c), posted as
 * chains (one ibv_post_send each) with selective signalling, and polled in
 * batches with a deadline; completions are accounted with the rules of
 * poll_run() below (tests/oracles/rdma_completion.py is their Python
 * oracle). Any error or timeout moves the channel's QP to ERR, waits for the
 * flush of its last posted WR (so the NIC no longer writes into the caller's
 * buffers), and marks the connection dead: its owner drops it and connects
 * again through the control plane (both sides get fresh QPs), which is the
 * channel reset.
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

#include "clock.h"
#include "verbs.h"

#if defined(__has_include)
#if __has_include(<rdma/ib_user_verbs.h>)
#include <rdma/ib_user_verbs.h>
#define PV_HAVE_DOORBELL 1
#endif
#endif

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
    pv_rail_state_init(r);
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
    if (pv_rail_watch(r, err, errlen) != 0) goto fail;
    return r;
fail:
    pv_rail_unwatch(r);
    if (r->pd) ibv_dealloc_pd(r->pd);
    if (r->ctx) ibv_close_device(r->ctx);
    pthread_rwlock_destroy(&r->mrlock);
    pthread_mutex_destroy(&r->smu);
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
    pv_rail_unwatch(r);
    for (size_t i = 0; i < r->nmrs; i++) ibv_dereg_mr(r->mrs[i].mr);
    free(r->mrs);
    if (r->pd) ibv_dealloc_pd(r->pd);
    if (r->ctx) ibv_close_device(r->ctx);
    pthread_rwlock_destroy(&r->mrlock);
    pthread_mutex_destroy(&r->smu);
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
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = (uint32_t)(pc_mono_s() * 1e6) ^ (uint32_t)getpid();
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
    if (c->reader)
        for (size_t r = 0; r < c->nrails; r++) atomic_fetch_sub(&c->rails[r]->readers, 1);
    if (c->chans)
        for (size_t i = 0; i < c->nrails * c->nchan; i++) chan_free(&c->chans[i]);
    free(c->chans);
    for (size_t r = 0; r < c->nrails; r++) pv_rail_unref(c->rails[r]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

void pv_conn_reader(pv_conn *c) {
    if (c->reader) return;
    c->reader = 1;
    for (size_t r = 0; r < c->nrails; r++) atomic_fetch_add(&c->rails[r]->readers, 1);
}

/* "rxe_b0: up; rxe_b1: down (...)" of every rail of c, into buf. */
static void describe_rails(pv_conn *c, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (size_t r = 0; r < c->nrails && at + 1 < len; r++) {
        char one[320];
        pv_rail_describe(c->rails[r], one, sizeof one);
        if (pv_rail_up(c->rails[r]) && atomic_load(&c->failed[r])) {
            double in = (double)atomic_load(&c->retry_us[r]) / 1e6 - pc_mono_s();
            snprintf(one, sizeof one, "%s: up, but READs to this peer failed on it (%s); fresh QPs %s",
                     c->rails[r]->name, c->fail_why[r] ? c->fail_why[r] : "transport error",
                     in > 0 ? "after its wait" : "on the next connection");
        }
        int w = snprintf(buf + at, len - at, "%s%s", r ? "; " : "", one);
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* Takes rail r out of this connection's plans for now (c->mu held, or c not yet shared): its
 * QPs failed with a transport error (why: a static string). Fresh QPs come with the next
 * connection, which verbs_stale asks for once the rail's wait is over and its port is not
 * down. A port that is no longer ACTIVE takes the rail down for every connection. */
static void path_fail(pv_conn *c, size_t r, const char *why) {
    pv_rail *rl = c->rails[r];
    pv_rail_check_port(rl);
    if (atomic_load(&c->failed[r])) return;
    double wait = pv_rail_next_backoff(rl);
    atomic_store(&c->retry_us[r], (uint64_t)((pc_mono_s() + wait) * 1e6));
    c->fail_why[r] = why;
    atomic_store(&c->failed[r], 1);
    atomic_fetch_add(&c->nfailed, 1);
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
    c->timeout_s = timeout_s;   /* positive: checked by the caller (verbs_module.c) */
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
    /* A rail whose port is not ACTIVE still gets its QPs (the peer expects nrails x nchan),
     * but it is down: no plan uses it until its port is back and a probe read succeeded. */
    size_t active = 0;
    for (size_t r = 0; r < nrails; r++) {
        if (pv_rail_port_now(rails[r], &c->mtu[r], &c->lid[r], err, errlen) == 0) {
            active++;
            continue;
        }
        c->mtu[r] = (int)rails[r]->pattr.active_mtu;
        c->lid[r] = rails[r]->pattr.lid;
        pv_rail_check_port(rails[r]);
    }
    if (!active) {
        char all[PV_MAX_RAILS * 200];
        describe_rails(c, all, sizeof all);
        snprintf(err, errlen, "no rail's port is ACTIVE (%s); check the links (ibv_devinfo, ip link)", all);
        goto fail;
    }
    err[0] = '\0';
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

/* Channel k of rail r: RESET -> INIT was done at creation; RTR and RTS against the peer's QP q. */
static int chan_connect(pv_conn *c, size_t r, uint32_t k, const pv_remote_qp *q, uint32_t rd, char *err,
                        size_t errlen) {
    pv_rail *rl = c->rails[r];
    pv_chan *ch = &c->chans[r * c->nchan + k];
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
    return 0;
}

int pv_conn_connect(pv_conn *c, const pv_remote_qp *remote, uint32_t signal_every, uint32_t max_chain,
                    char *err, size_t errlen) {
    uint32_t rd = c->lim.max_rd_atom;
    for (size_t r = 0; r < c->nrails; r++) {
        for (uint32_t k = 0; k < c->nchan; k++) {
            if (chan_connect(c, r, k, &remote[r * c->nchan + k], rd, err, errlen) == 0) continue;
            /* A rail whose port left ACTIVE is down, not a failed connection: its channels are
             * unusable until the next connection, the other rails carry the reads. */
            if (pv_rail_check_port(c->rails[r]) != 0) return -1;
            for (uint32_t j = 0; j < c->nchan; j++) c->chans[r * c->nchan + j].broken = 1;
            path_fail(c, r, "its port was not ACTIVE when the connection was made");
            err[0] = '\0';
            break;
        }
    }
    if ((size_t)atomic_load(&c->nfailed) == c->nrails) {
        char all[PV_MAX_RAILS * 200];
        describe_rails(c, all, sizeof all);
        snprintf(err, errlen, "no rail could be connected (%s); check the links (ibv_devinfo, ip link)", all);
        return -1;
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
        if (!usable || pc_mono_s() > deadline) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Gives channel ch of rail r back. A broken one is never used again (its QP is in ERR; the
 * connection's replacement brings fresh QPs: the channel reset, counted on the rail). Broken
 * by a transport error (path), it takes the rail out of this connection's plans; broken by
 * anything else, it kills the connection, with why as the reason. */
static void release(pv_conn *c, pv_chan *ch, size_t r, int broken, int path, const char *why) {
    pthread_mutex_lock(&c->mu);
    ch->busy = 0;
    if (broken) {
        ch->broken = 1;
        pv_count(&c->rails[r]->n.qp_resets, 1);
        if (path) {
            path_fail(c, r, why);
        } else {
            if (!atomic_load(&c->dead)) snprintf(c->why, sizeof c->why, "%s", why);
            atomic_store(&c->dead, 1);
        }
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
    int path;                 /* failed by a transport error: the rail, not the ops (failover) */
    int abandoned;            /* quiet without the flush of its last WR: its reads may still land */
    const char *why;          /* a static string */
    int wc;
} run;

/* One call of verbs_read_batch: its arguments, the ops that passed the
 * checks, their plan, and the runs that carry it. The phases below fill it
 * in order; batch_free releases what batch_alloc took. */
typedef struct batch {
    pv_conn *c;
    const pc_op *ops;
    size_t n;
    const pc_local *locals;
    size_t nlocals;
    int32_t *status;          /* the caller's, one per op */
    char *err;
    size_t errlen;
    pc_op *v;                 /* the ops that passed phase 1 ... */
    size_t *where;            /* ... and the index of each in ops */
    size_t m;
    int32_t *lnuma;           /* NUMA node of each local buffer (-1 unknown) */
    pv_wr *wrs;               /* the plan: nw READs over v */
    size_t nw;
    int32_t *refused;         /* per op of v: a status the planner gave it, else -1 */
    int32_t *wst, *vst;       /* status per WR, per op of v */
    struct ibv_send_wr *sw;   /* one per WR */
    struct ibv_sge *sg;       /* one SGE per op at most */
    bounce *bn;               /* copies out of bounce scratch once a WR succeeded */
    size_t nb;
    run runs[PV_MAX_RAILS];
    size_t nruns;
    double deadline;          /* for taking channels */
    int norail;               /* no rail could carry some ops (err says why) */
    int unretried;            /* a run failed that failover does not read again */
} batch;

static const pv_region *find_region(const pv_conn *c, uint32_t id) {
    for (size_t i = 0; i < c->nregions; i++)
        if (c->regions[i].id == id) return &c->regions[i];
    return NULL;
}

/* Moves the channel's QP to ERR: what it still has queued completes as flushed. */
static void qp_to_err(pv_chan *ch) {
    struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
    ibv_modify_qp(ch->qp, &ea, IBV_QP_STATE);
}

/* Takes the working arrays of a batch of n ops. 0, or -1 with every status
 * PC_CONNECTION and err set (what was taken is freed by batch_free). */
static int batch_alloc(batch *b) {
    size_t n = b->n;
    b->v = malloc(n * sizeof *b->v);
    b->where = malloc(n * sizeof *b->where);
    b->lnuma = malloc((b->nlocals ? b->nlocals : 1) * sizeof *b->lnuma);
    b->wrs = malloc(n * sizeof *b->wrs);
    b->refused = malloc(n * sizeof *b->refused);
    b->wst = malloc(n * sizeof *b->wst);
    b->vst = malloc(n * sizeof *b->vst);
    b->sw = calloc(n ? n : 1, sizeof *b->sw);
    b->sg = calloc(n ? n : 1, sizeof *b->sg);
    b->bn = malloc(n * sizeof *b->bn);
    if (b->v && b->where && b->lnuma && b->wrs && b->refused && b->wst && b->vst && b->sw && b->sg && b->bn)
        return 0;
    for (size_t i = 0; i < n; i++) b->status[i] = PC_CONNECTION;
    snprintf(b->err, b->errlen, "out of memory planning %zu reads", n);
    return -1;
}

static void batch_free(batch *b) {
    free(b->v); free(b->where); free(b->lnuma); free(b->wrs); free(b->refused); free(b->wst); free(b->vst);
    free(b->sw); free(b->sg); free(b->bn);
}

/* Phase 1: the remote side (region, capability, range) and local
 * registration of every op. An op that fails gets its status here (a
 * destination that is not registered also sets err); the others go to v,
 * in order. Returns how many went (m). */
static size_t batch_check(batch *b) {
    pv_conn *c = b->c;
    pv_rail *r0 = c->rails[0];
    for (size_t j = 0; j < b->nlocals; j++) {
        b->lnuma[j] = -1;
        pv_rail_lookup(r0, (uint64_t)(uintptr_t)b->locals[j].base, b->locals[j].len, NULL, &b->lnuma[j]);
    }
    size_t m = 0;
    for (size_t i = 0; i < b->n; i++) {
        const pc_op *op = &b->ops[i];
        const pv_region *rg = find_region(c, op->region);
        if (!rg || rg->cap != op->rkey) { b->status[i] = PC_BAD_REGION; continue; }
        if (op->remote_offset > rg->size || op->length > rg->size - op->remote_offset) {
            b->status[i] = PC_OUT_OF_RANGE;
            continue;
        }
        uint64_t a = (uint64_t)(uintptr_t)(b->locals[op->local_region].base + op->local_offset);
        if (op->length > PV_BOUNCE_MAX && pv_rail_lookup(r0, a, op->length, NULL, NULL) != 0) {
            b->status[i] = PC_LOCAL_RANGE;
            if (!b->err[0])
                snprintf(b->err, b->errlen, "destination %#llx (+%llu B) is not registered with the rdma "
                         "transport; register the receive buffer first", (unsigned long long)a,
                         (unsigned long long)op->length);
            continue;
        }
        b->v[m] = *op;
        b->where[m++] = i;
    }
    return m;
}

/* Phase 2: plans the m ops of v over the rails that are up and not failed
 * on this connection, with their current load (bytes in flight from every
 * thread), into wrs. Ops no rail can carry are refused (PC_CONNECTION) and
 * err names every rail and its state. 0, or -1 with the statuses of those
 * ops PC_CONNECTION and err set (out of memory). */
static int batch_plan(batch *b) {
    pv_conn *c = b->c;
    int32_t rnuma[PV_MAX_RAILS];
    uint64_t load[PV_MAX_RAILS];
    uint8_t up[PV_MAX_RAILS];
    for (size_t r = 0; r < c->nrails; r++) {
        rnuma[r] = c->rails[r]->numa;
        load[r] = atomic_load(&c->rails[r]->outstanding);
        /* A rail this connection still probes waits: the probe holds one of its channels. */
        up[r] = pv_rail_up(c->rails[r]) && !atomic_load_explicit(&c->failed[r], memory_order_relaxed) &&
                !atomic_load_explicit(&c->probe_busy[r], memory_order_relaxed);
    }
    b->nw = 0;
    if (pv_plan(b->v, b->m, b->lnuma, b->nlocals, rnuma, load, up, c->nrails, &c->lim, 1, b->wrs, &b->nw,
                b->refused) != 0) {
        for (size_t i = 0; i < b->m; i++) b->status[b->where[i]] = PC_CONNECTION;
        snprintf(b->err, b->errlen, "out of memory planning %zu reads", b->m);
        return -1;
    }
    for (size_t i = 0; i < b->m && !b->norail; i++)
        if (b->refused[i] == PC_CONNECTION) b->norail = 1;
    if (b->norail && !b->err[0]) {
        char all[PV_MAX_RAILS * 200];
        describe_rails(c, all, sizeof all);
        snprintf(b->err, b->errlen, "no rail can carry these reads: %s; check the links (ibv_devinfo, ip link)",
                 all);
    }
    return 0;
}

/* Phase 3: one run per rail used, its WRs one contiguous range of the plan,
 * each with a channel of its own taken before the deadline. A run that gets
 * none is failed and quiet: its WRs are never posted. */
static void batch_acquire(batch *b) {
    for (size_t w = 0; w < b->nw; w++) {
        run *last = b->nruns ? &b->runs[b->nruns - 1] : NULL;
        if (last && last->rail == b->wrs[w].rail) { last->count++; continue; }
        b->runs[b->nruns] = (run){.rail = b->wrs[w].rail, .first = w, .count = 1};
        b->nruns++;
    }
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        u->ch = acquire(b->c, u->rail, b->deadline);
        if (!u->ch) {
            u->failed = 1;
            u->quiet = 1;
            u->why = "no usable channel on this rail (all reset, or busy past the timeout)";
        }
    }
}

/* Bytes of bounce scratch run u needs: its ops whose destination is not
 * registered on the run's rail, each rounded up to 8. */
static uint64_t bounce_bytes(const batch *b, const run *u) {
    pv_rail *rl = b->c->rails[u->rail];
    uint64_t need = 0;
    for (size_t w = u->first; w < u->first + u->count; w++)
        for (uint32_t s = 0; s < b->wrs[w].nsge; s++) {
            const pc_op *op = &b->v[b->wrs[w].op[s]];
            uint64_t a = (uint64_t)(uintptr_t)(b->locals[op->local_region].base + op->local_offset);
            if (pv_rail_lookup(rl, a, op->length, NULL, NULL) != 0) need += (op->length + 7) & ~7ull;
        }
    return need;
}

/* The work request of WR w of run u (on its channel's new epoch) and its
 * scatter list, from sg[*nsg] on; a destination that is not registered is
 * read into the channel's scratch at *boff and copied out later (bn). */
static void build_wr(batch *b, run *u, size_t w, size_t *nsg, uint64_t *boff) {
    pv_rail *rl = b->c->rails[u->rail];
    const pv_wr *p = &b->wrs[w];
    const pv_region *rg = find_region(b->c, p->region);
    struct ibv_send_wr *x = &b->sw[w];
    x->wr_id = ((uint64_t)u->ch->epoch << PV_WR_INDEX_BITS) | (uint64_t)w;
    x->opcode = IBV_WR_RDMA_READ;
    x->send_flags = (p->signaled ? IBV_SEND_SIGNALED : 0) | (p->fence ? IBV_SEND_FENCE : 0);
    x->wr.rdma.remote_addr = rg->addr[u->rail] + p->remote_offset;
    x->wr.rdma.rkey = rg->rkey[u->rail];
    x->sg_list = &b->sg[*nsg];
    x->num_sge = (int)p->nsge;
    x->next = NULL;
    for (uint32_t s = 0; s < p->nsge; s++) {
        const pc_op *op = &b->v[p->op[s]];
        uint8_t *dst = b->locals[op->local_region].base + op->local_offset;
        uint32_t lkey;
        if (pv_rail_lookup(rl, (uint64_t)(uintptr_t)dst, op->length, &lkey, NULL) == 0) {
            b->sg[(*nsg)++] = (struct ibv_sge){(uint64_t)(uintptr_t)dst, (uint32_t)op->length, lkey};
        } else {
            uint8_t *tmp = u->ch->scratch + *boff;
            b->sg[(*nsg)++] = (struct ibv_sge){(uint64_t)(uintptr_t)tmp, (uint32_t)op->length,
                                               u->ch->scratch_mr->lkey};
            b->bn[b->nb++] = (bounce){dst, tmp, (uint32_t)op->length, (uint32_t)w};
            *boff += (op->length + 7) & ~7ull;
        }
    }
    /* Chain: the next WR of the same chain follows in the array. */
    if (w + 1 < u->first + u->count && b->wrs[w + 1].chain == p->chain) x->next = &b->sw[w + 1];
}

/* Phase 4: bounce scratch for every run that needs it (a run that cannot
 * have it is failed and quiet), then the work requests and scatter lists.
 * Every WR starts as PC_CONNECTION; a run that is still good becomes active
 * and its bytes count as outstanding on its rail until batch_finish. */
static void batch_build(batch *b) {
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        if (u->failed) continue;
        uint64_t need = bounce_bytes(b, u);
        if (need && ensure_scratch(b->c->rails[u->rail], u->ch, need) != 0) {
            u->failed = 1;
            u->quiet = 1;
            u->why = "cannot register bounce scratch";
        }
    }
    size_t nsg = 0;
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        uint64_t boff = 0, bytes = 0;
        if (!u->failed) u->ch->epoch++;
        for (size_t w = u->first; w < u->first + u->count; w++) {
            b->wst[w] = PC_CONNECTION;
            if (u->failed) continue;
            build_wr(b, u, w, &nsg, &boff);
            bytes += b->wrs[w].length;
        }
        if (!u->failed) { u->active = 1; atomic_fetch_add(&b->c->rails[u->rail]->outstanding, bytes); }
    }
}

/* Posts the next chains of run u that fit in the send-queue window (at most
 * depth WRs posted and not retired). A failed post leaves posted at the
 * first WR that was not queued, fails the run and moves its QP to ERR.
 * Returns 1 if a chain was posted. */
static int post_chains(batch *b, run *u, uint32_t depth) {
    int progress = 0;
    while (!u->failed && u->posted < u->count) {
        size_t s = u->posted, e = s;
        while (e < u->count && b->wrs[u->first + e].chain == b->wrs[u->first + s].chain) e++;
        if ((u->posted - u->retired) + (e - s) > depth) break;
        struct ibv_send_wr *bad = NULL;
        int prc = ibv_post_send(u->ch->qp, &b->sw[u->first + s], &bad);
        if (prc != 0) {
            /* Nothing at or after bad was queued; what was posted still completes. */
            size_t got = bad ? (size_t)(bad - &b->sw[u->first]) : s;
            u->posted = got;
            u->failed = 1;
            u->path = 1;
            u->why = "ibv_post_send failed";
            u->wc = -prc;
            qp_to_err(u->ch);
            break;
        }
        u->posted = e;
        progress = 1;
    }
    return progress;
}

/* One error completion on rail rl, by its status (the last slot takes any larger code). */
static void count_wc(pv_rail *rl, int status) {
    pv_count(&rl->n.wc[status >= 0 && status < PV_WC_CODES ? status : PV_WC_CODES - 1], 1);
}

/* Polls one batch of completions of run u and accounts them (the rules of
 * tests/oracles/rdma_completion.py): a success retires every WR up to it, an
 * error fails the run and flushes its QP, and a failed run is quiet once the
 * flush of its last posted WR came. Completions of earlier batches (another
 * epoch) are skipped. Returns 1 if a completion of this batch came. */
static int poll_run(batch *b, run *u) {
    struct ibv_wc wc[PV_POLL_BATCH];
    int progress = 0;
    int got = ibv_poll_cq(u->ch->cq, PV_POLL_BATCH, wc);
    if (got < 0) {
        u->failed = 1;
        u->quiet = 1;
        u->path = 1;
        u->abandoned = 1;
        u->why = "ibv_poll_cq failed";
        return 0;
    }
    for (int j = 0; j < got; j++) {
        if (wc[j].status != IBV_WC_SUCCESS) count_wc(b->c->rails[u->rail], wc[j].status);
        uint64_t id = wc[j].wr_id;
        size_t w = (size_t)(id & ((1ull << PV_WR_INDEX_BITS) - 1));
        if ((uint16_t)(id >> PV_WR_INDEX_BITS) != u->ch->epoch || w < u->first || w >= u->first + u->count)
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
            for (size_t q = u->retired; q <= p; q++) b->wst[u->first + q] = PC_OK;
            u->retired = p + 1;
            continue;
        }
        if (wc[j].status != IBV_WC_WR_FLUSH_ERR)
            for (size_t q = u->retired; q < p; q++) b->wst[u->first + q] = PC_OK;
        b->wst[w] = pv_wc_status(wc[j].status);
        u->retired = u->count;
        u->failed = 1;
        u->path = b->wst[w] == PC_CONNECTION;   /* the link or the peer, not the op: failover */
        u->wc = wc[j].status;
        u->why = ibv_wc_status_str(wc[j].status);
        if (p + 1 >= u->posted)
            u->quiet = 1;
        else
            qp_to_err(u->ch);
    }
    if (!u->failed && u->retired == u->count) u->quiet = 1;
    if (u->failed && u->posted == 0) u->quiet = 1;
    return progress;
}

/* Soft-RoCE only: rings the doorbell of every channel that has WRs
 * outstanding and no failure (see rxe_doorbell), counting the kicks. */
static void kick_stalled(batch *b) {
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        pv_rail *rl = b->c->rails[u->rail];
        if (rl->soft_roce && !u->quiet && !u->failed && u->posted > u->retired &&
            rxe_doorbell(u->ch->qp) == 0)
            atomic_fetch_add(&rl->kicks, 1);
    }
}

/* Nothing moved for the whole timeout: fails the runs still busy and
 * flushes their QPs; a run already failed whose flush did not come either is
 * given up (quiet), never waited on. Returns the new time of the last
 * progress: 1 s before the timeout ends again if a flush is awaited, else t. */
static double expire_runs(batch *b, double t) {
    int again = 0;
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        if (u->quiet) continue;
        if (!u->failed) {
            u->failed = 1;
            u->path = 1;
            u->why = "no completion within the poll timeout";
            qp_to_err(u->ch);
            again = 1;
        } else {
            u->quiet = 1;   /* the flush did not come either: give up, never hang */
            u->abandoned = 1;
        }
    }
    return again ? t - b->c->timeout_s + 1.0 : t;  /* 1 s for the flush */
}

/* Phase 5: posts chains within the send-queue window and polls completions
 * in batches until every run is quiet (done, or failed and flushed). When
 * nothing moves, Soft-RoCE channels are kicked after PV_KICK_S and the runs
 * still busy are failed after the poll timeout. */
static void batch_poll(batch *b) {
    uint32_t depth = b->c->lim.sq_depth;
    double last_progress = pc_mono_s(), last_kick = last_progress;
    unsigned spins = 0;
    for (;;) {
        int pending = 0, progress = 0;
        for (size_t k = 0; k < b->nruns; k++) {
            run *u = &b->runs[k];
            if (u->quiet) continue;
            pending = 1;
            progress |= post_chains(b, u, depth);
            progress |= poll_run(b, u);
        }
        if (!pending) break;
        if (progress) {
            last_progress = pc_mono_s();
            spins = 0;
            continue;
        }
        if (++spins % 256 == 0) {
            double t = pc_mono_s();
            if (t - last_progress > PV_KICK_S && t - last_kick > PV_KICK_S) {
                last_kick = t;
                kick_stalled(b);
            }
            if (t - last_progress > b->c->timeout_s) last_progress = expire_runs(b, t);
            sched_yield();
        }
    }
}

/* Phase 6: per op the first failing WR's status (or the planner's refusal)
 * into the caller's status; bounce copies of the WRs that succeeded; then
 * every run gives its bytes back to its rail's load and its channel back
 * (a failed run breaks it, with err as the reason). Returns 0, or -1 if a
 * run failed (err then says why, unless it said something already). */
static int batch_finish(batch *b) {
    pv_conn *c = b->c;
    int rc = 0;
    for (size_t i = 0; i < b->m; i++) b->vst[i] = b->refused[i] >= 0 ? b->refused[i] : PC_OK;
    for (size_t w = 0; w < b->nw; w++)
        for (uint32_t s = 0; s < b->wrs[w].nsge; s++) {
            uint32_t o = b->wrs[w].op[s];
            if (b->vst[o] == PC_OK && b->wst[w] != PC_OK) b->vst[o] = b->wst[w];
        }
    for (size_t k = 0; k < b->nb; k++)
        if (b->wst[b->bn[k].wr] == PC_OK) memcpy(b->bn[k].dst, b->bn[k].src, b->bn[k].len);
    for (size_t i = 0; i < b->m; i++) b->status[b->where[i]] = b->vst[i];
    if (b->norail) {
        rc = -1;
        b->unretried = 1;
    }
    for (size_t k = 0; k < b->nruns; k++) {
        run *u = &b->runs[k];
        pv_rail *rl = c->rails[u->rail];
        if (u->failed && !b->err[0])
            snprintf(b->err, b->errlen, "%s rail %zu: %s (wc %d)", rl->name, u->rail,
                     u->why ? u->why : "failed", u->wc);
        if (u->failed) rc = -1;
        if (u->failed && (!u->path || u->abandoned)) b->unretried = 1;
        if (u->active) {
            uint64_t bytes = 0, ok = 0, reads = 0;
            for (size_t w = u->first; w < u->first + u->count; w++) {
                bytes += b->wrs[w].length;
                if (b->wst[w] == PC_OK) { ok += b->wrs[w].length; reads++; }
            }
            atomic_fetch_sub(&rl->outstanding, bytes);
            if (reads) {
                pv_count(&rl->n.bytes, ok);
                pv_count(&rl->n.reads, reads);
            }
            /* The rail works again: the next failure waits the shortest time for fresh QPs. */
            if (!u->failed && atomic_load_explicit(&rl->backed_off, memory_order_relaxed))
                pv_rail_reset_backoff(rl);
        }
        if (u->ch) release(c, u->ch, u->rail, u->failed, u->path, u->path ? u->why : b->err);
    }
    return rc;
}

/* Probe reads: a rail whose port is ACTIVE again (PROBE) comes back when one
 * READ over it succeeds. A batch posts one (a few bytes of the peer's first
 * region into the channel's scratch, on a channel it then holds) and later
 * batches look at it without waiting; success brings the rail up for every
 * connection, failure takes it out of this one until fresh QPs (c->mu held). */
static void probe_post(pv_conn *c, size_t r) {
    pv_rail *rl = c->rails[r];
    const pv_region *rg = NULL;
    for (size_t i = 0; i < c->nregions && !rg; i++)
        if (c->regions[i].size) rg = &c->regions[i];
    pv_chan *ch = NULL;
    for (uint32_t k = 0; k < c->nchan && !ch; k++) {
        pv_chan *x = &c->chans[r * c->nchan + k];
        if (!x->broken && !x->busy) ch = x;
    }
    if (!rg || !ch || ensure_scratch(rl, ch, 64) != 0) return;   /* the next batch tries again */
    ch->epoch++;
    struct ibv_sge sg = {(uint64_t)(uintptr_t)ch->scratch, rg->size < 8 ? (uint32_t)rg->size : 8,
                         ch->scratch_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = ((uint64_t)ch->epoch << PV_WR_INDEX_BITS) | PV_PROBE_WR, .sg_list = &sg,
                             .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = rg->addr[r];
    wr.wr.rdma.rkey = rg->rkey[r];
    struct ibv_send_wr *bad = NULL;
    if (ibv_post_send(ch->qp, &wr, &bad) != 0) {
        ch->broken = 1;
        pv_count(&rl->n.qp_resets, 1);
        path_fail(c, r, "the probe read could not be posted");
        return;
    }
    ch->busy = 1;
    c->probe[r] = ch;
    c->probe_at[r] = pc_mono_s();
    atomic_store(&c->probe_busy[r], 1);
    atomic_fetch_add(&c->probing, 1);
}

static void probe_poll(pv_conn *c, size_t r) {
    pv_rail *rl = c->rails[r];
    pv_chan *ch = c->probe[r];
    struct ibv_wc wc[PV_POLL_BATCH];
    int done = 0;
    const char *why = NULL;
    int got = ibv_poll_cq(ch->cq, PV_POLL_BATCH, wc);
    if (got < 0) {
        done = -1;
        why = "ibv_poll_cq failed on the probe's channel";
    }
    for (int j = 0; j < got; j++) {
        if (wc[j].status != IBV_WC_SUCCESS) count_wc(rl, wc[j].status);
        uint64_t id = wc[j].wr_id;
        if ((uint16_t)(id >> PV_WR_INDEX_BITS) != ch->epoch || (id & PV_PROBE_WR) != PV_PROBE_WR) continue;
        done = wc[j].status == IBV_WC_SUCCESS ? 1 : -1;
        why = ibv_wc_status_str(wc[j].status);
    }
    if (!done) {
        double t = pc_mono_s() - c->probe_at[r];
        if (t > c->timeout_s) {
            qp_to_err(ch);   /* a late completion lands in the channel's own scratch, never reused */
            done = -1;
            why = "no completion of the probe read within the poll timeout";
        } else if (rl->soft_roce && t > PV_KICK_S && rxe_doorbell(ch->qp) == 0) {
            atomic_fetch_add(&rl->kicks, 1);
        }
    }
    if (!done) return;
    c->probe[r] = NULL;
    atomic_store(&c->probe_busy[r], 0);
    atomic_fetch_sub(&c->probing, 1);
    ch->busy = 0;
    if (done > 0) {
        pv_rail_probe_ok(rl);
    } else {
        ch->broken = 1;
        pv_count(&rl->n.qp_resets, 1);
        path_fail(c, r, why);
    }
    pthread_cond_broadcast(&c->cv);
}

static void batch_probes(pv_conn *c) {
    int probing = atomic_load_explicit(&c->probing, memory_order_relaxed);
    for (size_t r = 0; r < c->nrails; r++) {
        int st = atomic_load_explicit(&c->rails[r]->state, memory_order_relaxed);
        if (st != PV_RAIL_PROBE && !probing) continue;
        pthread_mutex_lock(&c->mu);
        if (c->probe[r])
            probe_poll(c, r);
        else if (st == PV_RAIL_PROBE && !atomic_load(&c->failed[r]))
            probe_post(c, r);
        pthread_mutex_unlock(&c->mu);
    }
}

/* Ops of b to read again on the other rails: every op of a unit (verbs_plan.c:
 * ops that must stay on one QP, in order, such as a slot's header, payload and
 * trailer) one of whose ops failed in a run that failover reads again. A unit
 * is read again whole, so its tags and payload come from the same pass. n of
 * them into idx (indices into v). */
static size_t retry_ops(const batch *b, size_t *idx) {
    size_t m = b->m, n = 0;
    uint8_t *mark = calloc(m ? m : 1, 1);
    uint32_t *unit = malloc((m ? m : 1) * sizeof *unit);
    uint8_t *umark = calloc(m ? m : 1, 1);
    if (!mark || !unit || !umark) goto out;
    int retry_rail[PV_MAX_RAILS] = {0};
    for (size_t k = 0; k < b->nruns; k++) {
        const run *u = &b->runs[k];
        if (u->failed && u->path && !u->abandoned) retry_rail[u->rail] = 1;
    }
    for (size_t w = 0; w < b->nw; w++) {
        if (!retry_rail[b->wrs[w].rail]) continue;
        for (uint32_t s = 0; s < b->wrs[w].nsge; s++)
            if (b->vst[b->wrs[w].op[s]] != PC_OK) mark[b->wrs[w].op[s]] = 1;
    }
    pv_units(b->v, m, unit);
    for (size_t i = 0; i < m; i++)
        if (mark[i]) umark[unit[i]] = 1;
    for (size_t i = 0; i < m; i++)
        if (umark[unit[i]] && b->refused[i] < 0) idx[n++] = i;
out:
    free(mark); free(unit); free(umark);
    return n;
}

static int batch_round(pv_conn *c, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                       int32_t *status, char *err, size_t errlen, int may_retry);

/* Failover: the reads of b that failed on a rail by a transport error, read
 * once more over the rails still up (the failed ones are out of this
 * connection's plans now). Their statuses replace the first ones. Returns 0
 * when every op of b ended well (err cleared: the caller sees a batch that
 * succeeded), else -1 with err saying what failed first and what the retry
 * found. */
static int batch_retry(batch *b) {
    size_t *idx = malloc((b->m ? b->m : 1) * sizeof *idx);
    pc_op *ops = malloc((b->m ? b->m : 1) * sizeof *ops);
    int32_t *st = malloc((b->m ? b->m : 1) * sizeof *st);
    char err2[512] = "";
    int rc = -1;
    if (!idx || !ops || !st) goto out;
    size_t n = retry_ops(b, idx);
    if (!n) goto out;
    for (size_t k = 0; k < n; k++) ops[k] = b->v[idx[k]];
    int rc2 = batch_round(b->c, ops, n, b->locals, b->nlocals, st, err2, sizeof err2, 0);
    for (size_t k = 0; k < n; k++) b->status[b->where[idx[k]]] = st[k];
    if (rc2 == 0 && !b->unretried) {
        b->err[0] = '\0';
        rc = 0;
    } else if (rc2 != 0) {
        size_t at = strlen(b->err);
        snprintf(b->err + at, b->errlen - at, "; read again on the other rails: %s", err2[0] ? err2 : "failed");
    }
out:
    free(idx); free(ops); free(st);
    return rc;
}

/* One pass of the six phases above over ops; a pass that may retry reads
 * the ops a transport error failed once more (batch_retry). */
static int batch_round(pv_conn *c, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                       int32_t *status, char *err, size_t errlen, int may_retry) {
    batch b = {.c = c, .ops = ops, .n = n, .locals = locals, .nlocals = nlocals, .status = status,
               .err = err, .errlen = errlen};
    int rc = -1;
    if (batch_alloc(&b) != 0) goto out;
    b.m = batch_check(&b);
    if (!b.m) { rc = err[0] ? -1 : 0; goto out; }
    if (batch_plan(&b) != 0) goto out;
    b.deadline = pc_mono_s() + c->timeout_s;
    batch_acquire(&b);
    batch_build(&b);
    batch_poll(&b);
    rc = batch_finish(&b);
    if (rc != 0 && may_retry) rc = batch_retry(&b);
out:
    batch_free(&b);
    return rc;
}

/* The backend's read_batch: the probes of rails coming back, then one pass
 * over the ops with failover. A connection already dead fails every op at
 * once; out of memory fails the ops it reached; no op left after the checks
 * is a success unless one of them set err. */
static int verbs_read_batch(void *cp, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                            int32_t *status, char *err, size_t errlen, const pc_notify *notify) {
    (void)notify;   /* the bytes land by DMA: read_slots checks them after the batch */
    pv_conn *c = cp;
    if (atomic_load(&c->dead)) {
        for (size_t i = 0; i < n; i++) status[i] = PC_CONNECTION;
        snprintf(err, errlen, "rdma connection was reset after an error (%s); it is reconnected on the "
                 "next batch", c->why);
        return -1;
    }
    batch_probes(c);
    return batch_round(c, ops, n, locals, nlocals, status, err, errlen, 1);
}

/* Whether the connection should be replaced before its next batch: it is
 * dead, or a rail it lost to a transport error (and whose port is not down)
 * may have fresh QPs: its wait is over, or no other rail of the connection
 * can carry reads (then waiting helps nobody: the peer may have restarted).
 * The batch path asks this of every handle (cheap: atomics, the clock only
 * after a failure). */
static int verbs_stale(void *cp) {
    pv_conn *c = cp;
    if (atomic_load_explicit(&c->dead, memory_order_relaxed)) return 1;
    if (!atomic_load_explicit(&c->nfailed, memory_order_relaxed)) return 0;
    uint64_t now = (uint64_t)(pc_mono_s() * 1e6);
    int carrying = 0, waiting = 0;
    for (size_t r = 0; r < c->nrails; r++) {
        int failed = atomic_load(&c->failed[r]), st = atomic_load(&c->rails[r]->state);
        if (!failed && st == PV_RAIL_UP) carrying = 1;
        if (failed && st != PV_RAIL_DOWN) {
            if (now >= atomic_load(&c->retry_us[r])) return 1;
            waiting = 1;
        }
    }
    return waiting && !carrying;
}

static int verbs_alive(void *cp) {
    return !verbs_stale(cp);
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
    .stale = verbs_stale,
    .close = pv_conn_close,
};
