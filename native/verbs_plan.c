/* The read planner of the verbs backend (tests/oracles/rdma_plan.py is its Python oracle,
 * whose docstring states each rule).
 *
 * Ops -> units (ops that must stay on one QP, in order: the header, payload
 * and trailer of a slot read, pc_slot_ops in pc.h) -> rails (only those that
 * are up; NUMA of the destination among them, then least outstanding bytes;
 * a unit no rail can carry is refused with PC_CONNECTION) -> channels (round-robin per
 * rail) -> READs with up to max_sge scatter entries (later READs of a unit
 * fenced) -> chains of at most
 * pv_chain_length WRs, every k-th and the last of a chain signalled. WRs are
 * numbered channel by channel, so a channel's WRs are one contiguous range.
 * tests/engine/transport/test_rdma_verbs.py compares this with the oracle on random batches.
 */
#include <stdlib.h>
#include <string.h>

#include "verbs.h"

uint32_t pv_signal_cadence(const pv_limits *l) {
    uint32_t k = l->signal_every;
    if (l->max_rd_atom < k) k = l->max_rd_atom;
    if (l->sq_depth / 2 < k) k = l->sq_depth / 2;
    return k ? k : 1;
}

uint32_t pv_chain_length(const pv_limits *l) {
    uint32_t k = pv_signal_cadence(l);
    uint32_t half = l->sq_depth / 2 ? l->sq_depth / 2 : 1;
    uint32_t cap = l->max_chain < half ? l->max_chain : half;
    uint32_t c = cap / k * k;
    return c > k ? c : k;
}

/* Whether op i continues the unit whose anchor is f and whose last op is p: 0 no, 1 yes,
 * 2 yes and i becomes the anchor (it continues p remotely in the local buffer of p and f:
 * the header of an adjacent slot, whose trailer must join this unit too; rdma_plan.py units()). */
static int continues(const pc_op *ops, size_t f, size_t p, size_t i) {
    const pc_op *a = &ops[p], *b = &ops[i], *u = &ops[f];
    if (b->region != a->region || b->remote_offset < a->remote_offset + a->length) return 0;
    if (b->remote_offset == a->remote_offset + a->length)
        return b->local_region == a->local_region && b->local_region == u->local_region ? 2 : 1;
    return b->local_region == u->local_region && b->local_offset == u->local_offset + u->length;
}

typedef struct proto {
    uint32_t key;          /* channel ordinal in order of first use */
    uint32_t fence;        /* a later READ of its unit */
    uint32_t nsge;
    uint32_t op[PV_MAX_SGE];
} proto;

void pv_units(const pc_op *ops, size_t n, uint32_t *unit) {
    uint32_t u = 0;
    size_t f = 0;
    for (size_t i = 0; i < n; i++) {
        int c = i ? continues(ops, f, i - 1, i) : 0;
        if (!c) {
            if (i) u++;
            f = i;
        } else if (c == 2) {
            f = i;
        }
        unit[i] = u;
    }
}

/* The rail for a unit whose destination is on NUMA node numa: among the rails that are up,
 * those on that node if any, then the least loaded. (size_t)-1 if no rail is up. */
static size_t pick_rail(int32_t numa, const int32_t *rail_numa, const uint64_t *load, const uint8_t *up,
                        size_t nrails) {
    int any_local = 0;
    for (size_t r = 0; r < nrails; r++)
        if ((!up || up[r]) && numa >= 0 && rail_numa[r] == numa) any_local = 1;
    size_t rail = (size_t)-1;
    for (size_t r = 0; r < nrails; r++) {
        if (up && !up[r]) continue;
        if (any_local && rail_numa[r] != numa) continue;
        if (rail == (size_t)-1 || load[r] < load[rail]) rail = r;
    }
    return rail;
}

