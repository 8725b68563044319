/* shm backend: the producer's memfd pool mapped read-only, copied with memcpy.
 *
 * The mapping outlives the producer (the memfd stays alive while mapped), so
 * liveness is checked separately: a pidfd opened at connect time, after which
 * the producer's start time is compared to the one it published, so a reused
 * pid is never mistaken for the producer. Every batch polls the pidfd after
 * its copies; a producer that exited turns every op of the batch into
 * PC_PEER_GONE instead of returning bytes nobody maintains any more.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pc.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Above this size glibc memcpy may use `rep movsb`, whose loads can be
 * reordered with later loads; an lfence keeps the trailer read after it. */
#define PC_FENCE_ABOVE 1024
/* Copies from this size on start at a cache line of their destination (copy_aligned). */
#define ALIGN_ABOVE 4096u

void pc_copy_fence(uint64_t len) {
#if defined(__x86_64__) || defined(__i386__)
    if (len > PC_FENCE_ABOVE) __builtin_ia32_lfence();
#endif
    atomic_thread_fence(memory_order_acquire);
}

/* A large copy to a destination off a cache line (a buffer from malloc is 16 bytes off one): glibc's
 * rep movsb runs at 0.88 of its speed to such a destination (C loop on the test machine, 128 KiB
 * slots to a destination 16 bytes off: 20.2 against 23.0 GB/s), so the bytes up to the line go first. */
static void copy_glibc(uint8_t *dst, const uint8_t *src, uint64_t len) {
    uint64_t head = (64 - ((uintptr_t)dst & 63)) & 63;
    if (len < ALIGN_ABOVE || !head) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(dst, src, head);
    memcpy(dst + head, src + head, len - head);
}

/* Copies of PC_STREAM_ABOVE bytes or more, plain or with the bench pattern's check fused in: made through
 * the cache (glibc's memcpy; the fused copy's ordinary stores), or with their stores streamed past it.
 * The CPUs differ: in a C loop of random 128 KiB slots into a batch buffer, streaming ran 1.11-1.59x
 * glibc's rep movsb on a 2-vCPU AMD EPYC VM and 0.93-0.95x on a 2-vCPU Intel Xeon VM, and make bench's
 * drives followed the loops (docs/performance.md). So AMD CPUs stream by default and others copy through
 * the cache; PEERCACHE_SHM_COPY=stream or glibc decides it (pc_copy_way). The process cannot tell by
 * itself: timing its own first copies, alternating, was a coin toss on the Xeon VM (they run into a
 * mapping of the producer's pool touched for the first time, and the lines a copy through the cache
 * leaves dirty are written back during the copies after it), and a short trial on buffers of its own
 * favoured streaming there, where drives ran faster through the cache. */
enum { WAY_GLIBC, WAY_STREAM };
static atomic_int copy_way;   /* WAY_*: set at load (default_copy_way), then by pc_copy_way */

__attribute__((constructor)) static void default_copy_way(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) atomic_store(&copy_way, WAY_STREAM);
#endif
}

int pc_copy_streams(void) { return atomic_load_explicit(&copy_way, memory_order_relaxed) == WAY_STREAM; }

const char *pc_copy_way(const char *set) {
    static const char *names[] = {"glibc", "stream"};
    if (set) {
        int way = strcmp(set, "glibc") == 0 ? WAY_GLIBC : strcmp(set, "stream") == 0 ? WAY_STREAM : -1;
        if (way < 0) return NULL;
        atomic_store(&copy_way, way);
    }
    return names[atomic_load(&copy_way)];
}

static void copy_aligned(uint8_t *dst, const uint8_t *src, uint64_t len) {
    /* pc_copy_stream copies nothing below PC_STREAM_ABOVE or without AVX2: then glibc's */
    if (!pc_copy_streams() || !pc_copy_stream(dst, src, len)) copy_glibc(dst, src, len);
}

/* A copy of len bytes, inlined for the small fixed sizes a slot read is made of (a 64-byte header,
 * an 8-byte trailer, small payloads): a call into glibc's memcpy costs more than such a copy. */
static inline void copy_bytes(uint8_t *dst, const uint8_t *src, uint64_t len) {
    switch (len) {
    case 8: __builtin_memcpy(dst, src, 8); return;
    case 16: __builtin_memcpy(dst, src, 16); return;
    case 32: __builtin_memcpy(dst, src, 32); return;
    case 64: __builtin_memcpy(dst, src, 64); return;
    case 128: __builtin_memcpy(dst, src, 128); return;
    default: copy_aligned(dst, src, len);
    }
}

void pc_ordered_copy(uint8_t *dst, const uint8_t *src, uint64_t len) {
    /* The first word (a header's seq) is loaded alone and first: a header copied
     * in another order could pair an old key hash with a new seq. The whole range
     * is then copied as one aligned copy and the first word put back to the
     * value loaded first (splitting the copy at +8 would misalign big copies). */
    if (len >= 8 && ((uintptr_t)src & 7) == 0) {
        uint64_t w = __atomic_load_n((const uint64_t *)src, __ATOMIC_ACQUIRE);
        atomic_thread_fence(memory_order_acquire);
        copy_bytes(dst, src, len);
        __builtin_memcpy(dst, &w, 8);
    } else {
        copy_bytes(dst, src, len);
    }
    pc_copy_fence(len);
}

