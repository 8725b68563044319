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
 * Python oracle). out holds up to n WRs, refused[i] is a status for ops never issued,
 * else -1; load is updated. 0 or -1 (no memory). */
int pv_plan(const pc_op *ops, size_t n, const int32_t *local_numa, size_t nlocal,
            const int32_t *rail_numa, uint64_t *load, size_t nrails, const pv_limits *lim,
            uint32_t channels, pv_wr *out, size_t *nwrs, int32_t *refused);
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
} pv_rail;

pv_rail *pv_rail_open(const char *name, int port, int gid_index, int32_t numa, char *err, size_t errlen);
void pv_rail_ref(pv_rail *r);
void pv_rail_unref(pv_rail *r);
struct ibv_mr *pv_rail_register(pv_rail *r, void *addr, uint64_t len, int32_t numa, int dmabuf_fd,
                                uint64_t dmabuf_offset, char *err, size_t errlen);
int pv_rail_deregister(pv_rail *r, uint64_t addr);
/* lkey and NUMA node of the registration covering [addr, addr+len); 0, or -1 if none. */
int pv_rail_lookup(pv_rail *r, uint64_t addr, uint64_t len, uint32_t *lkey, int32_t *numa);

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
} pv_conn;

pv_conn *pv_conn_new(pv_rail **rails, size_t nrails, uint32_t nchan, uint32_t sq_depth, double timeout_s,
                     char *err, size_t errlen);
/* RESET -> INIT -> RTR -> RTS of every channel against the peer's QPs (nrails x nchan). */
int pv_conn_connect(pv_conn *c, const pv_remote_qp *remote, uint32_t signal_every, uint32_t max_chain,
                    char *err, size_t errlen);
void pv_conn_close(void *c);
/* Current active MTU (enum ibv_mtu) and LID of a rail's port; the values cached at open if the
 * query fails. 0, or -1 with err set when the port is no longer ACTIVE. */
int pv_rail_port_now(pv_rail *r, int *mtu, uint16_t *lid, char *err, size_t errlen);

extern const pc_backend pc_verbs_backend;

#endif
