/* The consumer's directory cache: key bytes -> location with expiry.
 *
 * Sharded chained hash map: each shard has its own lock, so threads
 * looking up different keys rarely meet on a lock, and no call holds a lock
 * for more than one key. The lock is a spinlock that yields the CPU after a
 * short spin (shard_lock): held for one key's find, or a writer's grow or
 * clear, it costs one atomic exchange and one store where a pthread mutex
 * cost two calls (~10 % of a 64-byte page's read from a cached directory,
 * perf of `ratios --only pages_per_s_64b`'s nodeloop). Each entry also keeps the key's own hash
 * (pc_key_hash, the hash its slot tag must carry), computed here from the
 * key bytes when the entry is made: a read of a cached key checks its tag
 * against the key it asked for without hashing it again.
 *
 * A batch lookup (pc_map_get_many) overlaps the cache misses of its keys: it
 * hashes every key first (their bytes fetched in parallel), then prefetches
 * each key's bucket, then each bucket's first entry, and only then looks the
 * keys up one by one under their shards' locks. Those prefetch passes read
 * without the lock, so a shard's bucket array carries its own size and a
 * replaced array is kept until the map is freed (they read memory that stays
 * mapped), and the bucket heads are written with atomic stores; an entry freed
 * meanwhile is only ever prefetched, never dereferenced, outside the lock. On
 * this project's 2-vCPU VM a lookup of 128 random keys of 4096 cached ones
 * (LocCache.lookup from Python) went from 6.7 to 5.3 us, with the cheaper hash.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pc.h"

#define SHARD_BITS 6
#define NSHARDS (1u << SHARD_BITS)

typedef struct ent {
    struct ent *next;
    uint64_t hash;
    uint64_t want;     /* pc_key_hash(key): what the key's slot tag must hold */
    double expiry;
    pc_loc loc;
    uint32_t klen;
    uint8_t key[];
} ent;

/* A shard's buckets: their count (a power of two) with them, so a reader without the lock uses an
 * array with its own size; a replaced one is kept on the retired chain until the map is freed. */
typedef struct btab {
    struct btab *retired;
    size_t n;
    ent *slot[];
} btab;

typedef struct shard {
    atomic_int lock;   /* shard_lock / shard_unlock */
    btab *tab;         /* read without the lock by the prefetch passes: stored atomically */
    size_t count;
    char pad[64];      /* keep neighbouring shard locks off one cache line */
} shard;

struct pc_map {
    shard shards[NSHARDS];
    atomic_size_t total;
};

/* Spins before a waiter yields its CPU: a holder that lost its CPU is not waited for by spinning. */
#define SPINS 64

static inline void shard_lock(shard *s) {
    while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)) {
        for (int i = 0; atomic_load_explicit(&s->lock, memory_order_relaxed); i++) {
            if (i < SPINS) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield();
            }
        }
    }
}

static inline void shard_unlock(shard *s) { atomic_store_explicit(&s->lock, 0, memory_order_release); }

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* The map's own hash of a key (not pc_key_hash, the slot tag's): one multiply-xor round a word, one
 * finalizer at the end (a bijection of the last state), cheap for the short keys a cache holds. The
 * tail of 1-7 bytes is read in at most two loads that stay inside the key (a memcpy of a variable
 * length was a call); the length in the seed keeps keys whose tails read the same apart. */
static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0x9fb21c651e98df25ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9fb21c651e98df25ULL;
        h ^= h >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0;
    if (n >= 4) {   /* 4-7 bytes: the first four and the last four (they overlap below 8) */
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        w = (uint64_t)a | ((uint64_t)b << 32);
    } else if (n) {   /* 1-3 bytes: the first, the middle and the last */
        w = (uint64_t)p[0] | ((uint64_t)p[n / 2] << 8) | ((uint64_t)p[n - 1] << 16);
    }
    return mix64(h ^ w);
}

