/* Native tcp data server: the epoll loop of server.c, in plain C (no Python).
 * server_type.c is its Python type, peercache._native.RegionTable. */
#ifndef PC_SERVER_H
#define PC_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "pc.h"

#define PC_SRV_KEY_BYTES 32
/* Workers of one table that take part in the hand-off of accepted connections (more still serve). */
#define PC_SRV_MAX_WORKERS 16

/* Counters of RegionTable.stats(), in this order (pc_srv_stat_names). */
enum {
    PC_ST_ACCEPTED, PC_ST_SERVED, PC_ST_OPS_BAD_REGION, PC_ST_OPS_OUT_OF_RANGE, PC_ST_OPS_ZERO_LENGTH,
    PC_ST_REQ_BAD_MAGIC, PC_ST_REQ_TOO_MANY_OPS, PC_ST_REQ_NO_OPS, PC_ST_REQ_TOO_LARGE, PC_ST_CONN_OVER_LIMIT,
    PC_ST_CONN_IDLE, PC_ST_CONN_SLOW, PC_ST_ACCEPT_ERRORS, PC_ST_NOMEM, PC_ST_CONN_NO_TOKEN,
    PC_ST_CONN_BAD_TOKEN, PC_ST_CONN_HELLO_TIMEOUT, PC_ST_CONN_EVICTED, PC_ST_REPLY_WAITS, PC_ST_REQ_BUSY,
    PC_ST_REQ_BAD_TAG, PC_ST_POLL_CAUGHT, PC_ST_POLL_MISSED, PC_SRV_N_STATS
};
extern const char *const pc_srv_stat_names[PC_SRV_N_STATS];

/* What a server may serve (the regions, the key its handshake proves) and the
 * state its workers share: counters, connections, reply memory taken. */
typedef struct pc_srv_table {
    size_t n;                  /* regions, at most PC_SHM_MAX_REGIONS */
    uint32_t ids[PC_SHM_MAX_REGIONS];
    uint64_t rkeys[PC_SHM_MAX_REGIONS];
    uint8_t *bufs[PC_SHM_MAX_REGIONS];
    uint64_t lens[PC_SHM_MAX_REGIONS];
    atomic_ullong refused;     /* ops and requests refused */
    atomic_ullong stats[PC_SRV_N_STATS];
    atomic_long nconns;        /* open connections over all workers */
    atomic_long nserving;      /* of them greeted: counted against max_connections */
    atomic_long ngreeting;     /* of them waiting for their hello */
    atomic_llong reserved;     /* bytes of the reply memory taken (buffers + send queues) */
    atomic_int accept_errno;   /* last accept error */
    atomic_int accept_failing; /* 1 from an accept error until the next accepted connection */
    int has_key;               /* connections must pass the handshake of handshake.h with key */
    uint8_t key[PC_SRV_KEY_BYTES];
    /* The workers serving now, for the hand-off of accepted connections (server.c): each one's
     * connections and the write end of its hand-off pipe (-1: none), under mu. */
    pthread_mutex_t mu;
    int handoff_w[PC_SRV_MAX_WORKERS];
    atomic_long worker_conns[PC_SRV_MAX_WORKERS];
} pc_srv_table;

/* Zeroes the shared state of t (its regions and key are the caller's to fill). */
void pc_srv_table_init(pc_srv_table *t);
/* Frees what pc_srv_table_init made (no worker serving). */
void pc_srv_table_free(pc_srv_table *t);

/* One worker's arguments (RegionTable.serve's, checked by the caller: limits positive,
 * send_buffer not negative). */
typedef struct pc_srv_config {
    int listen_fd, stop_fd;
    long max_conns;            /* greeted connections, over all workers */
    double idle_s, request_s, hello_s;
    long max_greet;            /* this worker's connections waiting for their hello */
    long max_greet_src;        /* of them from one source address */
    long long mem_cap;         /* reply memory, over all workers */
    int sndbuf;                /* SO_SNDBUF asked per connection (0: the kernel's autotuning) */
    double poll_s;             /* after serving, poll for the next request this long before sleeping (0: never) */
} pc_srv_config;

/* Runs one worker of the server on t until stop_fd becomes readable, then closes its
 * connections. Blocks; call it without the GIL. 0, or -1 with errno when its epoll
 * could not be set up (nothing served). */
int pc_srv_serve(pc_srv_table *t, const pc_srv_config *cfg);

#endif
