/* The latency trace of trace.h: one array of records, filled by an atomic index. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "trace.h"

const char *const pc_trace_names[PC_TR_N] = {
    "dir_enter", "dir_exit", "table_enter", "table_exit", "read_enter", "read_nogil", "send_begin",
    "send_end", "reply_head", "reply_done", "read_checked", "read_gil", "read_exit", "srv_wake",
    "srv_head", "srv_body", "srv_sent",
};

atomic_int pc_trace_on;
static pc_trace_rec *recs;
static size_t cap;
static atomic_size_t used;
static atomic_ullong dropped;
static _Thread_local uint32_t my_tid;

uint64_t pc_trace_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void pc_trace_put(uint32_t point, uint64_t req, uint64_t ns) {
    size_t i = atomic_fetch_add_explicit(&used, 1, memory_order_relaxed);
    if (i >= cap) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    if (!my_tid) my_tid = (uint32_t)syscall(SYS_gettid);
    recs[i] = (pc_trace_rec){.ns = ns, .req = req, .point = point, .tid = my_tid};
}

int pc_trace_start(size_t n) {
    atomic_store(&pc_trace_on, 0);
    free(recs);   /* the last run's: a writer that read pc_trace_on before it was cleared is long done */
    recs = calloc(n ? n : 1, sizeof *recs);
    if (!recs) { cap = 0; return -1; }
    cap = n;
    atomic_store(&used, 0);
    atomic_store(&dropped, 0);
    atomic_store(&pc_trace_on, 1);
    return 0;
}

size_t pc_trace_stop(pc_trace_rec **out, uint64_t *lost) {
    atomic_store(&pc_trace_on, 0);
    size_t n = atomic_load(&used);
    *out = recs;   /* still ours (freed by the next start): a late writer finds no room, not freed memory */
    *lost = atomic_load(&dropped);
    return n < cap ? n : cap;
}
