/* Slot reads: the engine of peercache._native.read_slots, without the GIL.
 *
 * A batch is one directory location per key and a destination buffer (or one
 * buffer per key, b->dests: the caller's own, each payload straight into it). The
 * keys of each node become one read_batch of that node's backend: per key
 * the ops of pc_slot_ops (pc.h), header and trailer into a tag scratch of
 * PC_TAG_BYTES per key, the payload straight into the destination. A key is
 * a hit only if all its ops succeeded and its tags say the bytes are the
 * object asked for (pc_tag_check): the key hash the consumer computed of the
 * key it asked for (b->want, never the one its directory entry carries), the
 * generation and length of the entry. A slot evicted, reused or torn while
 * read is a miss (PC_TAG_MISMATCH), never an error; a stable slot that is
 * what the entry describes but holds another key is a miss too
 * (PC_KEY_MISMATCH: the directory's entry points at another key's slot),
 * counted apart. On request the
 * payload of each hit is then checked in the same pass (check_payload):
 * against the checksum its producer wrote (a mismatch or a missing checksum
 * is a miss, never bytes), and against the bench pattern (a mismatch is
 * counted and reported, the key stays a hit). A key whose node
 * has no connected handle, or one its backend says is stale, is not read
 * (PC_NEED_PEER): the caller connects and reads it again. The first failed
 * op of the batch is reported with its node and its backend's message. module.c takes the Python arguments, the
 * handles and the memory, and builds the result.
 */
#include <stdio.h>

#include "pc.h"

int32_t pc_tag_check(const uint64_t tag[PC_TAG_WORDS], const pc_loc *loc, uint64_t want) {
    uint64_t seq = tag[0];
    if (seq == 0 || (seq & 1) || tag[PC_TAG_WORDS - 1] != seq || tag[2] != loc->generation
        || tag[3] != loc->length)
        return PC_TAG_MISMATCH;
    return tag[1] == want ? PC_OK : PC_KEY_MISMATCH;
}

size_t pc_slot_nodes(const pc_loc *locs, size_t i, size_t n, pc_slot_peer *nodes, size_t cap, size_t *nn) {
    size_t k = *nn;
    uint32_t last = PC_ABSENT;
    for (; i < n; i++) {
        uint32_t nd = locs[i].node;
        if (nd == PC_ABSENT || nd == last) continue;
        size_t j = 0;
        while (j < k && nodes[j].node != nd) j++;
        if (j == k) {
            if (k == cap) break;
            nodes[k++] = (pc_slot_peer){nd, NULL, NULL, NULL};
        }
        last = nd;
    }
    *nn = k;
    return i;
}

/* The ops of the keys of node p, into ops. A key that cannot be read gets
 * its code and count here: PC_NEED_PEER (p has no handle, or a stale one),
 * PC_TOO_BIG (over its capacity), PC_LOCAL_RANGE (its payload would not fit
 * in dest). first is the index in ops of the first op of each key read.
 * Returns how many ops. */
static size_t node_ops(const pc_slot_batch *b, const pc_slot_peer *p, pc_op *ops, int32_t *first,
                       uint32_t *opkey, pc_slot_result *r) {
    const pc_loc *locs = b->locs;
    const uint64_t *offsets = b->offsets, *caps = b->caps;
    int8_t *status = b->status;
    int32_t *codes = b->codes;
    uint64_t destlen = b->destlen;
    uint32_t nd = p->node;
    size_t m = 0, need = 0, errors = 0;
    int connected = p->be && !(p->be->stale && p->be->stale(p->conn));
    for (size_t i = 0; i < b->n; i++) {
        const pc_loc *l = &locs[i];
        if (l->node != nd) continue;
        if (!connected) { codes[i] = PC_NEED_PEER; need++; continue; }
        if (caps && l->length > caps[i]) {
            status[i] = PC_GET_ERROR; codes[i] = PC_TOO_BIG; errors++;
            continue;
        }
        uint64_t room = b->dests ? b->dests[i].len : destlen;
        if (offsets[i] > room || l->length > room - offsets[i]) {
            status[i] = PC_GET_ERROR; codes[i] = PC_LOCAL_RANGE; errors++;
            continue;
        }
        first[i] = (int32_t)m;
        size_t k = pc_slot_ops(l, (uint64_t)i * PC_TAG_BYTES, offsets[i], &ops[m]);
        if (b->dests && l->length) ops[m + 1].local_region = PC_SLOT_DEST + (uint32_t)i;  /* its own buffer */
        for (size_t j = 0; j < k; j++) opkey[m + j] = (uint32_t)i;
        m += k;
    }
    r->need_peer += need;
    r->errors += errors;
    return m;
}