int pv_plan(const pc_op *ops, size_t n, const int32_t *local_numa, size_t nlocal,
            const int32_t *rail_numa, uint64_t *load, const uint8_t *up, size_t nrails,
            const pv_limits *lim, uint32_t channels, pv_wr *out, size_t *nwrs, int32_t *refused) {
    *nwrs = 0;
    if (!n) return 0;
    uint32_t max_sge = lim->max_sge < 1 ? 1 : (lim->max_sge > PV_MAX_SGE ? PV_MAX_SGE : lim->max_sge);
    if (channels < 1) channels = 1;
    size_t nkeys_max = nrails * channels;
    proto *pr = malloc(n * sizeof *pr);
    size_t *unit = malloc(n * sizeof *unit);
    int32_t *keymap = malloc(nkeys_max * sizeof *keymap);
    uint32_t *keyrail = malloc(nkeys_max * sizeof *keyrail), *keych = malloc(nkeys_max * sizeof *keych);
    uint32_t *rr = calloc(nrails, sizeof *rr);
    if (!pr || !unit || !keymap || !keyrail || !keych || !rr) {
        free(pr); free(unit); free(keymap); free(keyrail); free(keych); free(rr);
        return -1;
    }
    for (size_t i = 0; i < nkeys_max; i++) keymap[i] = -1;
    for (size_t i = 0; i < n; i++)
        refused[i] = ops[i].length == 0 ? PC_ZERO_LENGTH : (ops[i].length > PV_MAX_READ ? PC_TOO_LARGE : -1);
    size_t npr = 0, nkeys = 0;
    size_t i = 0;
    while (i < n) {
        /* One unit over all ops (refused ones included, as in rdma_plan.py), then filtered. */
        size_t f = i, p = i, nu = 0;   /* f: the unit's anchor */
        unit[nu++] = i;
        for (i = i + 1; i < n; p = i, i++) {
            int c = continues(ops, f, p, i);
            if (!c) break;
            if (c == 2) f = i;
            unit[nu++] = i;
        }
        size_t m = 0;
        for (size_t j = 0; j < nu; j++)
            if (refused[unit[j]] < 0) unit[m++] = unit[j];
        if (!m) continue;
        size_t big = unit[0];
        uint64_t bytes = 0;
        for (size_t j = 0; j < m; j++) {
            if (ops[unit[j]].length > ops[big].length) big = unit[j];
            bytes += ops[unit[j]].length;
        }
        int32_t numa = ops[big].local_region < nlocal ? local_numa[ops[big].local_region] : -1;
        size_t rail = pick_rail(numa, rail_numa, load, up, nrails);
        if (rail == (size_t)-1) {
            for (size_t j = 0; j < m; j++) refused[unit[j]] = PC_CONNECTION;
            continue;
        }
        uint32_t ch = rr[rail] % channels;
        rr[rail]++;
        load[rail] += bytes;
        size_t kslot = rail * channels + ch;
        if (keymap[kslot] < 0) {
            keymap[kslot] = (int32_t)nkeys;
            keyrail[nkeys] = (uint32_t)rail;
            keych[nkeys++] = ch;
        }
        /* Remote-contiguous ops of the unit share a READ. */
        for (size_t j = 0; j < m; j++) {
            size_t o = unit[j];
            if (j > 0) {
                proto *g = &pr[npr - 1];
                const pc_op *q = &ops[g->op[g->nsge - 1]];
                uint64_t tot = 0;
                for (uint32_t s = 0; s < g->nsge; s++) tot += ops[g->op[s]].length;
                if (ops[o].remote_offset == q->remote_offset + q->length && g->nsge < max_sge &&
                    tot + ops[o].length <= PV_MAX_READ) {
                    g->op[g->nsge++] = (uint32_t)o;
                    continue;
                }
            }
            pr[npr].key = (uint32_t)keymap[kslot];
            pr[npr].fence = j > 0;
            pr[npr].nsge = 1;
            pr[npr++].op[0] = (uint32_t)o;
        }
    }
    uint32_t k = pv_signal_cadence(lim), cmax = pv_chain_length(lim);
    size_t w = 0;
    uint32_t chain = 0;
    for (size_t key = 0; key < nkeys; key++) {
        uint32_t pos = 0;
        size_t total = 0, seen = 0;
        for (size_t g = 0; g < npr; g++) total += pr[g].key == key;
        for (size_t g = 0; g < npr; g++) {
            if (pr[g].key != key) continue;
            if (pos == cmax) { pos = 0; chain++; }
            size_t left_in_chain = total - (seen - pos);  /* WRs of this chain and after */
            uint32_t len = left_in_chain < cmax ? (uint32_t)left_in_chain : cmax;
            pv_wr *o = &out[w++];
            memset(o, 0, sizeof *o);
            o->rail = keyrail[key];
            o->channel = keych[key];
            o->region = ops[pr[g].op[0]].region;
            o->remote_offset = ops[pr[g].op[0]].remote_offset;
            o->nsge = pr[g].nsge;
            for (uint32_t s = 0; s < pr[g].nsge; s++) {
                o->op[s] = pr[g].op[s];
                o->length += ops[pr[g].op[s]].length;
            }
            o->signaled = (pos + 1) % k == 0 || pos == len - 1;
            o->chain = chain;
            o->fence = pr[g].fence;
            pos++;
            seen++;
        }
        if (total) chain++;
    }
    *nwrs = w;
    free(pr); free(unit); free(keymap); free(keyrail); free(keych); free(rr);
    return 0;
}

int32_t pv_wc_status(int wc) {
    switch (wc) {
    case IBV_WC_SUCCESS: return PC_OK;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_RD_REQ_ERR: return PC_BAD_REGION;
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR: return PC_REFUSED;
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR: return PC_LOCAL_RANGE;
    default: return PC_CONNECTION;  /* retry exceeded, flushed, timeouts, fatal */
    }
}