typedef struct shm_region {
    uint32_t id;
    uint64_t rkey;
    const uint8_t *base;
    uint64_t size;
} shm_region;

typedef struct shm_conn {
    int pid;
    int pidfd;
    atomic_int gone;
    size_t nregions;
    shm_region regions[PC_SHM_MAX_REGIONS];
} shm_conn;

static int read_start_time(int pid, uint64_t *out) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) return -1;
    buf[k] = 0;
    char *p = strrchr(buf, ')');  /* the command name may hold spaces and ')' */
    if (!p) return -1;
    p += 2;  /* now at field 3 (state) */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -1;
        p++;
    }
    *out = strtoull(p, NULL, 10);
    return 0;
}

static void shm_close(void *c) {
    shm_conn *s = c;
    if (!s) return;
    for (size_t i = 0; i < s->nregions; i++)
        if (s->regions[i].base) munmap((void *)s->regions[i].base, s->regions[i].size);
    if (s->pidfd >= 0) close(s->pidfd);
    free(s);
}

static void *shm_connect(const void *params, char *err, size_t errlen) {
    const pc_shm_params *p = params;
    shm_conn *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
    s->pid = p->pid;
    s->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    if (s->pidfd < 0) {
        snprintf(err, errlen, "producer pid %d is not running (pidfd_open: %s)", p->pid, strerror(errno));
        shm_close(s);
        return NULL;
    }
    uint64_t st = 0;
    if (read_start_time(p->pid, &st) != 0 || st != p->start_time) {
        snprintf(err, errlen, "producer pid %d was replaced by another process (start time %llu, "
                 "published %llu); the producer exited", p->pid, (unsigned long long)st,
                 (unsigned long long)p->start_time);
        shm_close(s);
        return NULL;
    }
    if (p->nregions > PC_SHM_MAX_REGIONS) {
        snprintf(err, errlen, "%zu regions exceed the %d an shm peer may expose", p->nregions,
                 PC_SHM_MAX_REGIONS);
        shm_close(s);
        return NULL;
    }
    for (size_t i = 0; i < p->nregions; i++) {
        const pc_shm_region_param *r = &p->regions[i];
        int fd = open(r->path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(err, errlen, "cannot open the producer's pool %s: %s (same user or root needed)",
                     r->path, strerror(errno));
            shm_close(s);
            return NULL;
        }
        struct stat sb;
        if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < r->size || r->size == 0) {
            snprintf(err, errlen, "producer's pool %s is %lld bytes, endpoint info says %llu", r->path,
                     (long long)sb.st_size, (unsigned long long)r->size);
            close(fd);
            shm_close(s);
            return NULL;
        }
        void *base = mmap(NULL, r->size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
            snprintf(err, errlen, "cannot map the producer's pool %s read-only: %s", r->path, strerror(errno));
            shm_close(s);
            return NULL;
        }
        s->regions[i] = (shm_region){r->id, r->rkey, base, r->size};
        s->nregions = i + 1;
    }
    return s;
}

static int shm_alive(void *c) {
    shm_conn *s = c;
    if (atomic_load_explicit(&s->gone, memory_order_relaxed)) return 0;
    struct pollfd pfd = {.fd = s->pidfd, .events = POLLIN};
    /* A pidfd becomes readable when its process exits. */
    if (poll(&pfd, 1, 0) != 0) {
        atomic_store(&s->gone, 1);
        return 0;
    }
    return 1;
}

static int shm_read_batch(void *c, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                          int32_t *status, char *err, size_t errlen, const pc_notify *notify) {
    shm_conn *s = c;
    (void)nlocals;
    const shm_region *last = s->nregions ? &s->regions[0] : NULL;
    for (size_t i = 0; i < n; i++) {
        const pc_op *op = &ops[i];
        const shm_region *r = NULL;
        if (last && last->id == op->region) {
            r = last;
        } else {
            for (size_t j = 0; j < s->nregions; j++)
                if (s->regions[j].id == op->region) { r = &s->regions[j]; break; }
        }
        if (!r || r->rkey != op->rkey) { status[i] = PC_BAD_REGION; continue; }
        last = r;
        if (op->remote_offset > r->size || op->length > r->size - op->remote_offset) {
            status[i] = PC_OUT_OF_RANGE;
            continue;
        }
        uint8_t *dst = locals[op->local_region].base + op->local_offset;
        const uint8_t *src = r->base + op->remote_offset;
        if (notify && notify->copy && notify->copy(notify->ctx, i, dst, src, op->length))
            pc_copy_fence(op->length);   /* the same ordering as pc_ordered_copy's end */
        else
            pc_ordered_copy(dst, src, op->length);
        status[i] = PC_OK;
        if (notify) notify->done(notify->ctx, i);   /* its bytes are still in cache */
    }
    /* Checked after the copies: alive now means alive while they ran. */
    if (!shm_alive(s)) {
        for (size_t i = 0; i < n; i++) status[i] = PC_PEER_GONE;
        snprintf(err, errlen, "producer pid %d exited", s->pid);
        return -1;
    }
    return 0;
}

const pc_backend pc_shm_backend = {
    .name = "shm",
    .connect = shm_connect,
    .read_batch = shm_read_batch,
    .alive = shm_alive,
    .close = shm_close,
};
