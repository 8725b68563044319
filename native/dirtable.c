/* Directory table reads: the engine of peercache._native.table_lookup, without the GIL.
 *
 * A consumer resolves keys the directory cache does not hold with one
 * one-sided read of the directory's table (peercache/directory/table.py has
 * the layout and TableView.plan/parse; tests/engine/directory/test_dirtable.py
 * holds the Python oracle of the mapping). Here, for n keys at once: their key hashes (BLAKE2b
 * with an 8-byte digest, libb2: the hash tags.key_hash computes), the plan
 * (the header line and each distinct bucket once), one read_batch of the
 * table node's backend (tcp / shm) or a copy from the table itself (its host
 * reads its own), then per key: an entry line holding its key hash whose
 * check word (XXH3-64 seeded with the seal and the line number) matches is
 * found; else a bucket whose every line checks and that is not overflowed
 * makes it definitively absent; anything else leaves it doubtful (for the
 * lookup RPC). A header that fails its check, or names another geometry,
 * makes every key doubtful. Found records carry the directory's member
 * numbers; pc_table_map turns them into the cache's node indices (and
 * refuses records that cannot be a slot) once the caller's numbers are
 * current for the table's epoch.
 */
#if !__has_include(<blake2.h>)
#error "blake2.h not found: install libb2-dev (apt-get install libb2-dev), then rebuild"
#endif
#include <blake2.h>
#if !__has_include(<xxhash.h>)
#error "xxhash.h not found: install libxxhash-dev (apt-get install libxxhash-dev), then rebuild"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc.h"

#define GOLDEN 0x9E3779B97F4A7C15ull
#define LINE PC_TABLE_LINE_BYTES

uint64_t pc_key_hash(const uint8_t *p, size_t n) {
    uint8_t out[8];
    blake2b(out, p, NULL, sizeof out, n, 0);
    uint64_t h;
    memcpy(&h, out, 8);   /* little-endian, as int.from_bytes(..., "little") (x86-64, aarch64) */
    return h ? h : 1;
}

static inline uint64_t word(const uint8_t *line, unsigned w) {
    uint64_t v;
    memcpy(&v, line + 8 * w, 8);
    return v;
}

/* dirtable.line_ok: an all-zero line is a valid empty one; any other checks its word 7. */
static int line_ok(const uint8_t *line, uint64_t lineno, uint64_t seal) {
    static const uint8_t zero[LINE];
    if (memcmp(line, zero, LINE) == 0) return 1;
    return XXH3_64bits_withSeed(line, 56, seal ^ (lineno * GOLDEN)) == word(line, 7);
}

static void fail(pc_table_result *r, int32_t code, const char *why) {
    r->code = PC_TABLE_READ_FAILED;
    r->err_code = code;
    snprintf(r->err, sizeof r->err, "%s", why);
}

