/* Types of the RDMA verbs backend (peercache._verbs): rails, channels, the read plan. */
#ifndef PC_VERBS_H
#define PC_VERBS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "pc.h"

#define PV_MAX_SGE PC_SLOT_MAX_OPS  /* a whole slot read is one READ: tag scratch, destination, tag scratch */
#define PV_MAX_RAILS 16
#define PV_MAX_CHANNELS 64
#define PV_BOUNCE_MAX 64      /* unregistered local ranges up to this size go through scratch */
#define PV_WR_INDEX_BITS 48
#define PV_MAX_READ (1ull << 31)
#define PV_POLL_BATCH 32
#define PV_RXE_VENDOR_ID 0xFFFFFF  /* Soft-RoCE (rdma_rxe) reports this vendor id */
#define PV_KICK_S 0.01             /* Soft-RoCE: ring the doorbell after this long without a completion */
#define PV_WC_CODES 24             /* ibv_wc_status values counted apiece; larger ones count in the last */
#define PV_PORT_CHECK_MS 1000      /* the event thread also queries the port this often */
#define PV_RETRY_MIN_S 1.0         /* first wait before a failed rail gets fresh QPs again ... */
#define PV_RETRY_MAX_S 30.0        /* ... doubling on each failure up to this */
#define PV_PROBE_WR ((1ull << PV_WR_INDEX_BITS) - 1)   /* WR index of a probe read */

/* A rail's state: only UP rails are planned. DOWN: its port left ACTIVE. PROBE: the port is
 * ACTIVE again and the rail waits for one probe read to succeed. */
enum { PV_RAIL_UP = 0, PV_RAIL_DOWN = 1, PV_RAIL_PROBE = 2 };

/* Counters of one rail, cumulative since it was opened: relaxed atomics, added once per run of
 * a batch (bytes, reads) or per event (the rest). */
typedef struct pv_counters {
    atomic_uint_fast64_t bytes, reads, qp_resets, downs, ups;
    atomic_uint_fast64_t wc[PV_WC_CODES];   /* error completions by ibv_wc_status */
} pv_counters;

