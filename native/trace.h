/* Latency trace of one process: timestamps at fixed points of the read path and the tcp
 * server, off by default (one relaxed load a point when off). The get_trace point kind starts it
 * in both processes of a 4 KiB GET (--trace), takes the records at exit and joins them by the
 * request id the tcp wire carries: both sides read CLOCK_MONOTONIC of one kernel (network
 * namespaces share it), so a client's send and the server's wake-up compare directly.
 * Records past the capacity are dropped (counted), never wrapped.
 */
#ifndef PC_TRACE_H
#define PC_TRACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The points, in path order; pc_trace_names holds their names (the Python side's keys). */
enum {
    PC_TR_DIR_ENTER, PC_TR_DIR_EXIT,           /* the directory cache's lookup (GIL held at both) */
    PC_TR_TABLE_ENTER, PC_TR_TABLE_EXIT,       /* table_lookup: the one-sided table read */
    PC_TR_READ_ENTER, PC_TR_READ_NOGIL,        /* read_slots called; the GIL released */
    PC_TR_SEND_BEGIN, PC_TR_SEND_END,          /* a tcp request's send (req: its id) */
    PC_TR_REPLY_HEAD, PC_TR_REPLY_DONE,        /* its reply's header in; its payloads in */
    PC_TR_READ_CHECKED, PC_TR_READ_GIL, PC_TR_READ_EXIT,   /* checks done; GIL back; return */
    PC_TR_SRV_WAKE, PC_TR_SRV_HEAD,            /* server: the epoll wake-up that read the request's first
                                                * bytes; its header in (req) */
    PC_TR_SRV_BODY, PC_TR_SRV_SENT,            /* server: the request whole; its reply sent */
    PC_TR_N
};
extern const char *const pc_trace_names[PC_TR_N];

typedef struct pc_trace_rec {
    uint64_t ns;      /* CLOCK_MONOTONIC */
    uint64_t req;     /* the tcp request id, 0 where the point has none */
    uint32_t point;
    uint32_t tid;     /* the kernel's thread id */
} pc_trace_rec;

extern atomic_int pc_trace_on;

uint64_t pc_trace_now(void);
void pc_trace_put(uint32_t point, uint64_t req, uint64_t ns);

static inline void pc_trace(uint32_t point, uint64_t req) {
    if (__builtin_expect(atomic_load_explicit(&pc_trace_on, memory_order_relaxed), 0))
        pc_trace_put(point, req, pc_trace_now());
}

/* Start with room for cap records (earlier ones are dropped): 0, or -1 (no memory). */
int pc_trace_start(size_t cap);
/* Stop: *recs (valid until the next start) and their count, *dropped the records that found no room. */
size_t pc_trace_stop(pc_trace_rec **recs, uint64_t *dropped);

#endif
