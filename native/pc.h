/* Shared types of the native data path: ops, statuses, slot tags, backends. */
#ifndef PC_H
#define PC_H

#include <stddef.h>
#include <stdint.h>

/* Per-op status codes; the same numbers as peercache.transport.base.Status. */
enum {
    PC_OK = 0,
    PC_BAD_REGION = 1,
    PC_OUT_OF_RANGE = 2,
    PC_ZERO_LENGTH = 3,
    PC_LOCAL_RANGE = 4,
    PC_CONNECTION = 5,
    PC_PEER_GONE = 6,
    PC_TOO_LARGE = 7,
    PC_REFUSED = 8,
    /* Per-key codes of read_slots only (never an op status). */
    PC_NEED_PEER = 100,    /* no connected peer handle for the key's node yet */
    PC_TAG_MISMATCH = 101, /* slot evicted, reused or torn while read: a miss */
    PC_TOO_BIG = 102       /* object larger than the caller's capacity */
};

/* One read: matches OP_DTYPE of peercache.transport.base (40 bytes). */
typedef struct pc_op {
    uint32_t region;        /* remote region id */
    uint32_t local_region;  /* index into the call's local buffers */
    uint64_t rkey;          /* remote region key (capability) */
    uint64_t remote_offset;
    uint64_t length;
    uint64_t local_offset;
} pc_op;

/* A local destination buffer of one call. */
typedef struct pc_local {
    uint8_t *base;
    uint64_t len;
} pc_local;

/* A directory location as the consumer caches it: matches LOC_DTYPE (56 bytes). */
typedef struct pc_loc {
    uint32_t node;          /* interned node index; PC_ABSENT = no location */
    uint32_t region;
    uint64_t rkey;
    uint64_t offset;        /* slot (header) offset in the region */
    uint64_t length;        /* payload bytes */
    uint64_t capacity;      /* payload capacity: the trailer sits after it */
    uint64_t generation;
    uint64_t key_hash;
} pc_loc;

#define PC_ABSENT 0xFFFFFFFFu

/* Slot geometry of peercache.tags. */
#define PC_HEADER_BYTES 32u
#define PC_TRAILER_BYTES 8u
#define PC_TAG_BYTES 40u

/* Result of the slot tag check of one key (1 = the bytes are the object). */
int pc_tag_ok(const uint64_t tag[5], const pc_loc *loc);

/*
 * The backend interface. A backend moves bytes for ops whose local side
 * was already validated (length > 0, destination inside its buffer); it
 * checks the remote side itself (or its server does) and sets one status
 * per op. It is called without the GIL, from any number of threads at
 * once, and must not serialise them on one lock for the whole batch.
 * The RDMA verbs backend implements the same four calls.
 */
typedef struct pc_backend {
    const char *name;
    /* Open a connection from a backend-specific parameter block; NULL + err on failure. */
    void *(*connect)(const void *params, char *err, size_t errlen);
    /* Execute ops in order; fills status[0..n); returns 0, or -1 with err set. */
    int (*read_batch)(void *conn, const pc_op *ops, size_t n, const pc_local *locals,
                      size_t nlocals, int32_t *status, char *err, size_t errlen);
    /* 1 while the peer is usable, 0 once it is known gone (optional, may be NULL). */
    int (*alive)(void *conn);
    void (*close)(void *conn);
} pc_backend;

extern const pc_backend pc_shm_backend;

/* A connection made by another extension (the verbs backend, peercache._verbs) and
 * handed to peercache._native.adopt() inside a capsule of this name; adopt() takes
 * the connection and sets conn to NULL, the capsule frees only what it still holds. */
#define PC_HANDOFF_CAPSULE "peercache.backend_conn"
typedef struct pc_handoff {
    const pc_backend *be;
    void *conn;
} pc_handoff;

extern const pc_backend pc_tcp_backend;

/* Parameter blocks of the two backends built here. */
#define PC_SHM_MAX_REGIONS 16
typedef struct pc_shm_region_param {
    uint32_t id;
    uint64_t rkey;
    const char *path;      /* /proc/<pid>/fd/<fd> of the producer's memfd */
    uint64_t size;
} pc_shm_region_param;

typedef struct pc_shm_params {
    int pid;
    uint64_t start_time;   /* field 22 of /proc/<pid>/stat: detects pid reuse */
    size_t nregions;
    pc_shm_region_param regions[PC_SHM_MAX_REGIONS];
} pc_shm_params;

typedef struct pc_tcp_params {
    const char *host;
    int port;
    int max_channels;
    double timeout_s;      /* bound on every blocking socket call */
    const uint8_t *token;  /* NULL, or the 32-byte data token each connection's hello carries */
} pc_tcp_params;

/* Ordered copy used by shm: first word with acquire semantics, then the rest. */
void pc_ordered_copy(uint8_t *dst, const uint8_t *src, uint64_t len);

/* Native directory-cache map (dircache.c). */
typedef struct pc_map pc_map;
pc_map *pc_map_new(void);
void pc_map_free(pc_map *m);
/* 1 and *out filled if key is present and expiry > now, else 0 (expired entries are removed). */
int pc_map_get(pc_map *m, const uint8_t *key, size_t klen, double now, pc_loc *out);
int pc_map_put(pc_map *m, const uint8_t *key, size_t klen, const pc_loc *loc, double expiry);
int pc_map_del(pc_map *m, const uint8_t *key, size_t klen);
size_t pc_map_drop_node(pc_map *m, uint32_t node);
void pc_map_clear(pc_map *m);
size_t pc_map_len(pc_map *m);

#endif