/* The checks of b->checks on key i, whose tags matched: its payload against
 * the checksum in its header (integrity), then against the bench pattern.
 * Returns PC_OK or the per-key code of the first that failed. */
static int32_t check_payload(const pc_slot_batch *b, size_t i, const uint64_t *tag) {
    const pc_loc *l = &b->locs[i];
    const uint8_t *payload = (b->dests ? b->dests[i].base : b->dest) + b->offsets[i];
    uint64_t kh = b->want[i];
    if (b->checks & PC_CHECK_INTEGRITY) {
        uint64_t sum = tag[PC_TAG_CHECKSUM];
        if (sum == 0) return PC_CHECKSUM_MISSING;
        if (pc_checksum(payload, l->length, pc_checksum_seed(kh, l->generation)) != sum)
            return PC_CHECKSUM_MISMATCH;
    }
    if ((b->checks & PC_CHECK_PATTERN) && !pc_pattern_ok(payload, l->length, kh, l->generation))
        return PC_CONTENT_MISMATCH;
    return PC_OK;
}

/* What the notify callback needs: it runs the payload checks of a key as soon
 * as the last op of its slot has landed, while the payload is still in cache
 * (shm copies and tcp replies notify; verbs does not, and node_results then
 * checks after the batch). done[i] is 1 + the outcome, 0 while unchecked. */
typedef struct slot_checks {
    const pc_slot_batch *b;
    const uint64_t *tags;
    const int32_t *opst, *first;
    const uint32_t *opkey;
    int32_t *done;
} slot_checks;

static void slot_op_landed(void *ctx, size_t op) {
    slot_checks *x = ctx;
    uint32_t i = x->opkey[op];
    const pc_loc *l = &x->b->locs[i];
    size_t k = (size_t)x->first[i], last = k + pc_slot_nops(l) - 1;
    if (op != last || x->done[i]) return;        /* complete with its trailer; or checked in the copy */
    for (size_t j = k; j < last; j++)
        if (x->opst[j] != PC_OK) return;         /* node_results reports the failed op */
    const uint64_t *tag = &x->tags[(size_t)i * PC_TAG_WORDS];
    if (pc_tag_check(tag, l, x->b->want[i]) == PC_OK) x->done[i] = 1 + check_payload(x->b, i, tag);
}

/* The copy of a payload op with its checks fused in (a backend that copies:
 * shm). The header op came first, so the checksum the payload must have is
 * already in the tag scratch; whether the slot was stable while copied is the
 * tag check's business (a torn slot is a miss whatever this says). */
static int slot_op_copy(void *ctx, size_t op, uint8_t *dst, const uint8_t *src, uint64_t len) {
    slot_checks *x = ctx;
    uint32_t i = x->opkey[op];
    const pc_loc *l = &x->b->locs[i];
    if (!l->length || op != (size_t)x->first[i] + 1) return 0;    /* header or trailer: an ordinary copy */
    const uint64_t *tag = &x->tags[(size_t)i * PC_TAG_WORDS];
    unsigned checks = x->b->checks;
    uint64_t kh = x->b->want[i];
    int32_t why = PC_OK;
    if (checks & PC_CHECK_INTEGRITY) {
        uint64_t got = pc_copy_checksum(dst, src, len, pc_checksum_seed(kh, l->generation));
        uint64_t sum = tag[PC_TAG_CHECKSUM];
        why = sum == 0 ? PC_CHECKSUM_MISSING : got != sum ? PC_CHECKSUM_MISMATCH : PC_OK;
        if (why == PC_OK && (checks & PC_CHECK_PATTERN) && !pc_pattern_ok(dst, len, kh, l->generation))
            why = PC_CONTENT_MISMATCH;
    } else if (!pc_copy_pattern(dst, src, len, kh, l->generation, pc_copy_streams())) {
        why = PC_CONTENT_MISMATCH;
    }
    x->done[i] = 1 + why;
    return 1;
}

/* The outcome of each key of node nd that was read, from the statuses of
 * its ops (opst, indexed by first) and its tags: a hit, a miss (stale tags,
 * or a slot of another key) or an error (a failed op; the first one of the
 * batch is kept in r, with berr, the message of the read_batch it failed in). */
