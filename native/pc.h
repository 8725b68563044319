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
    PC_TOO_BIG = 102,      /* object larger than the caller's capacity */
    PC_CONTENT_MISMATCH = 103,  /* a hit whose bytes are not the bench pattern of (key, generation) */
    PC_CHECKSUM_MISMATCH = 104, /* integrity on: the payload does not match its slot checksum (a miss) */
    PC_CHECKSUM_MISSING = 105,  /* integrity on: the producer wrote no checksum (a miss) */
    PC_KEY_MISMATCH = 106  /* the slot is the one its entry describes, but holds another key: a miss */
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

/* Slot geometry of peercache.tags: header words seq, key_hash, generation,
 * length, checksum, 3 reserved (a cache line: the payload starts on one);
 * the payload; the trailer's seq. */
#define PC_HEADER_BYTES 64u
#define PC_TRAILER_BYTES 8u
#define PC_TAG_BYTES 72u
#define PC_TAG_WORDS 9u        /* of a key's tag scratch: the header words, then the trailer's seq */
#define PC_TAG_CHECKSUM 4u     /* the header word of the payload checksum (0: none written) */

/* The slot tag check of one key read at loc, asked for as the key whose hash
 * (tags.key_hash, computed by the consumer) is want: PC_OK when the bytes are
 * that object (seqlock even and equal at both ends, the key hash want, the
 * generation and length of loc); PC_KEY_MISMATCH when the slot is stable and
 * is what loc describes (generation, length) but holds another key (the
 * directory's entry points at another key's slot); else PC_TAG_MISMATCH
 * (evicted, reused or torn while read). Never the key hash loc carries: that
 * is the directory's word, not the consumer's. */
int32_t pc_tag_check(const uint64_t tag[PC_TAG_WORDS], const pc_loc *loc, uint64_t want);

/* Payload checks (checksum.c). pc_checksum: XXH3-64 (libxxhash) of len bytes
 * seeded with pc_checksum_seed(key_hash, generation), never 0 (0 = none);
 * the same value as peercache.tags.checksum. pc_pattern_ok: 1 when the bytes
 * are the bench content of (key_hash, generation), peercache.tags.fill_pattern. */
uint64_t pc_checksum_seed(uint64_t key_hash, uint64_t generation);
uint64_t pc_checksum(const void *buf, size_t len, uint64_t seed);
int pc_pattern_ok(const uint8_t *buf, size_t len, uint64_t key_hash, uint64_t generation);
/* The same checks fused with the copy of len bytes from src to dst (shm):
 * pc_copy_checksum returns the checksum of what it copied, pc_copy_pattern
 * whether it is the bench content. */
uint64_t pc_copy_checksum(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed);
/* From this many bytes on, an shm copy (plain, or with the pattern check fused in) may stream its stores
 * (non-temporal, from a cache line of the destination on: a store then needs no read of the destination
 * line first), where the process is told to (pc_copy_way, shm.c). On one 2-vCPU VM a C loop
 * of random 128 KiB slots of a pool into a buffer 16 bytes off a line (as drive's) ran 1.11-1.14x faster
 * streamed than glibc's rep movsb for batches of 32 out of 32 MiB, 1.56-1.59x for batches of 128 out of
 * 64 MiB; on another of the same kind 0.93-0.95x. A destination that is read right after loses its copy
 * in cache; 128 KiB pages are past what L1 and L2 keep anyway, and a HiCache host page is read by the
 * GPU's DMA. */
#define PC_STREAM_ABOVE (64u << 10)
/* stream: 1 lets a large copy (PC_STREAM_ABOVE and up, dst 8-aligned) stream its stores past the cache;
 * 0 stores through it (pc_copy_streams says which this process does). */
int pc_copy_pattern(uint8_t *dst, const uint8_t *src, size_t len, uint64_t key_hash, uint64_t generation,
                    int stream);