static btab *btab_new(size_t n, btab *retired) {
    btab *t = calloc(1, sizeof *t + n * sizeof(ent *));
    if (!t) return NULL;
    t->n = n;
    t->retired = retired;
    return t;
}

/* Bucket heads and the table pointer are read by the prefetch passes without the lock. */
static inline void set_link(ent **pp, ent *e) { __atomic_store_n(pp, e, __ATOMIC_RELAXED); }

pc_map *pc_map_new(void) {
    pc_map *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        atomic_init(&s->lock, 0);
        s->tab = btab_new(16, NULL);
        if (!s->tab) { pc_map_free(m); return NULL; }
    }
    return m;
}

static void shard_clear(shard *s) {
    btab *t = s->tab;
    for (size_t b = 0; b < t->n; b++) {
        ent *e = t->slot[b];
        set_link(&t->slot[b], NULL);
        while (e) { ent *n = e->next; free(e); e = n; }
    }
    s->count = 0;
}

void pc_map_free(pc_map *m) {
    if (!m) return;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        if (s->tab) {
            shard_clear(s);
            for (btab *t = s->tab, *r; t; t = r) { r = t->retired; free(t); }
        }
    }
    free(m);
}

static inline shard *shard_of(pc_map *m, uint64_t h) { return &m->shards[h >> (64 - SHARD_BITS)]; }

static ent **find(shard *s, uint64_t h, const uint8_t *key, size_t klen) {
    ent **pp = &s->tab->slot[h & (s->tab->n - 1)];
    for (; *pp; pp = &(*pp)->next) {
        ent *e = *pp;
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) return pp;
    }
    return NULL;
}

/* Locks the shard of key and finds it there: its link, or NULL; *sp: the shard (locked), *hp: the hash. */
static ent **lock_find(pc_map *m, const uint8_t *key, size_t klen, shard **sp, uint64_t *hp) {
    uint64_t h = hash_bytes(key, klen);
    shard *s = shard_of(m, h);
    shard_lock(s);
    *sp = s;
    *hp = h;
    return find(s, h, key, klen);
}

/* Unlinks and frees the entry *pp of s (under its lock). */
static void unlink_ent(pc_map *m, shard *s, ent **pp) {
    ent *e = *pp;
    set_link(pp, e->next);
    free(e);
    s->count--;
    atomic_fetch_sub(&m->total, 1);
}

static void grow(shard *s) {
    btab *old = s->tab;
    size_t nb = old->n * 2;
    btab *t = btab_new(nb, old);   /* the old one stays readable: retired, freed with the map */
    if (!t) return;  /* keep the longer chains; correctness does not depend on it */
    for (size_t b = 0; b < old->n; b++) {
        ent *e = old->slot[b];
        while (e) {
            ent *n = e->next;
            size_t i = e->hash & (nb - 1);
            e->next = t->slot[i];
            t->slot[i] = e;
            e = n;
        }
    }
    __atomic_store_n(&s->tab, t, __ATOMIC_RELEASE);
}

/* The lookup of key (hash h) under its shard's lock: see pc_map_get. */
static int get_hashed(pc_map *m, const uint8_t *key, size_t klen, uint64_t h, double now, pc_loc *out,
                      uint64_t *want) {
    int found = 0;
    shard *s = shard_of(m, h);
    shard_lock(s);
    ent **pp = find(s, h, key, klen);
    if (pp) {
        ent *e = *pp;
        if (e->expiry > now) {
            *out = e->loc;
            if (want) *want = e->want;
            found = 1;
        } else {
            unlink_ent(m, s, pp);
        }
    }
    shard_unlock(s);
    if (want && !found) *want = pc_key_hash(key, klen);
    return found;
}

int pc_map_get(pc_map *m, const uint8_t *key, size_t klen, double now, pc_loc *out, uint64_t *want) {
    return get_hashed(m, key, klen, hash_bytes(key, klen), now, out, want);
}

/* Keys a prefetch pass runs ahead of the lookups (their misses overlap). */
#define AHEAD 16