static void node_results(const pc_slot_batch *b, uint32_t nd, const uint64_t *tags, const int32_t *opst,
                         const int32_t *first, const int32_t *checked, const char *berr, pc_slot_result *r) {
    const pc_loc *locs = b->locs;
    int8_t *status = b->status;
    int32_t *codes = b->codes;
    uint64_t *lengths = b->lengths, *gens = b->gens;
    size_t hits = 0, stale = 0, redirected = 0, errors = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (locs[i].node != nd || first[i] < 0) continue;
        const pc_loc *l = &locs[i];
        size_t k = (size_t)first[i], nops = pc_slot_nops(l);
        int32_t bad = PC_OK, match = PC_OK;
        for (size_t j = 0; j < nops; j++)
            if (opst[k + j] != PC_OK) { bad = opst[k + j]; break; }
        if (bad == PC_OK) match = pc_tag_check(&tags[i * PC_TAG_WORDS], l, b->want[i]);
        if (bad != PC_OK) {
            status[i] = PC_GET_ERROR; codes[i] = bad; errors++;
            if (!r->err_code) {
                r->err_code = bad; r->err_node = nd;
                snprintf(r->err, sizeof r->err, "%s", berr);
            }
        } else if (match == PC_OK) {
            int32_t why = !b->checks ? PC_OK
                        : checked[i] ? checked[i] - 1 : check_payload(b, i, &tags[i * PC_TAG_WORDS]);
            if (why == PC_CHECKSUM_MISMATCH || why == PC_CHECKSUM_MISSING) {
                codes[i] = why;   /* never bytes: a miss */
                if (why == PC_CHECKSUM_MISMATCH) r->checksum_bad++;
                else r->checksum_missing++;
            } else {
                if (why == PC_CONTENT_MISMATCH) r->content_bad++;
                status[i] = PC_GET_HIT; lengths[i] = l->length; gens[i] = l->generation; hits++;
                codes[i] = why;   /* PC_CONTENT_MISMATCH: counted, the caller reports it */
            }
        } else {
            codes[i] = match;
            if (match == PC_KEY_MISMATCH) redirected++;
            else stale++;
        }
    }
    r->hits += hits;
    r->stale += stale;
    r->redirected += redirected;
    r->errors += errors;
}

void pc_read_slots(const pc_slot_batch *b, const pc_slot_peer *nodes, size_t nn, void *scratch,
                   pc_slot_result *r) {
    size_t n = b->n;
    uint64_t *tags = scratch;
    pc_op *ops = (pc_op *)((uint8_t *)scratch + n * PC_TAG_BYTES);
    int32_t *opst = (int32_t *)(ops + PC_SLOT_MAX_OPS * n);
    int32_t *first = opst + PC_SLOT_MAX_OPS * n;
    uint32_t *opkey = (uint32_t *)(first + n);
    int32_t *checked = (int32_t *)(opkey + PC_SLOT_MAX_OPS * n);
    pc_local *many = (pc_local *)(checked + n);   /* 8-aligned: 8n int32s since ops */
    r->hits = r->stale = r->redirected = r->need_peer = r->errors = 0;
    r->content_bad = r->checksum_bad = r->checksum_missing = 0;
    r->err_code = 0;
    r->err_node = PC_ABSENT;
    r->err[0] = '\0';
    int8_t *status = b->status;
    int32_t *codes = b->codes;
    uint64_t *lengths = b->lengths, *gens = b->gens;
    for (size_t i = 0; i < n; i++) {
        status[i] = PC_GET_MISS; codes[i] = 0; lengths[i] = 0; gens[i] = 0; first[i] = -1; checked[i] = 0;
    }
    pc_local two[2], *locals = two;
    size_t nlocals = 2;
    if (b->dests) {   /* the tags, then each key's own buffer */
        locals = many;
        nlocals = n + 1;
        for (size_t i = 0; i < n; i++) locals[PC_SLOT_DEST + i] = b->dests[i];
    } else {
        locals[PC_SLOT_DEST] = (pc_local){b->dest, b->destlen};
    }
    locals[PC_SLOT_TAGS] = (pc_local){(uint8_t *)tags, (uint64_t)n * PC_TAG_BYTES};
    slot_checks x = {b, tags, opst, first, opkey, checked};
    pc_notify notify = {slot_op_landed, slot_op_copy, &x};
    for (size_t d = 0; d < nn; d++) {
        const pc_slot_peer *p = &nodes[d];
        size_t m = node_ops(b, p, ops, first, opkey, r);
        if (!m) continue;
        char berr[sizeof r->err] = "";
        p->be->read_batch(p->conn, ops, m, locals, nlocals, opst, berr, sizeof berr, b->checks ? &notify : NULL);
        node_results(b, p->node, tags, opst, first, checked, berr, r);
    }
}