/* A copy of PC_STREAM_ABOVE bytes or more with its stores streamed past the cache from dst's first cache
 * line on, where the CPU has AVX2: 1 when done, 0 (nothing copied) otherwise. */
int pc_copy_stream(uint8_t *dst, const uint8_t *src, size_t len);
/* How shm copies of PC_STREAM_ABOVE bytes or more are made in this process (shm.c): "glibc" or "stream"
 * (the default: stream on AMD CPUs, glibc elsewhere). set (one of the two, or NULL to only ask): so from
 * now on. NULL for a name that is neither. */
const char *pc_copy_way(const char *set);
/* 1 where this process streams its copies of PC_STREAM_ABOVE bytes or more (pc_copy_way), else 0. */
int pc_copy_streams(void);
/* Checks read_slots can run on each hit (pc_slot_batch.checks). */
enum { PC_CHECK_PATTERN = 1, PC_CHECK_INTEGRITY = 2 };

/*
 * The reads of one slot, in the order its seqlock check needs: header,
 * payload, trailer (an empty object has no payload op). Header and trailer
 * land in the key's PC_TAG_BYTES of tag scratch (local buffer PC_SLOT_TAGS,
 * header then trailer: the words pc_tag_check reads), the payload in the
 * destination (local buffer PC_SLOT_DEST). This is the one definition of
 * the layout in C: read_slots issues it (slots.c), the verbs planner keeps
 * a slot's ops on one QP in this order (verbs_plan.c) and reads a whole
 * slot as one READ of PC_SLOT_MAX_OPS scatter entries (PV_MAX_SGE).
 * peercache.transport.base.slot_ops is the same layout in Python.
 */
enum { PC_SLOT_TAGS = 0, PC_SLOT_DEST = 1 };
#define PC_SLOT_MAX_OPS 3

/* How many ops the read of slot l has: 3, or 2 for an empty object. */
static inline size_t pc_slot_nops(const pc_loc *l) { return l->length ? 3 : 2; }

/* Writes the ops of the read of slot l to out: its tags at tag_off of the
 * tag scratch, its payload at dest_off of the destination. Returns how many
 * (pc_slot_nops(l)). */
static inline size_t pc_slot_ops(const pc_loc *l, uint64_t tag_off, uint64_t dest_off, pc_op *out) {
    size_t k = 0;
    out[k++] = (pc_op){l->region, PC_SLOT_TAGS, l->rkey, l->offset, PC_HEADER_BYTES, tag_off};
    if (l->length)  /* an empty object has no payload op to issue */
        out[k++] = (pc_op){l->region, PC_SLOT_DEST, l->rkey, l->offset + PC_HEADER_BYTES, l->length,
                           dest_off};
    out[k++] = (pc_op){l->region, PC_SLOT_TAGS, l->rkey, l->offset + PC_HEADER_BYTES + l->capacity,
                       PC_TRAILER_BYTES, tag_off + PC_HEADER_BYTES};
    return k;
}

/*
 * The backend interface. A backend moves bytes for ops whose local side
 * was already validated (length > 0, destination inside its buffer); it
 * checks the remote side itself (or its server does) and sets one status
 * per op. It is called without the GIL, from any number of threads at
 * once, and must not serialise them on one lock for the whole batch.
 * The RDMA verbs backend implements the same four calls.
 */
/* Told to a backend's read_batch (optional): done(ctx, i) is called once the
 * bytes of op i have landed with status PC_OK, in op order, from the calling
 * thread, while they are still hot in cache (shm: after each copy; tcp: after
 * each reply's payloads). A backend whose bytes land by DMA (verbs) may not
 * call it; the caller then checks after the batch. */
typedef struct pc_notify {
    void (*done)(void *ctx, size_t op);
    /* Optional, for a backend that copies (shm): copies op i's len bytes from src to dst
     * itself (fusing its checks with the copy) and returns 1, or returns 0 and the
     * backend copies as usual. Ordering fences after the copy stay the backend's. */
    int (*copy)(void *ctx, size_t op, uint8_t *dst, const uint8_t *src, uint64_t len);
    void *ctx;
} pc_notify;