static inline void pv_count(atomic_uint_fast64_t *c, uint64_t v) {
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* Queue and device limits that shape chains and signalling (Limits of tests/oracles/rdma_plan.py). */
typedef struct pv_limits {
    uint32_t sq_depth, max_rd_atom, max_sge, signal_every, max_chain;
} pv_limits;

/* One planned READ (WorkRequest of tests/oracles/rdma_plan.py). */
typedef struct pv_wr {
    uint32_t rail, channel, region, nsge, signaled, chain;
    uint32_t fence;        /* not the first READ of its unit: IBV_SEND_FENCE */
    uint64_t remote_offset, length;
    uint32_t op[PV_MAX_SGE];
} pv_wr;

uint32_t pv_signal_cadence(const pv_limits *l);
uint32_t pv_chain_length(const pv_limits *l);
/* Plan ops over rails (the rules of verbs_plan.c; tests/oracles/rdma_plan.py is their
 * Python oracle). up[r] says whether rail r may carry reads (NULL: all may); the ops of a
 * unit no rail can carry are refused with PC_CONNECTION. out holds up to n WRs, refused[i]
 * is a status for ops never issued, else -1; load is updated. 0 or -1 (no memory). */
int pv_plan(const pc_op *ops, size_t n, const int32_t *local_numa, size_t nlocal,
            const int32_t *rail_numa, uint64_t *load, const uint8_t *up, size_t nrails,
            const pv_limits *lim, uint32_t channels, pv_wr *out, size_t *nwrs, int32_t *refused);
/* unit[i]: the unit (0, 1, ...) op i belongs to, by the planner's rules. */
void pv_units(const pc_op *ops, size_t n, uint32_t *unit);
/* Per-op status of an ibv_wc_status (peercache.rdma.completion.WC_TO_STATUS). */
int32_t pv_wc_status(int wc);

/* A registered memory range on one rail. */
typedef struct pv_mr {
    uint64_t addr, len;
    struct ibv_mr *mr;
    int32_t numa;
} pv_mr;

/* One device port opened by this process; shared by every connection (refcounted). */
typedef struct pv_rail {
    atomic_int refs;
    char name[64];
    int port, gid_index;
    int32_t numa;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_device_attr dev;
    struct ibv_port_attr pattr;
    union ibv_gid gid;
    pthread_rwlock_t mrlock;
    size_t nmrs, capmrs;
    pv_mr *mrs;
    atomic_uint_fast64_t outstanding;  /* bytes in flight from every thread: the load */
    int soft_roce;                     /* rdma_rxe: its requester can miss a wake-up (see verbs.c) */
    atomic_uint_fast64_t kicks;        /* doorbells rung to restart a stalled requester */
    atomic_int state;                  /* PV_RAIL_*: read on the hot path, changed by verbs_rail.c */
    atomic_int readers;                /* connections handed to the batch path that read over it */
    pthread_mutex_t smu;               /* state changes, why, since, backoff */
    char why[160];                     /* why it went down */
    double since;                      /* when the state last changed (pc_mono_s) */
    double backoff;                    /* seconds before a failed path gets fresh QPs */
    atomic_int backed_off;             /* backoff is above its minimum: a good run resets it */
    pv_counters n;
    pthread_t watcher;                 /* reads the device's async events (verbs_rail.c) */
    int wake_fd, watching;
} pv_rail;

pv_rail *pv_rail_open(const char *name, int port, int gid_index, int32_t numa, char *err, size_t errlen);
void pv_rail_ref(pv_rail *r);
void pv_rail_unref(pv_rail *r);
struct ibv_mr *pv_rail_register(pv_rail *r, void *addr, uint64_t len, int32_t numa, int dmabuf_fd,
                                uint64_t dmabuf_offset, char *err, size_t errlen);
int pv_rail_deregister(pv_rail *r, uint64_t addr);
/* lkey and NUMA node of the registration covering [addr, addr+len); 0, or -1 if none. */
int pv_rail_lookup(pv_rail *r, uint64_t addr, uint64_t len, uint32_t *lkey, int32_t *numa);

/* Rail state, its async-event thread and its description (verbs_rail.c). */
void pv_rail_state_init(pv_rail *r);
int pv_rail_watch(pv_rail *r, char *err, size_t errlen);
void pv_rail_unwatch(pv_rail *r);
void pv_rail_down(pv_rail *r, const char *why);     /* out of every plan; UP -> DOWN counts */
void pv_rail_port_active(pv_rail *r);               /* DOWN -> PROBE (UP if nobody reads over it) */
void pv_rail_probe_ok(pv_rail *r);                  /* PROBE -> UP, counted */
int pv_rail_port_state(pv_rail *r);                 /* enum ibv_port_state now, -1 if unknown */
/* The port now: 1 ACTIVE (a DOWN rail moves on), 0 not (the rail goes down), -1 unknown. */
int pv_rail_check_port(pv_rail *r);
double pv_rail_next_backoff(pv_rail *r);            /* the wait for this failure; doubles the next */
void pv_rail_reset_backoff(pv_rail *r);
/* "rxe_b1: down (why, 2.0 s ago)" into buf. */
void pv_rail_describe(pv_rail *r, char *buf, size_t len);
const char *pv_port_state_name(int state);
static inline int pv_rail_up(pv_rail *r) {
    return atomic_load_explicit(&r->state, memory_order_acquire) == PV_RAIL_UP;
}

/* One RC QP with its own CQ; a batch holds a channel exclusively. */
typedef struct pv_chan {
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint32_t psn;
    uint16_t epoch;
    int busy, broken;
    uint8_t *scratch;
    uint64_t scratch_len;
    struct ibv_mr *scratch_mr;
} pv_chan;

/* What the peer told us about one of its QPs. */
typedef struct pv_remote_qp {
    uint32_t qpn, psn;
    uint8_t gid[16];
    uint16_t lid;
    int mtu;        /* enum ibv_mtu */
    int rd_atom;    /* READs its QP accepts as responder (max_qp_rd_atom) */
} pv_remote_qp;

typedef struct pv_region {
    uint32_t id;
    uint64_t cap;                  /* the capability key of the directory location */
    uint64_t size;
    uint64_t addr[PV_MAX_RAILS];
    uint32_t rkey[PV_MAX_RAILS];
} pv_region;

typedef struct pv_conn {
    size_t nrails;
    uint32_t nchan;
    pv_rail *rails[PV_MAX_RAILS];
    /* Port attributes queried when the connection is made, not when the rail was opened:
     * Soft-RoCE's active MTU follows its netdev's MTU, a LID can change. */
    int mtu[PV_MAX_RAILS];         /* enum ibv_mtu */
    uint16_t lid[PV_MAX_RAILS];
    pv_chan *chans;                /* nrails x nchan, rail-major */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pv_limits lim;
    double timeout_s;
    size_t nregions;
    pv_region regions[PC_SHM_MAX_REGIONS];
    atomic_int dead;
    char why[256];                 /* why it is dead */
    /* Failover: a READ that failed with a transport error on a rail takes that rail out of this
     * connection's plans (its QPs are in ERR); fresh QPs come with the next connection, which
     * the batch path asks for (stale) once the rail's port is ACTIVE and its wait is over. */
    atomic_int failed[PV_MAX_RAILS];
    atomic_int nfailed;
    atomic_uint_fast64_t retry_us[PV_MAX_RAILS];   /* pc_mono_s in microseconds: fresh QPs from then */
    const char *fail_why[PV_MAX_RAILS];            /* a static string (ibv_wc_status_str or ours) */
    /* A probe read in flight on a rail in PROBE state (mu): its channel, held busy, and when. */
    pv_chan *probe[PV_MAX_RAILS];
    atomic_int probe_busy[PV_MAX_RAILS];           /* probe[r] is set: its rail waits for it */
    double probe_at[PV_MAX_RAILS];
    atomic_int probing;                            /* probes in flight */
    int reader;                                    /* counted in its rails' readers */
} pv_conn;

pv_conn *pv_conn_new(pv_rail **rails, size_t nrails, uint32_t nchan, uint32_t sq_depth, double timeout_s,
                     char *err, size_t errlen);
/* RESET -> INIT -> RTR -> RTS of every channel against the peer's QPs (nrails x nchan). */
int pv_conn_connect(pv_conn *c, const pv_remote_qp *remote, uint32_t signal_every, uint32_t max_chain,
                    char *err, size_t errlen);
void pv_conn_close(void *c);
/* The connection reads over its rails from now on (a probe, not a plain UP, brings them back). */
void pv_conn_reader(pv_conn *c);
/* Current active MTU (enum ibv_mtu) and LID of a rail's port; the values cached at open if the
 * query fails. 0, or -1 with err set when the port is no longer ACTIVE. */
int pv_rail_port_now(pv_rail *r, int *mtu, uint16_t *lid, char *err, size_t errlen);

extern const pc_backend pc_verbs_backend;

#endif