size_t pc_map_get_many(pc_map *m, const pc_bytes *keys, size_t n, double now, pc_loc *out, uint64_t *want,
                       uint32_t absent) {
    size_t found = 0;
    uint64_t h[AHEAD];
    ent **head[AHEAD];   /* each key's bucket, in the table seen then (a retired one stays mapped) */
    for (size_t j = 0; j < n && j < AHEAD; j++) __builtin_prefetch(keys[j].p, 0, 3);
    for (size_t base = 0; base < n; base += AHEAD) {
        size_t k = n - base < AHEAD ? n - base : AHEAD;
        for (size_t j = base + AHEAD; j < n && j < base + 2 * AHEAD; j++)   /* the next group's key bytes */
            __builtin_prefetch(keys[j].p, 0, 3);
        for (size_t j = 0; j < k; j++) {   /* hash: this group's bytes are on their way or here */
            h[j] = hash_bytes(keys[base + j].p, keys[base + j].n);
            btab *t = __atomic_load_n(&shard_of(m, h[j])->tab, __ATOMIC_ACQUIRE);
            head[j] = &t->slot[h[j] & (t->n - 1)];
            __builtin_prefetch(head[j], 0, 3);
        }
        for (size_t j = 0; j < k; j++) {   /* each bucket's first entry: only prefetched, never read here */
            ent *e = __atomic_load_n(head[j], __ATOMIC_RELAXED);
            if (e) {
                __builtin_prefetch(e, 0, 3);
                __builtin_prefetch((const uint8_t *)e + 64, 0, 3);
            }
        }
        for (size_t j = 0; j < k; j++) {
            size_t i = base + j;
            if (get_hashed(m, keys[i].p, keys[i].n, h[j], now, &out[i], want ? &want[i] : NULL)) found++;
            else out[i].node = absent;
        }
    }
    return found;
}

int pc_map_put(pc_map *m, const uint8_t *key, size_t klen, const pc_loc *loc, double expiry) {
    shard *s;
    uint64_t h;
    ent **pp = lock_find(m, key, klen, &s, &h);
    if (pp) {
        (*pp)->loc = *loc;
        (*pp)->expiry = expiry;
        shard_unlock(s);
        return 0;
    }
    ent *e = malloc(sizeof *e + klen);
    if (!e) { shard_unlock(s); return -1; }
    e->hash = h; e->want = pc_key_hash(key, klen); e->expiry = expiry; e->loc = *loc; e->klen = (uint32_t)klen;
    memcpy(e->key, key, klen);
    if (s->count + 1 > s->tab->n) grow(s);
    size_t b = h & (s->tab->n - 1);
    e->next = s->tab->slot[b];
    set_link(&s->tab->slot[b], e);
    s->count++;
    atomic_fetch_add(&m->total, 1);
    shard_unlock(s);
    return 0;
}

int pc_map_del(pc_map *m, const uint8_t *key, size_t klen) {
    int removed = 0;
    shard *s;
    uint64_t h;
    ent **pp = lock_find(m, key, klen, &s, &h);
    if (pp) {
        unlink_ent(m, s, pp);
        removed = 1;
    }
    shard_unlock(s);
    return removed;
}

size_t pc_map_drop_node(pc_map *m, uint32_t node) {
    size_t n = 0;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        shard_lock(s);
        for (size_t b = 0; b < s->tab->n; b++) {
            ent **pp = &s->tab->slot[b];
            while (*pp) {
                if ((*pp)->loc.node == node) {
                    unlink_ent(m, s, pp);
                    n++;
                } else {
                    pp = &(*pp)->next;
                }
            }
        }
        shard_unlock(s);
    }
    return n;
}

void pc_map_clear(pc_map *m) {
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        shard_lock(s);
        atomic_fetch_sub(&m->total, s->count);
        shard_clear(s);
        shard_unlock(s);
    }
}

size_t pc_map_len(pc_map *m) { return atomic_load(&m->total); }