void pc_table_read(const pc_table_batch *b, pc_table_result *r) {
    size_t n = b->n;
    const pc_table_spec *s = b->spec;
    uint64_t ways = s->ways, bb = (ways + 1) * LINE, seal = s->seal;
    r->code = PC_TABLE_DONE;
    r->epoch = 0;
    r->resolved = r->unknown = 0;
    r->err_code = 0;
    r->err[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        b->state[i] = PC_TABLE_DOUBT;
        memset(&b->rows[i], 0, sizeof b->rows[i]);
        b->rows[i].node = PC_ABSENT;
    }
    if (!n) return;
    /* The distinct buckets, in order of first appearance: an open-addressing set of
     * (index + 1) of each in ub, 2n..4n slots. */
    size_t slots = 1;
    while (slots < 2 * n) slots <<= 1;
    uint64_t *kh = malloc(n * sizeof *kh);
    uint64_t *ub = malloc(n * sizeof *ub);
    uint32_t *inv = malloc(n * sizeof *inv);
    uint32_t *set = calloc(slots, sizeof *set);
    int8_t *clean = malloc(n);
    pc_op *ops = malloc((n + 1) * sizeof *ops);
    int32_t *st = malloc((n + 1) * sizeof *st);
    uint8_t *buf = malloc(LINE + n * bb);
    if (!kh || !ub || !inv || !set || !clean || !ops || !st || !buf) {
        fail(r, PC_CONNECTION, "out of memory for the table read's scratch; look up fewer keys at once");
        goto out;
    }
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = kh[i] = pc_key_hash(b->keys[i].p, b->keys[i].n);
        uint64_t bk = h % s->buckets;
        size_t j = (size_t)(bk * GOLDEN >> 32) & (slots - 1);
        while (set[j] && ub[set[j] - 1] != bk) j = (j + 1) & (slots - 1);
        if (!set[j]) {
            ub[nb] = bk;
            clean[nb] = -1;
            set[j] = (uint32_t)++nb;
        }
        inv[i] = set[j] - 1;
    }
    ops[0] = (pc_op){s->region, 0, s->rkey, 0, LINE, 0};
    for (size_t u = 0; u < nb; u++)
        ops[u + 1] = (pc_op){s->region, 0, s->rkey, (1 + ub[u] * (ways + 1)) * LINE, bb, LINE + u * bb};
    size_t m = nb + 1;
    if (b->be) {
        pc_local local = {buf, LINE + nb * bb};
        char berr[sizeof r->err] = "";
        int rc = b->be->read_batch(b->conn, ops, m, &local, 1, st, berr, sizeof berr, NULL);
        for (size_t k = 0; k < m; k++)
            if (st[k] != PC_OK) { fail(r, st[k], berr); goto out; }
        if (rc != 0) { fail(r, PC_CONNECTION, berr[0] ? berr : "batch failed"); goto out; }
    } else {
        for (size_t k = 0; k < m; k++) {
            const pc_op *op = &ops[k];
            if (op->remote_offset > b->memlen || op->length > b->memlen - op->remote_offset) {
                fail(r, PC_OUT_OF_RANGE, "the table is smaller than its announced geometry");
                goto out;
            }
            memcpy(buf + op->local_offset, b->mem + op->remote_offset, op->length);
        }
    }
    if (!(word(buf, 0) == PC_TABLE_MAGIC && word(buf, 2) == s->buckets && word(buf, 3) == ways &&
          line_ok(buf, 0, seal))) {
        r->code = PC_TABLE_BAD_HEADER;
        goto out;
    }
    r->epoch = word(buf, 1);
    size_t resolved = 0, found = 0, unknown = 0;
    for (size_t i = 0; i < n; i++) {
        size_t u = inv[i];
        const uint8_t *base = buf + LINE + u * bb;
        uint64_t first = 1 + ub[u] * (ways + 1);
        int hit = 0;
        for (uint64_t w = 1; w <= ways && !hit; w++) {
            const uint8_t *line = base + w * LINE;
            if (word(line, PC_TABLE_KEY_HASH_WORD) == kh[i] && line_ok(line, first + w, seal)) {
                memcpy(&b->rows[i], line, sizeof b->rows[i]);
                b->state[i] = PC_TABLE_FOUND;
                hit = 1;
            }
        }
        if (hit) {
            found++;
            uint32_t num = b->rows[i].node;
            if (num >= b->nnums || b->nums[num] == PC_ABSENT) unknown++;
            continue;
        }
        if (clean[u] < 0) {
            int c = word(base, 0) == 0;
            for (uint64_t l = 0; l <= ways && c; l++) c = line_ok(base + l * LINE, first + l, seal);
            clean[u] = (int8_t)c;
        }
        if (clean[u]) { b->state[i] = PC_TABLE_ABSENT; resolved++; }
    }
    r->unknown = unknown;
    if (!b->have_epoch || b->expect_epoch != r->epoch || unknown) {
        r->code = PC_TABLE_REMAP;   /* rows keep member numbers: the caller syncs, then pc_table_map */
        r->resolved = resolved + found;
        goto out;
    }
    r->resolved = resolved + pc_table_map(b->rows, b->state, n, b->nums, b->nnums, b->slot_limit, 1, NULL);
out:
    free(kh); free(ub); free(inv); free(set); free(clean); free(ops); free(st); free(buf);
}

size_t pc_table_map(pc_loc *rows, int8_t *state, size_t n, const uint32_t *nums, size_t nnums, uint64_t lim,
                    int final, size_t *unknown) {
    if (!final) {
        size_t u = 0;
        for (size_t i = 0; i < n; i++)
            if (state[i] == PC_TABLE_FOUND && (rows[i].node >= nnums || nums[rows[i].node] == PC_ABSENT)) u++;
        if (unknown) *unknown = u;
        if (u) return 0;   /* nothing changed: the caller maps its numbers again first */
    } else if (unknown) {
        *unknown = 0;
    }
    size_t found = 0;
    for (size_t i = 0; i < n; i++) {
        if (state[i] != PC_TABLE_FOUND) continue;
        pc_loc *l = &rows[i];
        uint32_t idx = l->node < nnums ? nums[l->node] : PC_ABSENT;
        uint64_t capl = l->capacity < lim ? l->capacity : lim;
        if (idx == PC_ABSENT || l->length > l->capacity || l->capacity > lim || l->offset > lim - capl) {
            /* a member this node cannot map, or a record that cannot be a slot: the RPC answers it */
            if (unknown && idx == PC_ABSENT) (*unknown)++;
            state[i] = PC_TABLE_DOUBT;
            l->node = PC_ABSENT;
            continue;
        }
        l->node = idx;
        found++;
    }
    return found;
}

size_t pc_table_count_resolved(const int8_t *state, size_t n) {
    size_t r = 0;
    for (size_t i = 0; i < n; i++) r += state[i] != PC_TABLE_DOUBT;
    return r;
}