typedef struct pc_backend {
    const char *name;
    /* Open a connection from a backend-specific parameter block; NULL + err on failure. */
    void *(*connect)(const void *params, char *err, size_t errlen);
    /* Execute ops in order; fills status[0..n); returns 0, or -1 with err set.
     * notify may be NULL. */
    int (*read_batch)(void *conn, const pc_op *ops, size_t n, const pc_local *locals,
                      size_t nlocals, int32_t *status, char *err, size_t errlen, const pc_notify *notify);
    /* 1 while the peer is usable, 0 once it is known gone (optional, may be NULL). */
    int (*alive)(void *conn);
    /* 1 when the connection should be replaced before its next batch (verbs: it is dead, or
     * a rail it lost may get fresh QPs now). Cheap, asked per batch by read_slots, which then
     * treats the node as not connected (optional, may be NULL). */
    int (*stale)(void *conn);
    void (*close)(void *conn);
    /* How waits for a reply went: replies a poll caught, waits that slept, polls that ran out
     * before they slept (optional, may be NULL). */
    void (*wait_stats)(void *conn, uint64_t *polled, uint64_t *slept, uint64_t *missed);
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

/* How the tcp client (tcp.c) moves a batch: requests of at most PC_TCP_REQ_OPS ops and
 * PC_TCP_REQ_BYTES bytes (or one op, when that op alone is more), PC_TCP_WINDOW of them in
 * flight on one channel. The module exports them (REQ_OPS, REQ_BYTES, WINDOW): the one source of
 * peercache.transport.tcp's model of the wire (batch_wire).
 * 1 MiB requests, 8 in flight: the first bytes of a batch leave the server
 * after one small request rather than a 4 MiB one, and the tail of one
 * request overlaps the next. Measured over a veth pair (make bench):
 * 4 MiB x 4 gave 0.76-0.79 of iperf3 with one stream, 1 MiB x 8 gives 0.94. */
#define PC_TCP_REQ_OPS 256
#define PC_TCP_REQ_BYTES (1u << 20)
#define PC_TCP_WINDOW 8

typedef struct pc_tcp_params {
    const char *host;
    int port;
    int max_channels;
    double timeout_s;      /* bound on every blocking socket call */
    int poll_us;           /* poll a reply this long before sleeping (0: sleep at once) */
    const uint8_t *key;    /* NULL, or the 32-byte data key each connection's handshake proves (handshake.h) */
} pc_tcp_params;

/* Ordered copy used by shm: first word with acquire semantics, then the rest. */
void pc_ordered_copy(uint8_t *dst, const uint8_t *src, uint64_t len);
/* The end of pc_ordered_copy: no later load passes the copy's loads. */
void pc_copy_fence(uint64_t len);

/* Slot reads (slots.c): the engine of peercache._native.read_slots, run without the GIL. */

/* Per-key outcome of a slot read: the numbers of peercache.node.Get. */
enum { PC_GET_HIT = 0, PC_GET_MISS = 1, PC_GET_ERROR = 2 };

/* A node of the batch and its connection (be NULL: no connected handle yet). */
typedef struct pc_slot_peer {
    uint32_t node;
    const pc_backend *be;
    void *conn;
    void *owner;           /* the caller's (the binding's reference to its Peer); not used here */
} pc_slot_peer;

/* One batch of slot reads. In: a location per key and where its bytes go.
 * Out, per key: status, codes, lengths and gens. */
typedef struct pc_slot_batch {
    size_t n;
    const pc_loc *locs;        /* node PC_ABSENT: not read (stays a miss) */
    const uint64_t *want;      /* per key: tags.key_hash of the key asked for, computed by the consumer */
    uint8_t *dest;
    uint64_t destlen;
    /* per key, its own destination buffer (a caller's buffer per key: its payload is local
     * buffer PC_SLOT_DEST + i, at offsets[i] of it), or NULL: every payload in dest */
    const pc_local *dests;
    const uint64_t *offsets;   /* where each payload goes in dest (in dests[i]) */
    const uint64_t *caps;      /* most payload bytes each key takes, or NULL */
    int8_t *status;            /* PC_GET_* */
    int32_t *codes;            /* 0, the status of its first failed op, or a per-key code (PC_NEED_PEER...) */
    uint64_t *lengths, *gens;  /* of the hits; 0 elsewhere */
    unsigned checks;           /* PC_CHECK_* run on each key whose tags matched */
} pc_slot_batch;

/* Counts of a batch and its first failed read. */
typedef struct pc_slot_result {
    size_t hits, stale, need_peer, errors;
    size_t redirected;         /* misses by PC_KEY_MISMATCH: the entry points at another key's slot */
    size_t content_bad;        /* hits whose bytes are not the bench pattern (PC_CHECK_PATTERN) */
    size_t checksum_bad;       /* misses by a wrong checksum (PC_CHECK_INTEGRITY) */
    size_t checksum_missing;   /* misses by a slot without a checksum (PC_CHECK_INTEGRITY) */
    int32_t err_code;          /* the status of the first failed op, 0 if none */
    uint32_t err_node;         /* its node, PC_ABSENT if none */
    char err[512];             /* its backend's message */
} pc_slot_result;

/* Collects the distinct nodes of locs[i..n) that are not in nodes[0..*nn) yet, in
 * order of first appearance, with be, conn and owner NULL, while nodes has room
 * (cap). Returns n once all are in, or the key whose node found no room: grow
 * nodes and call again from there. */
size_t pc_slot_nodes(const pc_loc *locs, size_t i, size_t n, pc_slot_peer *nodes, size_t cap, size_t *nn);
/* Bytes of scratch pc_read_slots needs for n keys: per key its tags (PC_TAG_WORDS), up to
 * PC_SLOT_MAX_OPS ops, their statuses and keys, the index of its first op, the outcome
 * of its payload checks and its local buffer (a batch with dests). */
static inline size_t pc_slot_scratch_bytes(size_t n) {
    /* ... and, for a batch with dests, the call's local buffers (the tags, then one per key) */
    return (n ? n : 1) * (PC_TAG_BYTES + PC_SLOT_MAX_OPS * (sizeof(pc_op) + 4 + 4) + 4 + 4 + sizeof(pc_local))
           + sizeof(pc_local);
}
/* Reads the batch: one read_batch per node of nodes[0..nn) that has a handle,
 * then the tag check of every key read and, on the hits, the checks of b->checks. scratch: pc_slot_scratch_bytes(b->n)
 * bytes, suitably aligned for pc_op (any malloc). */
void pc_read_slots(const pc_slot_batch *b, const pc_slot_peer *nodes, size_t nn, void *scratch,
                   pc_slot_result *r);

/* Some bytes (a key). */
typedef struct pc_bytes { const uint8_t *p; size_t n; } pc_bytes;

/* Native directory-cache map (dircache.c). */
typedef struct pc_map pc_map;
pc_map *pc_map_new(void);
void pc_map_free(pc_map *m);
/* 1 and *out filled if key is present and expiry > now, else 0 (expired entries are removed).
 * want (may be NULL): the key's hash, pc_key_hash, which the map computed when it took the key
 * (so a hit costs no hash), or computes now for a key it does not hold. */
int pc_map_get(pc_map *m, const uint8_t *key, size_t klen, double now, pc_loc *out, uint64_t *want);
/* pc_map_get of n keys at once, their cache misses overlapped (dircache.c): out[i].node = absent
 * for a key not found; returns how many were found. */
size_t pc_map_get_many(pc_map *m, const pc_bytes *keys, size_t n, double now, pc_loc *out, uint64_t *want,
                       uint32_t absent);
int pc_map_put(pc_map *m, const uint8_t *key, size_t klen, const pc_loc *loc, double expiry);
int pc_map_del(pc_map *m, const uint8_t *key, size_t klen);
size_t pc_map_drop_node(pc_map *m, uint32_t node);
void pc_map_clear(pc_map *m);
size_t pc_map_len(pc_map *m);

/* Directory table reads (dirtable.c): the consumer's side of peercache/directory/table.py. */
#define PC_TABLE_LINE_BYTES 64u
#define PC_TABLE_MAGIC 0x3142545249444350ull   /* "PCDIRTB1" little-endian: dirtable.MAGIC */
#define PC_TABLE_KEY_HASH_WORD 6u              /* the entry word holding the key hash */

/* A table's geometry as announced (TableView.native_spec: struct "<IIQQQ"). */
typedef struct pc_table_spec {
    uint32_t region, ways;
    uint64_t rkey, buckets, seal;
} pc_table_spec;

/* Per-key outcome of a table read. */
enum { PC_TABLE_DOUBT = 0, PC_TABLE_FOUND = 1, PC_TABLE_ABSENT = 2 };
/* Outcome of the whole read: done (rows hold node indices); the read failed (err_code, err);
 * the header failed its check or names another geometry (every key doubtful); or the rows of
 * found keys still hold member numbers (the epoch is not the caller's, or a number is
 * unknown to it): the caller maps its numbers again and calls pc_table_map. */
enum { PC_TABLE_DONE = 0, PC_TABLE_READ_FAILED = 1, PC_TABLE_BAD_HEADER = 2, PC_TABLE_REMAP = 3 };


typedef struct pc_table_batch {
    size_t n;
    const pc_bytes *keys;
    const pc_table_spec *spec;
    const pc_backend *be;          /* the table node's handle (be, conn), or be NULL and: */
    void *conn;
    const uint8_t *mem;            /* the table itself (its host reads its own), memlen bytes */
    uint64_t memlen;
    const uint32_t *nums;          /* member number -> the cache's node index (PC_ABSENT: unknown) */
    size_t nnums;
    int have_epoch;                /* nums are as of expect_epoch (0: not mapped yet) */
    uint64_t expect_epoch;
    uint64_t slot_limit;           /* the largest offset + capacity a slot record may name */
    pc_loc *rows;                  /* out: a record per found key, node PC_ABSENT elsewhere */
    int8_t *state;                 /* out: PC_TABLE_* per key */
} pc_table_batch;

typedef struct pc_table_result {
    int code;                      /* PC_TABLE_DONE ... */
    uint64_t epoch;                /* the header's (not PC_TABLE_READ_FAILED / BAD_HEADER) */
    size_t resolved;               /* keys found or absent (final with PC_TABLE_DONE) */
    size_t unknown;                /* found keys whose member number nums does not map */
    int32_t err_code;              /* PC_TABLE_READ_FAILED: the status of the first failed op */
    char err[512];                 /* and its backend's message */
} pc_table_result;

/* tags.key_hash: BLAKE2b-64 of the key, little-endian, 0 -> 1. */
uint64_t pc_key_hash(const uint8_t *p, size_t n);
void pc_table_read(const pc_table_batch *b, pc_table_result *r);
/* Maps the member numbers of found rows to node indices and refuses records that cannot be a
 * slot (both: doubtful, node PC_ABSENT). Not final: when a found number is unknown nothing
 * changes, *unknown says how many and 0 is returned. Returns the found keys mapped. */
size_t pc_table_map(pc_loc *rows, int8_t *state, size_t n, const uint32_t *nums, size_t nnums, uint64_t lim,
                    int final, size_t *unknown);
size_t pc_table_count_resolved(const int8_t *state, size_t n);

#endif
