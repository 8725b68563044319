/* The consumer's directory cache: key bytes -> location with expiry.
 *
 * Sharded chained hash map: each shard has its own mutex, so threads
 * looking up different keys rarely meet on a lock, and no call holds a lock
 * for more than one key. Each entry also keeps the key's own hash
 * (pc_key_hash, the hash its slot tag must carry), computed here from the
 * key bytes when the entry is made: a read of a cached key checks its tag
 * against the key it asked for without hashing it again.
 */
#include <pthread.h>
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

typedef struct shard {
    pthread_mutex_t mu;
    ent **buckets;
    size_t nbuckets;   /* power of two */
    size_t count;
    char pad[64];      /* keep neighbouring shard locks off one cache line */
} shard;

struct pc_map {
    shard shards[NSHARDS];
    atomic_size_t total;
};

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)n * 0x9fb21c651e98df25ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ mix64(w)) * 0x9fb21c651e98df25ULL;
        h ^= h >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ mix64(w ^ n));
}

pc_map *pc_map_new(void) {
    pc_map *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        pthread_mutex_init(&s->mu, NULL);
        s->nbuckets = 16;
        s->buckets = calloc(s->nbuckets, sizeof(ent *));
        if (!s->buckets) { pc_map_free(m); return NULL; }
    }
    return m;
}

static void shard_clear(shard *s) {
    for (size_t b = 0; b < s->nbuckets; b++) {
        ent *e = s->buckets[b];
        while (e) { ent *n = e->next; free(e); e = n; }
        s->buckets[b] = NULL;
    }
    s->count = 0;
}

void pc_map_free(pc_map *m) {
    if (!m) return;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        if (s->buckets) { shard_clear(s); free(s->buckets); }
        pthread_mutex_destroy(&s->mu);
    }
    free(m);
}

static inline shard *shard_of(pc_map *m, uint64_t h) { return &m->shards[h >> (64 - SHARD_BITS)]; }

static ent **find(shard *s, uint64_t h, const uint8_t *key, size_t klen) {
    ent **pp = &s->buckets[h & (s->nbuckets - 1)];
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
    pthread_mutex_lock(&s->mu);
    *sp = s;
    *hp = h;
    return find(s, h, key, klen);
}

/* Unlinks and frees the entry *pp of s (under its lock). */
static void unlink_ent(pc_map *m, shard *s, ent **pp) {
    ent *e = *pp;
    *pp = e->next;
    free(e);
    s->count--;
    atomic_fetch_sub(&m->total, 1);
}

static void grow(shard *s) {
    size_t nb = s->nbuckets * 2;
    ent **nbk = calloc(nb, sizeof(ent *));
    if (!nbk) return;  /* keep the longer chains; correctness does not depend on it */
    for (size_t b = 0; b < s->nbuckets; b++) {
        ent *e = s->buckets[b];
        while (e) {
            ent *n = e->next;
            size_t i = e->hash & (nb - 1);
            e->next = nbk[i];
            nbk[i] = e;
            e = n;
        }
    }
    free(s->buckets);
    s->buckets = nbk;
    s->nbuckets = nb;
}

int pc_map_get(pc_map *m, const uint8_t *key, size_t klen, double now, pc_loc *out, uint64_t *want) {
    int found = 0;
    shard *s;
    uint64_t h;
    ent **pp = lock_find(m, key, klen, &s, &h);
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
    pthread_mutex_unlock(&s->mu);
    if (want && !found) *want = pc_key_hash(key, klen);
    return found;
}

int pc_map_put(pc_map *m, const uint8_t *key, size_t klen, const pc_loc *loc, double expiry) {
    shard *s;
    uint64_t h;
    ent **pp = lock_find(m, key, klen, &s, &h);
    if (pp) {
        (*pp)->loc = *loc;
        (*pp)->expiry = expiry;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    ent *e = malloc(sizeof *e + klen);
    if (!e) { pthread_mutex_unlock(&s->mu); return -1; }
    e->hash = h; e->want = pc_key_hash(key, klen); e->expiry = expiry; e->loc = *loc; e->klen = (uint32_t)klen;
    memcpy(e->key, key, klen);
    if (s->count + 1 > s->nbuckets) grow(s);
    size_t b = h & (s->nbuckets - 1);
    e->next = s->buckets[b];
    s->buckets[b] = e;
    s->count++;
    atomic_fetch_add(&m->total, 1);
    pthread_mutex_unlock(&s->mu);
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
    pthread_mutex_unlock(&s->mu);
    return removed;
}

size_t pc_map_drop_node(pc_map *m, uint32_t node) {
    size_t n = 0;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        for (size_t b = 0; b < s->nbuckets; b++) {
            ent **pp = &s->buckets[b];
            while (*pp) {
                if ((*pp)->loc.node == node) {
                    unlink_ent(m, s, pp);
                    n++;
                } else {
                    pp = &(*pp)->next;
                }
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    return n;
}

void pc_map_clear(pc_map *m) {
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        atomic_fetch_sub(&m->total, s->count);
        shard_clear(s);
        pthread_mutex_unlock(&s->mu);
    }
}

size_t pc_map_len(pc_map *m) { return atomic_load(&m->total); }
