/* tcp data server: range reads served by a few epoll workers, without the GIL.
 *
 * The wire format is peercache/transport/tcp.py's: each op must name an
 * exposed region with its key and lie inside it; anything else gets an
 * error status and the server keeps serving. A request without ops, or one
 * whose reply would exceed MAX_REPLY_BYTES, is refused whole and the
 * connection goes on; only a lost framing (bad magic, too many ops) ends the
 * connection, after a refusal that says why.
 *
 * pc_srv_serve() is one worker: it runs an epoll loop until the stop fd
 * becomes readable. This file is plain C (server.h); its Python type,
 * peercache._native.RegionTable in server_type.c, holds the table and runs
 * one worker per RegionTable.serve() call. Every worker of one server
 * shares its listening socket (EPOLLEXCLUSIVE: one worker woken per
 * connection) and the table's counters; each owns the connections it
 * accepted. Sockets are non-blocking, so a connection costs a small struct
 * and no thread, and a reply larger than the socket buffer is sent in
 * pieces between the other connections' work. Limits, all counted in the
 * table's stats():
 *   - a new connection finishes its handshake (or, without a key, sends its
 *     first request) in a budget of its own: at most max_greeting of them
 *     per worker, max_greeting_per_source of them from one address, each
 *     for at most hello_timeout from its accept (hello, challenge and proof
 *     all count). Past a cap the oldest waiting one (of that address, or of
 *     all) is closed, so clients that never say hello can neither fill the
 *     server nor keep out a client that greets at once: its hello is read,
 *     and the challenge sent, the moment it is accepted;
 *   - at most max_connections greeted ones at once (over all workers): one
 *     more is told "the data server is at its connection limit" and closed;
 *   - a connection with no request under way is closed after idle_timeout;
 *   - a request (header and body) must arrive within request_timeout of its
 *     first byte, and a reply must send PROGRESS_BYTES (or its end) at least
 *     that often, else the connection is closed: a slow reader cannot hold
 *     its reply's buffers for long;
 *   - memory for replies has a cap over all workers (reply_memory bytes): a
 *     request takes its buffers (beyond the small ones each connection keeps)
 *     plus its socket's send buffer (send_buffer bytes asked of the kernel
 *     per connection, SO_SNDBUF) before its body is read, and gives the send
 *     buffer back once the socket's queue has drained (SIOCOUTQ, checked each
 *     tick); a request that does not fit waits (its body unread, so its
 *     sender is paced by TCP), for request_timeout at most, then is refused;
 *     a reply whose tail is not read within request_timeout is dropped;
 *   - an accept error (EMFILE, ENFILE, ENOBUFS...) takes the listening
 *     socket out of the worker's epoll for 10 ms, doubling up to 100 ms,
 *     then accepting resumes: the loop never ends on it.
 * Waiting for the next request: after a wake-up that served a connection, a
 * worker polls its epoll (no timeout) for up to poll_s before it sleeps in
 * epoll_wait again, as the tcp client polls for its reply (tcp.c): a sleeping
 * worker costs each request a wake-up (a scheduler round trip and, in a VM,
 * an IPI and a halt exit: 12-19 us of a 4 KiB GET's ~50 on this project's
 * 2-vCPU VM, measured with the trace of `ratios --only latency_breakdown`), on top of the
 * sender's cost of waking it. The poll backs off as the client's does: after
 * POLL_MISSES polls in a row that ran out, the next POLL_SKIP wake-ups sleep
 * at once, so an idle or slow client costs at most poll_s of CPU per
 * POLL_SKIP requests, and yields the CPU between polls to any thread waiting
 * for it (on a machine with no core to spare, polling only takes one away).
 * Nothing here logs: the Python side reads stats() and writes rate-limited
 * summaries, so a flood of bad requests costs a counter increment each.
 *
 * A connection starts in the greeting stage: its first message goes
 * through greet(). A table made with a key (from the cluster secret) serves
 * nothing before the handshake of handshake.h: the client's hello brings its
 * nonce; on_nonce() answers with ours, the address the connection reached
 * and our proof over them, so the client learns we hold the secret (and are
 * the server it dialed, not something forwarding to us) before it proves
 * anything; on_proof() checks the client's proof in constant time and
 * admits the connection. From then on each request carries a tag under the
 * handshake's session key, checked (on_body) before anything the request
 * asks for is looked at: nothing on the path can add, replay or change a
 * request. The whole handshake
 * runs within the greeting's budget (hello_timeout, the caps on waiting
 * connections). A request first, a hello of another version, or a wrong
 * proof or tag gets a refusal with req_id 0 (or the request's) and the
 * connection is closed. A table without a key admits a connection whose
 * first message is a request, and refuses a hello: it cannot prove a secret.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "handshake.h"
#include "pc.h"
#include "server.h"
#include "trace.h"

#define HEAD_BYTES 20
#define WIRE_OP_BYTES 32
#define MAX_OPS (1u << 16)
#define MAX_REPLY_BYTES (1ull << 31)
#define SEND_IOV 1024
/* Ops whose buffers a connection keeps between requests; bigger requests get
 * mmap'ed buffers that are unmapped when the reply is out. */
#define SMALL_OPS 256u
#define ACCEPT_BURST 64
#define EVENTS 64
/* Requests one connection may complete per wakeup before the others get a turn. */
#define REQ_BURST 16
#define BACKOFF_MIN 0.010
#define BACKOFF_MAX 0.100
/* A reply must send this much (or its end) every request_timeout. */
#define PROGRESS_BYTES (256u << 10)
/* Tick while a request waits for reply memory. */
#define WAIT_TICK 0.010
/* The poll's back-off (see the top of this file). */
#define POLL_MISSES 8
#define POLL_SKIP 256

const char *const pc_srv_stat_names[PC_SRV_N_STATS] = {
    "accepted", "served", "ops_bad_region", "ops_out_of_range", "ops_zero_length",
    "req_bad_magic", "req_too_many_ops", "req_no_ops", "req_too_large", "conn_over_limit",
    "conn_idle", "conn_slow", "accept_errors", "nomem", "conn_no_token", "conn_bad_token",
    "conn_hello_timeout", "conn_evicted", "reply_memory_waits", "req_busy", "req_bad_tag",
    "poll_caught", "poll_missed",
};

void pc_srv_table_init(pc_srv_table *t) {
    atomic_init(&t->refused, 0);
    for (int i = 0; i < PC_SRV_N_STATS; i++) atomic_init(&t->stats[i], 0);
    atomic_init(&t->nconns, 0);
    atomic_init(&t->nserving, 0);
    atomic_init(&t->ngreeting, 0);
    atomic_init(&t->reserved, 0);
    atomic_init(&t->accept_errno, 0);
    atomic_init(&t->accept_failing, 0);
    pthread_mutex_init(&t->mu, NULL);
    for (int i = 0; i < PC_SRV_MAX_WORKERS; i++) {
        t->handoff_w[i] = -1;
        atomic_init(&t->worker_conns[i], 0);
    }
}

void pc_srv_table_free(pc_srv_table *t) {
    pthread_mutex_destroy(&t->mu);
}

static inline void count(pc_srv_table *t, int which, unsigned long long k) {
    atomic_fetch_add_explicit(&t->stats[which], k, memory_order_relaxed);
}

/* ------------------------------------------------------------- the checks */

/* Status of each of the n wire ops; an iovec (from iov[0]) onto the bytes of
 * each ok one. Returns the count of ok ops; *total: their bytes (saturating);
 * bad[3]: ops refused as bad region/key, out of range, zero length. */
static size_t check_ops(pc_srv_table *t, const uint8_t *wire, uint32_t n, int32_t *status,
                        struct iovec *iov, uint64_t *total, uint64_t bad[3]) {
    size_t k = 0;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *w = wire + (size_t)i * WIRE_OP_BYTES;
        uint32_t region;
        uint64_t rkey, off, len;
        memcpy(&region, w, 4);
        memcpy(&rkey, w + 8, 8);
        memcpy(&off, w + 16, 8);
        memcpy(&len, w + 24, 8);
        size_t r = 0;
        while (r < t->n && t->ids[r] != region) r++;
        if (r == t->n || t->rkeys[r] != rkey) { status[i] = PC_BAD_REGION; bad[0]++; continue; }
        uint64_t size = t->lens[r];
        if (len == 0) { status[i] = PC_ZERO_LENGTH; bad[2]++; continue; }
        if (off > size || len > size - off) { status[i] = PC_OUT_OF_RANGE; bad[1]++; continue; }
        status[i] = PC_OK;
        iov[k].iov_base = t->bufs[r] + off;
        iov[k].iov_len = len;
        sum = sum + len < sum ? UINT64_MAX : sum + len;
        k++;
    }
    *total = sum;
    return k;
}

static void count_bad(pc_srv_table *t, const uint64_t bad[3]) {
    uint64_t all = bad[0] + bad[1] + bad[2];
    if (!all) return;
    atomic_fetch_add(&t->refused, all);
    if (bad[0]) count(t, PC_ST_OPS_BAD_REGION, bad[0]);
    if (bad[1]) count(t, PC_ST_OPS_OUT_OF_RANGE, bad[1]);
    if (bad[2]) count(t, PC_ST_OPS_ZERO_LENGTH, bad[2]);
}

/* What to do with a request header: 0 = read n ops; else the refusal (reason
 * in why), which loses the framing. A request without ops is refused once
 * its tag is checked (on_body). */
static int check_head(pc_srv_table *t, const uint8_t *head, uint32_t *n, uint64_t *req_id,
                      char *why, size_t whylen) {
    memcpy(n, head + 8, 4);
    memcpy(req_id, head + 12, 8);
    if (memcmp(head, "PCRQ", 4) != 0) {
        char m[4 * 4 + 1];
        size_t o = 0;
        m[0] = 0;
        for (int i = 0; i < 4; i++) {
            unsigned char ch = head[i];
            if (ch >= 0x20 && ch < 0x7f && ch != '\\' && ch != '\'') m[o++] = (char)ch;
            else o += (size_t)snprintf(m + o, sizeof m - o, "\\x%02x", ch);
        }
        m[o] = 0;
        snprintf(why, whylen, "bad request magic '%s'; not a PeerCache client?", m);
        count(t, PC_ST_REQ_BAD_MAGIC, 1);
        return -1;
    }
    if (*n > MAX_OPS) {
        snprintf(why, whylen, "%u ops in one request exceeds %u; split the batch", *n, MAX_OPS);
        count(t, PC_ST_REQ_TOO_MANY_OPS, 1);
        return -1;
    }
    return 0;
}

static void too_large(pc_srv_table *t, uint64_t total, char *why, size_t whylen) {
    snprintf(why, whylen, "request asks for %llu bytes, more than %llu; split the batch",
             (unsigned long long)total, MAX_REPLY_BYTES);
    count(t, PC_ST_REQ_TOO_LARGE, 1);
}

static void fill_head(uint8_t *h, uint32_t code, uint32_t n, uint64_t req_id) {
    memcpy(h, "PCRS", 4);
    memcpy(h + 4, &code, 4);
    memcpy(h + 8, &n, 4);
    memcpy(h + 12, &req_id, 8);
}

/* ------------------------------------------------------------- buffers */

/* The three per-request arrays of one connection, in one allocation. */
typedef struct opbuf {
    uint8_t *wire;        /* cap * WIRE_OP_BYTES */
    int32_t *status;      /* cap */
    struct iovec *iov;    /* cap + 2: reply head, statuses, then the payloads */
    size_t cap, bytes;
    int mapped;
} opbuf;

static size_t opbuf_bytes(size_t cap) {
    return cap * WIRE_OP_BYTES + cap * sizeof(int32_t) + (cap + 2) * sizeof(struct iovec);
}

static void opbuf_free(opbuf *b) {
    if (!b->cap) return;
    if (b->mapped) munmap(b->iov, b->bytes);
    else free(b->iov);
    memset(b, 0, sizeof *b);
}

/* Room for n ops: small requests reuse one malloc'ed block; a big one gets
 * its own mapping, whose pages cost memory only as the ops arrive. */
static int opbuf_reserve(opbuf *b, size_t n) {
    if (n <= b->cap) return 0;
    opbuf_free(b);
    size_t cap = n <= SMALL_OPS ? SMALL_OPS : n;
    size_t bytes = opbuf_bytes(cap);
    void *p;
    int mapped = cap > SMALL_OPS;
    if (mapped) {
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return -1;
    } else {
        p = malloc(bytes);
        if (!p) return -1;
    }
    /* iovecs first (the base, and the strictest alignment), then statuses, then the wire ops */
    b->iov = p;
    b->status = (int32_t *)((uint8_t *)p + (cap + 2) * sizeof(struct iovec));
    b->wire = (uint8_t *)(b->status + cap);
    b->cap = cap;
    b->bytes = bytes;
    b->mapped = mapped;
    return 0;
}

/* ------------------------------------------------------------- the event loop */

enum { C_HEAD, C_BODY, C_SEND, C_NONCE, C_PROOF };
enum { STAGE_GREETING, STAGE_SERVING };

typedef struct conn {
    struct conn *prev, *next;     /* the worker's connections */
    struct conn *gprev, *gnext;   /* the worker's connections waiting for their hello, oldest first */
    int fd;
    int state;           /* C_HEAD, C_BODY, C_SEND, or C_NONCE / C_PROOF (the hello's nonce, the client's proof) */
    int stage;           /* STAGE_GREETING until greet() accepted the first message */
    int greeting;        /* in the worker's greeting list */
    int serving;         /* counted in the table's nserving */
    int close_after;     /* framing lost: close once the refusal is out */
    int refusal;         /* the reply under way is a refusal */
    int waiting;         /* its request waits for reply memory (no events polled meanwhile) */
    int tagged;          /* passed the handshake: each request carries a tag after its ops */
    uint64_t seq;        /* requests received so far: the number the next one's tag is under */
    uint32_t events;     /* the epoll events registered */
    size_t got;          /* bytes of the current header or body received */
    uint32_t n;
    uint64_t req_id;
    double deadline;     /* hello, idle, request or send-progress deadline (monotonic s) */
    double drain_by;     /* a finished reply's queue must be read by then */
    size_t progress;     /* reply bytes sent since the deadline last moved */
    struct iovec *cur;   /* reply still to send */
    size_t left;
    long long hbuf;      /* reply memory held for the mapped op buffers */
    long long qcap;      /* this socket's send buffer (SO_SNDBUF as the kernel set it) */
    int hq;              /* qcap is held of the reply memory (until the send queue drains) */
    uint8_t src_len;
    uint8_t src[16];     /* source address (4 or 16 bytes) */
    opbuf b;
    uint8_t head[HEAD_BYTES];
    uint8_t hs[PC_HS_TRANSCRIPT_BYTES];  /* the client's nonce, ours, the address it reached */
    uint8_t proof[PC_HS_MAC_BYTES];      /* the client's proof */
    uint8_t session[PC_HS_KEY_BYTES];    /* the key of this connection's request tags */
    uint8_t rhead[HEAD_BYTES + 4];
    struct iovec riov[2];
    char why[200];
    uint64_t tr_wake, tr_first;   /* traced (trace.h): the wake-up and the recv that began its request */
} conn;

typedef struct worker {
    pc_srv_table *t;
    int ep, lfd, stopfd;
    long max_conns;          /* greeted connections, over all workers */
    long max_greet;          /* this worker's connections waiting for their hello */
    long max_greet_src;      /* of them from one source address */
    long long mem_cap;       /* reply memory, over all workers */
    int sndbuf;              /* SO_SNDBUF asked per connection (0: the kernel's autotuning) */
    double idle_s, request_s, hello_s, tick_s;
    conn *conns;
    conn *ghead, *gtail;
    long ngreet, nwaiting;
    int listening;
    double resume_at, backoff;
    uint64_t tr_wake;        /* traced (trace.h): when the last epoll_wait returned */
    double poll_s;           /* poll for the next request this long after serving (0: sleep at once) */
    int slot;                /* this worker's place in the table's hand-off (-1: none) */
    int handoff_r;           /* the read end of its hand-off pipe */
} worker;

/* An accepted connection handed to another worker: its socket and whom it came from. */
typedef struct handoff {
    int fd;
    struct sockaddr_storage ss;
} handoff;

static char LISTEN_TAG, STOP_TAG, HANDOFF_TAG;

/* ------------------------------------------------------------- reply memory */

/* Take k bytes of the table's reply memory; 0 when that would pass the cap (some is taken). */
static int mem_take(worker *w, long long k) {
    atomic_llong *r = &w->t->reserved;
    long long cur = atomic_load(r);
    do {
        if (cur > 0 && cur + k > w->mem_cap) return 0;
    } while (!atomic_compare_exchange_weak(r, &cur, cur + k));
    return 1;
}

static void mem_give(worker *w, long long k) {
    if (k) atomic_fetch_sub(&w->t->reserved, k);
}

/* The mapped op buffers of c are gone (reply out or connection closed). */
static void give_buffers(worker *w, conn *c) {
    opbuf_free(&c->b);
    mem_give(w, c->hbuf);
    c->hbuf = 0;
}

/* Bytes the kernel still holds to send on c (sent and not acknowledged, or not sent). */
static long long send_queue(conn *c) {
    int q = 0;
    return ioctl(c->fd, SIOCOUTQ, &q) == 0 ? q : 0;
}

/* ------------------------------------------------------------- connections */

static void greet_unlink(worker *w, conn *c) {
    if (!c->greeting) return;
    if (c->gprev) c->gprev->gnext = c->gnext;
    else w->ghead = c->gnext;
    if (c->gnext) c->gnext->gprev = c->gprev;
    else w->gtail = c->gprev;
    c->gprev = c->gnext = NULL;
    c->greeting = 0;
    w->ngreet--;
    atomic_fetch_sub(&w->t->ngreeting, 1);
}

static int set_events(worker *w, conn *c, uint32_t ev) {
    if (c->events == ev) return 0;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &e) < 0) return -1;
    c->events = ev;
    return 0;
}

static void conn_close(worker *w, conn *c) {
    epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->close_after) {
        /* A refused connection: read what its client sent meanwhile, so the close is a FIN
         * after the refusal rather than a reset that could overtake it. */
        uint8_t sink[4096];
        for (int i = 0; i < 16 && recv(c->fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
    }
    close(c->fd);
    if (c->prev) c->prev->next = c->next;
    else w->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    greet_unlink(w, c);
    if (c->waiting) w->nwaiting--;
    if (c->serving) atomic_fetch_sub(&w->t->nserving, 1);
    give_buffers(w, c);
    if (c->hq) mem_give(w, c->qcap);
    explicit_bzero(c->session, sizeof c->session);   /* not left in freed memory */
    free(c);
    atomic_fetch_sub(&w->t->nconns, 1);
    if (w->slot >= 0) atomic_fetch_sub(&w->t->worker_conns[w->slot], 1);
}

static int want(worker *w, conn *c, int out) {
    return set_events(w, c, out ? EPOLLOUT : EPOLLIN);
}

static void start_refusal(conn *c, const char *why, int fatal) {
    if (why != c->why) snprintf(c->why, sizeof c->why, "%s", why);
    uint32_t len = (uint32_t)strlen(c->why);
    fill_head(c->rhead, 1, 0, c->req_id);
    memcpy(c->rhead + HEAD_BYTES, &len, 4);
    c->riov[0] = (struct iovec){c->rhead, HEAD_BYTES + 4};
    c->riov[1] = (struct iovec){c->why, len};
    c->cur = c->riov;
    c->left = 2;
    c->close_after = fatal;
    c->refusal = 1;
    c->state = C_SEND;
}

/* Close c, counted under stat, without a word: a connection that did not greet in time or
 * was pushed out by newer ones may be a client's pooled channel that sat idle (without a
 * key it says nothing until its first request), which redials when it finds it closed. */
static void drop(worker *w, conn *c, int stat) {
    count(w->t, stat, 1);
    if (stat != PC_ST_CONN_IDLE) {
        /* A reset, not a FIN: a slow reader's FIN would wait behind its unread reply, which the
         * kernel would keep (an orphan) for as long as the reader takes; and a flood of
         * connections closed for not greeting leaves no TIME_WAIT behind. */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    conn_close(w, c);
}

/* The greeting is over: c counts against max_connections from now on, or is refused. */
static int admit(worker *w, conn *c, double now) {
    greet_unlink(w, c);
    c->stage = STAGE_SERVING;
    if (atomic_fetch_add(&w->t->nserving, 1) >= w->max_conns) {
        atomic_fetch_sub(&w->t->nserving, 1);
        count(w->t, PC_ST_CONN_OVER_LIMIT, 1);
        c->req_id = 0;
        snprintf(c->why, sizeof c->why, "the data server is at its connection limit (%ld connections); "
                 "retry later, or raise the producer's PEERCACHE_TCP_MAX_CONNECTIONS", w->max_conns);
        start_refusal(c, c->why, 1);
        c->deadline = now + w->request_s;
        return -1;
    }
    c->serving = 1;
    return 0;
}

/* Refuse the greeting of c (counted under stat) with why, then close it. Always -1. */
static int refuse_greeting(worker *w, conn *c, int stat, const char *why) {
    count(w->t, stat, 1);
    atomic_fetch_add(&w->t->refused, 1);
    c->req_id = 0;
    start_refusal(c, why, 1);
    return -1;
}

/* A hello's header is in c->head: read its nonce next, or refuse it. Always -1. */
static int greet_hello(worker *w, conn *c) {
    uint32_t version, len;
    memcpy(&version, c->head + 4, 4);
    memcpy(&len, c->head + 8, 4);
    if (version == 1)
        return refuse_greeting(w, c, PC_ST_CONN_BAD_TOKEN, "hello version 1 (a token sent in the clear) is "
                               "refused: this data server speaks hello version 2, a challenge-response that "
                               "sends no secret; run the producer's PeerCache version on the consumer");
    if (version != PC_HS_VERSION || len != PC_HS_NONCE_BYTES) {
        snprintf(c->why, sizeof c->why, "unsupported hello (version %u, %u bytes); this data server "
                 "speaks version %d (a %d-byte nonce)", version, len, PC_HS_VERSION, PC_HS_NONCE_BYTES);
        return refuse_greeting(w, c, PC_ST_CONN_BAD_TOKEN, c->why);
    }
    if (!w->t->has_key)
        return refuse_greeting(w, c, PC_ST_CONN_BAD_TOKEN, "this data server holds no cluster secret, so it "
                               "cannot prove one: start the producer with the consumer's secret "
                               "(--auth-key-file or $PEERCACHE_AUTH_KEY), or the consumer without one");
    c->state = C_NONCE;
    c->got = 0;
    return -1;
}

/* The first message of a connection (its header is in c->head). 0: it is a
 * request and this table admits connections without a handshake; -1:
 * handled here (a hello whose nonce is read next, or a refusal). */
static int greet(worker *w, conn *c, double now) {
    if (memcmp(c->head, "PCHI", 4) == 0) return greet_hello(w, c);
    if (w->t->has_key && memcmp(c->head, "PCRQ", 4) == 0)
        return refuse_greeting(w, c, PC_ST_CONN_NO_TOKEN, "this data server needs the cluster secret: give "
                               "the consumer the producer's secret (--auth-key-file or $PEERCACHE_AUTH_KEY)");
    if (admit(w, c, now) < 0) return -1;
    c->deadline = now + w->request_s;   /* the rest of this first request */
    return 0;
}

/* The hello's nonce is in: send the challenge (our nonce, the address the connection reached and
 * our proof over them), then read the client's proof. -1: close c at once. The address binds the
 * handshake to this socket: a client that dialed another one (a relay) sees it differ. */
static int on_nonce(worker *w, conn *c) {
    uint8_t *sn = c->hs + PC_HS_NONCE_BYTES, *addr = sn + PC_HS_NONCE_BYTES;
    uint8_t msg[PC_HS_CHALLENGE_BYTES];
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(c->fd, (struct sockaddr *)&ss, &sl) < 0 || pc_hs_addr((struct sockaddr *)&ss, addr) < 0)
        return -1;
    if (pc_hs_nonce(sn) < 0) {
        count(w->t, PC_ST_NOMEM, 1);
        return -1;
    }
    pc_hs_head(msg, PC_HS_CHALLENGE_BODY);
    memcpy(msg + PC_HS_HEAD_BYTES, sn, PC_HS_NONCE_BYTES + PC_HS_ADDR_BYTES);
    pc_hs_mac(msg + PC_HS_HEAD_BYTES + PC_HS_NONCE_BYTES + PC_HS_ADDR_BYTES, w->t->key, PC_HS_SERVER, c->hs);
    /* The first bytes this connection sends: its empty send buffer takes them whole, so the
     * challenge needs no queue of its own. */
    if (send(c->fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof msg) return -1;
    c->state = C_PROOF;
    c->got = 0;
    return 0;
}

/* The client's proof is in: admit the connection, its requests tagged under the session key, or
 * refuse it. */
static void on_proof(worker *w, conn *c, double now) {
    uint8_t want[PC_HS_MAC_BYTES];
    pc_hs_mac(want, w->t->key, PC_HS_CLIENT, c->hs);
    if (!pc_hs_equal(want, c->proof, PC_HS_MAC_BYTES)) {
        refuse_greeting(w, c, PC_ST_CONN_BAD_TOKEN, "wrong handshake proof: the consumer's cluster secret is "
                        "not the producer's (check --auth-key-file / $PEERCACHE_AUTH_KEY on both)");
        return;
    }
    pc_hs_mac(c->session, w->t->key, PC_HS_SESSION, c->hs);
    c->tagged = 1;
    c->seq = 0;
    if (admit(w, c, now) < 0) return;
    c->state = C_HEAD;
    c->got = 0;
    c->deadline = now + w->idle_s;
}

/* Whether the tag after c's ops is the one its session gives this request (which counts it). */
static int tag_ok(conn *c) {
    uint8_t want[PC_HS_MAC_BYTES];
    size_t opbytes = (size_t)c->n * WIRE_OP_BYTES;
    pc_hs_request_tag(want, c->session, c->seq++, c->head, c->b.wire, opbytes);
    return pc_hs_equal(want, c->b.wire + opbytes, PC_HS_MAC_BYTES);
}

/* Body complete: check the ops and set up the reply. */
static void start_reply(worker *w, conn *c, double now) {
    pc_srv_table *t = w->t;
    uint64_t total, bad[3] = {0, 0, 0};
    size_t k = check_ops(t, c->b.wire, c->n, c->b.status, c->b.iov + 2, &total, bad);
    count_bad(t, bad);
    c->deadline = now + w->request_s;
    c->progress = 0;
    if (total > MAX_REPLY_BYTES) {
        too_large(t, total, c->why, sizeof c->why);
        atomic_fetch_add(&t->refused, 1);
        start_refusal(c, c->why, 0);
        return;
    }
    pc_trace(PC_TR_SRV_BODY, c->req_id);
    fill_head(c->rhead, 0, c->n, c->req_id);
    c->b.iov[0] = (struct iovec){c->rhead, HEAD_BYTES};
    c->b.iov[1] = (struct iovec){c->b.status, (size_t)c->n * 4};
    c->cur = c->b.iov;
    c->left = k + 2;
    c->close_after = 0;
    c->refusal = 0;
    c->state = C_SEND;
}

/* A request is in whole (header, ops and, on a tagged connection, its tag): its tag first, then
 * what it asks for. */
static void on_body(worker *w, conn *c, double now) {
    if (c->tagged && !tag_ok(c)) {
        count(w->t, PC_ST_REQ_BAD_TAG, 1);
        atomic_fetch_add(&w->t->refused, 1);
        start_refusal(c, "a request's tag does not match its connection's handshake: the bytes were "
                         "changed or added on the way; reconnect", 1);
        return;
    }
    if (c->n == 0) {
        count(w->t, PC_ST_REQ_NO_OPS, 1);
        atomic_fetch_add(&w->t->refused, 1);
        start_refusal(c, "request carries no ops", 0);
        return;
    }
    start_reply(w, c, now);
}

/* The op slots of c's request body: its ops, and its tag (one op's size) on a tagged connection. */
static size_t body_ops(const conn *c) {
    return (size_t)c->n + (c->tagged ? 1 : 0);
}

/* The request's header is checked: take its reply memory and read its body, or wait for
 * memory (0: go on, 1: waiting, -1: refused). */
static int begin_body(worker *w, conn *c, double now) {
    size_t m = body_ops(c);
    long long buf = m > SMALL_OPS && m > c->b.cap ? (long long)opbuf_bytes(m) : 0;
    long long need = buf + (c->hq ? 0 : c->qcap);
    if (need && !mem_take(w, need)) {
        if (!c->waiting) {
            c->waiting = 1;
            w->nwaiting++;
            count(w->t, PC_ST_REPLY_WAITS, 1);
            if (set_events(w, c, 0) < 0) return -1;
        }
        return 1;
    }
    if (c->waiting) {
        c->waiting = 0;
        w->nwaiting--;
    }
    if (opbuf_reserve(&c->b, m ? m : 1) < 0) {
        mem_give(w, need);
        count(w->t, PC_ST_NOMEM, 1);
        start_refusal(c, "the data server is out of memory", 1);
        return -1;
    }
    c->hq = 1;
    c->hbuf += buf;
    c->state = C_BODY;
    c->got = 0;
    if (m == 0) on_body(w, c, now);   /* no ops and no tag: nothing to read */
    return 0;
}

/* Header complete. */
static void on_head(worker *w, conn *c, double now) {
    if (c->stage == STAGE_GREETING && greet(w, c, now) < 0) {
        c->tr_first = 0;   /* a hello (or a refusal), not a request */
        return;
    }
    if (check_head(w->t, c->head, &c->n, &c->req_id, c->why, sizeof c->why) < 0) {
        atomic_fetch_add(&w->t->refused, 1);
        start_refusal(c, c->why, 1);
        return;
    }
    if (c->tr_first) {
        pc_trace_put(PC_TR_SRV_WAKE, c->req_id, c->tr_wake);
        pc_trace_put(PC_TR_SRV_HEAD, c->req_id, c->tr_first);
        c->tr_first = 0;
    }
    begin_body(w, c, now);
}

/* Send what the socket takes: 1 reply out, 0 wait for room, -1 close. */
static int conn_send(worker *w, conn *c, double now) {
    while (c->left) {
        struct msghdr mh = {.msg_iov = c->cur, .msg_iovlen = c->left > SEND_IOV ? SEND_IOV : c->left};
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        c->progress += (size_t)k;
        if (c->progress >= PROGRESS_BYTES) {   /* enough progress: a new deadline */
            c->deadline = now + w->request_s;
            c->progress = 0;
        }
        size_t sent = (size_t)k;
        while (c->left && sent >= c->cur->iov_len) {
            sent -= c->cur->iov_len;
            c->cur++;
            c->left--;
        }
        if (c->left) {
            c->cur->iov_base = (uint8_t *)c->cur->iov_base + sent;
            c->cur->iov_len -= sent;
        }
    }
    return 1;
}

/* Where the next bytes of c go, and how many its current message still needs (never 0). */
static uint8_t *recv_target(conn *c, size_t *need) {
    switch (c->state) {
    case C_HEAD:
        *need = HEAD_BYTES - c->got;
        return c->head + c->got;
    case C_NONCE:
        *need = PC_HS_NONCE_BYTES - c->got;
        return c->hs + c->got;
    case C_PROOF:
        *need = PC_HS_MAC_BYTES - c->got;
        return c->proof + c->got;
    default:   /* C_BODY */
        *need = body_ops(c) * WIRE_OP_BYTES - c->got;
        return c->b.wire + c->got;
    }
}

/* The message c was reading is in whole: act on it. -1: close c. */
static int on_received(worker *w, conn *c, double now) {
    switch (c->state) {
    case C_HEAD:
        on_head(w, c, now);
        return 0;
    case C_NONCE:
        return on_nonce(w, c);
    case C_PROOF:
        on_proof(w, c, now);
        return 0;
    default:
        on_body(w, c, now);
        return 0;
    }
}

/* The peer closed c, or its socket failed: -1 (close it). A client that leaves after our
 * challenge found our proof wrong, its secret not ours: counted with the failed handshakes. */
static int peer_left(worker *w, conn *c) {
    if (c->state == C_PROOF) {
        count(w->t, PC_ST_CONN_BAD_TOKEN, 1);
        atomic_fetch_add(&w->t->refused, 1);
    }
    return -1;
}

/* Work on c until it would block: 0 keep it, -1 close it. */
static int conn_run(worker *w, conn *c, double now) {
    for (int done = 0; done < REQ_BURST && !c->waiting;) {
        if (c->state == C_SEND) {
            int r = conn_send(w, c, now);
            if (r < 0) return -1;
            if (r == 0) return want(w, c, 1);
            if (c->close_after) return -1;
            if (!c->refusal) pc_trace(PC_TR_SRV_SENT, c->req_id);
            if (c->b.mapped) give_buffers(w, c);
            if (!c->refusal) count(w->t, PC_ST_SERVED, 1);
            c->state = C_HEAD;
            c->got = 0;
            c->deadline = now + w->idle_s;
            c->drain_by = now + w->request_s;
            done++;
            if (want(w, c, 0) < 0) return -1;
            continue;
        }
        size_t need;
        uint8_t *dst = recv_target(c, &need);
        ssize_t k = recv(c->fd, dst, need, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (k <= 0) return peer_left(w, c);
        /* a request began (a greeting keeps its hello deadline) */
        if (c->state == C_HEAD && c->got == 0) {
            if (c->stage == STAGE_SERVING) c->deadline = now + w->request_s;
            if (atomic_load_explicit(&pc_trace_on, memory_order_relaxed)) {   /* a request's, or a hello's */
                c->tr_wake = w->tr_wake;
                c->tr_first = pc_trace_now();
            }
        }
        c->got += (size_t)k;
        if ((size_t)k < need) continue;
        if (on_received(w, c, now) < 0) return -1;
    }
    return 0;  /* more may be queued: level-triggered epoll calls again */
}

static int same_source(const conn *a, const conn *b) {
    return a->src_len == b->src_len && memcmp(a->src, b->src, a->src_len) == 0;
}

/* Which waiting connection to close now that c passed a cap: the oldest (of c's address when
 * same), preferring one that has sent nothing over one mid-handshake, where a client of ours
 * waits for a round trip. NULL: none but c. */
static conn *greet_victim(worker *w, conn *c, int same) {
    conn *oldest = NULL;
    for (conn *g = w->ghead; g; g = g->gnext) {
        if (g == c || (same && !same_source(g, c))) continue;
        if (g->state == C_HEAD && g->got == 0) return g;
        if (!oldest) oldest = g;
    }
    return oldest;
}

/* c, just accepted, still waits for its handshake: keep this worker's waiting connections within
 * their caps by closing one of c's address, or one of all (greet_victim). */
static void greet_caps(worker *w, conn *c) {
    long same = 0;
    for (conn *g = w->ghead; g; g = g->gnext) same += same_source(g, c);
    conn *v = NULL;
    if (same > w->max_greet_src) v = greet_victim(w, c, 1);
    else if (w->ngreet > w->max_greet) v = greet_victim(w, c, 0);
    if (v) drop(w, v, PC_ST_CONN_EVICTED);
}

static void set_source(conn *c, const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) {
        c->src_len = 4;
        memcpy(c->src, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        c->src_len = 16;
        memcpy(c->src, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    }
}

/* A connection this worker serves from now on (accepted here, or handed to it). */
static void adopt(worker *w, int fd, const struct sockaddr_storage *ss, double now) {
    pc_srv_table *t = w->t;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (w->sndbuf > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &w->sndbuf, sizeof w->sndbuf);
    int qcap = 0;
    socklen_t ql = sizeof qcap;
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &qcap, &ql);
    conn *c = calloc(1, sizeof *c);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (!c || epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        count(t, PC_ST_NOMEM, 1);
        free(c);
        close(fd);
        if (w->slot >= 0) atomic_fetch_sub(&t->worker_conns[w->slot], 1);
        return;
    }
    atomic_fetch_add(&t->nconns, 1);
    c->fd = fd;
    c->events = EPOLLIN;
    c->qcap = qcap;
    c->state = C_HEAD;
    c->stage = STAGE_GREETING;
    c->deadline = now + w->hello_s;
    set_source(c, ss);
    c->next = w->conns;
    if (w->conns) w->conns->prev = c;
    w->conns = c;
    c->greeting = 1;
    c->gprev = w->gtail;
    if (w->gtail) w->gtail->gnext = c;
    else w->ghead = c;
    w->gtail = c;
    w->ngreet++;
    atomic_fetch_add(&t->ngreeting, 1);
    count(t, PC_ST_ACCEPTED, 1);
    /* A client sends its hello as it connects: it is usually here already. */
    if (conn_run(w, c, now) < 0) {
        conn_close(w, c);
        return;
    }
    if (c->greeting) greet_caps(w, c);
}

/* The worker with the fewest connections takes a new one (this one on a tie): EPOLLEXCLUSIVE wakes
 * one worker per connection, often the same one, and two busy connections on one worker are served
 * by one thread while another idles (make bench's directory lookups: 1.1-1.3 M keys/s in such runs,
 * 2.3 M when they were apart). 1 when handed to another worker (it counts it), else 0 (counted here:
 * adopt it). */
static int hand_off(worker *w, int fd, const struct sockaddr_storage *ss) {
    pc_srv_table *t = w->t;
    if (w->slot < 0) return 0;
    pthread_mutex_lock(&t->mu);
    int best = w->slot;
    long least = atomic_load(&t->worker_conns[w->slot]);
    for (int i = 0; i < PC_SRV_MAX_WORKERS; i++) {
        if (t->handoff_w[i] < 0 || i == w->slot) continue;
        long k = atomic_load(&t->worker_conns[i]);
        if (k < least) { least = k; best = i; }
    }
    int sent = 0;
    if (best != w->slot) {
        handoff h = {.fd = fd};
        memcpy(&h.ss, ss, sizeof h.ss);
        /* one message, less than PIPE_BUF: written whole or not at all */
        if (write(t->handoff_w[best], &h, sizeof h) == (ssize_t)sizeof h) {
            atomic_fetch_add(&t->worker_conns[best], 1);
            sent = 1;
        }
    }
    if (!sent) atomic_fetch_add(&t->worker_conns[w->slot], 1);
    pthread_mutex_unlock(&t->mu);
    return sent;
}

/* Connections other workers handed to this one. */
static void take_handoffs(worker *w, double now) {
    handoff h;
    while (read(w->handoff_r, &h, sizeof h) == (ssize_t)sizeof h) adopt(w, h.fd, &h.ss, now);
}

/* Joins the table's hand-off (a pipe of its own, its slot); without a free slot or a pipe, the worker
 * serves what it accepts itself. */
static void handoff_join(worker *w) {
    int p[2];
    w->slot = -1;
    w->handoff_r = -1;
    if (pipe2(p, O_NONBLOCK | O_CLOEXEC) < 0) return;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &HANDOFF_TAG};
    if (epoll_ctl(w->ep, EPOLL_CTL_ADD, p[0], &ev) < 0) { close(p[0]); close(p[1]); return; }
    pthread_mutex_lock(&w->t->mu);
    for (int i = 0; i < PC_SRV_MAX_WORKERS; i++) {
        if (w->t->handoff_w[i] < 0) {
            w->t->handoff_w[i] = p[1];
            atomic_store(&w->t->worker_conns[i], 0);
            w->slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&w->t->mu);
    if (w->slot < 0) { close(p[0]); close(p[1]); return; }
    w->handoff_r = p[0];
}

/* Leaves the hand-off: nobody writes to its pipe any more; what was handed meanwhile is closed. */
static void handoff_leave(worker *w) {
    if (w->slot < 0) return;
    pthread_mutex_lock(&w->t->mu);
    int wfd = w->t->handoff_w[w->slot];
    w->t->handoff_w[w->slot] = -1;
    pthread_mutex_unlock(&w->t->mu);
    close(wfd);
    handoff h;
    while (read(w->handoff_r, &h, sizeof h) == (ssize_t)sizeof h) close(h.fd);
    close(w->handoff_r);
    w->slot = -1;
}

static void do_accept(worker *w, double now) {
    pc_srv_table *t = w->t;
    for (int i = 0; i < ACCEPT_BURST; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(w->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) return;
            /* errors of the one connection that was pending: try the next one */
            if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == EPERM || e == ENETDOWN ||
                e == ENOPROTOOPT || e == EHOSTDOWN || e == ENONET || e == EHOSTUNREACH ||
                e == EOPNOTSUPP || e == ENETUNREACH)
                continue;
            /* out of fds or memory: stop polling the listener for a while, never for good */
            count(t, PC_ST_ACCEPT_ERRORS, 1);
            atomic_store(&t->accept_errno, e);
            atomic_store(&t->accept_failing, 1);
            epoll_ctl(w->ep, EPOLL_CTL_DEL, w->lfd, NULL);
            w->listening = 0;
            w->resume_at = now + w->backoff;
            w->backoff = w->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : w->backoff * 2;
            return;
        }
        w->backoff = BACKOFF_MIN;
        if (atomic_load_explicit(&t->accept_failing, memory_order_relaxed))
            atomic_store(&t->accept_failing, 0);
        if (hand_off(w, fd, &ss)) continue;
        adopt(w, fd, &ss, now);
    }
}

static int listen_on(worker *w) {
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = &LISTEN_TAG};
    if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->lfd, &ev) < 0) return -1;
    w->listening = 1;
    return 0;
}

/* A request that waited for reply memory past its deadline: refused, then closed. */
static void refuse_busy(worker *w, conn *c, double now) {
    c->waiting = 0;
    w->nwaiting--;
    count(w->t, PC_ST_REQ_BUSY, 1);
    atomic_fetch_add(&w->t->refused, 1);
    snprintf(c->why, sizeof c->why, "the data server's reply memory (%lld MiB) stayed taken for %.0f s; "
             "retry later, or raise the producer's PEERCACHE_TCP_REPLY_MEMORY", w->mem_cap >> 20,
             w->request_s);
    start_refusal(c, c->why, 1);
    c->deadline = now + w->request_s;
    if (conn_run(w, c, now) < 0) conn_close(w, c);
}

/* Each tick: deadlines, drained send queues, requests waiting for reply memory. */
static void tick(worker *w, double now) {
    for (conn *c = w->conns, *next; c; c = next) {
        next = c->next;
        int idle = c->state == C_HEAD && c->got == 0;
        if (c->hq && idle && !c->waiting) {
            if (send_queue(c) == 0) {          /* its replies are read: the send buffer is free */
                mem_give(w, c->qcap);
                c->hq = 0;
            } else if (now >= c->drain_by) {   /* a reader that does not read its reply's tail */
                drop(w, c, PC_ST_CONN_SLOW);
                continue;
            }
        }
        if (now < c->deadline) continue;
        if (c->waiting) {
            refuse_busy(w, c, now);
            continue;
        }
        drop(w, c, c->stage == STAGE_GREETING ? PC_ST_CONN_HELLO_TIMEOUT : idle ? PC_ST_CONN_IDLE : PC_ST_CONN_SLOW);
    }
    for (conn *c = w->conns, *next; c && w->nwaiting; c = next) {
        next = c->next;
        if (!c->waiting || begin_body(w, c, now) == 1) continue;
        /* its body (or the refusal begin_body started) goes on as events come */
        if (set_events(w, c, EPOLLIN) < 0 || conn_run(w, c, now) < 0) conn_close(w, c);
    }
}

int pc_srv_serve(pc_srv_table *t, const pc_srv_config *cfg) {
    worker w = {.t = t, .lfd = cfg->listen_fd, .stopfd = cfg->stop_fd, .max_conns = cfg->max_conns,
                .idle_s = cfg->idle_s, .request_s = cfg->request_s, .hello_s = cfg->hello_s,
                .max_greet = cfg->max_greet, .max_greet_src = cfg->max_greet_src, .mem_cap = cfg->mem_cap,
                .sndbuf = cfg->sndbuf, .poll_s = cfg->poll_s, .backoff = BACKOFF_MIN};
    double least = w.idle_s < w.request_s ? w.idle_s : w.request_s;
    least = least < w.hello_s ? least : w.hello_s;
    w.tick_s = least / 8 < 0.005 ? 0.005 : (least / 8 > 0.25 ? 0.25 : least / 8);
    w.ep = epoll_create1(EPOLL_CLOEXEC);
    if (w.ep < 0) return -1;
    struct epoll_event sev = {.events = EPOLLIN, .data.ptr = &STOP_TAG};
    if (epoll_ctl(w.ep, EPOLL_CTL_ADD, w.stopfd, &sev) < 0 || listen_on(&w) < 0) {
        int e = errno;
        close(w.ep);
        errno = e;
        return -1;
    }
    handoff_join(&w);
    struct epoll_event evs[EVENTS];
    double now = pc_mono_s(), next_tick = now + w.tick_s;
    double poll_until = 0;     /* polling for the next request until then (0: not polling) */
    int poll_missed = 0, poll_skip = 0;
    for (int stop = 0; !stop;) {
        int got;
        if (poll_until > 0) {
            got = epoll_wait(w.ep, evs, EVENTS, 0);
            if (got == 0) {
                now = pc_mono_s();
                if (now >= poll_until) {   /* ran out: sleep from the next turn on */
                    poll_until = 0;
                    count(w.t, PC_ST_POLL_MISSED, 1);
                    if (++poll_missed >= POLL_MISSES) {
                        poll_missed = 0;
                        poll_skip = POLL_SKIP;
                    }
                } else {
                    sched_yield();   /* a thread waiting for this CPU runs first: a busy machine gains nothing by polling */
                }
                if (now < next_tick) continue;
            } else {
                poll_missed = 0;
                count(w.t, PC_ST_POLL_CAUGHT, 1);
            }
        } else {
            double until = next_tick;
            if (!w.listening && w.resume_at < until) until = w.resume_at;
            int ms = (int)((until - now) * 1000) + 1;
            got = epoll_wait(w.ep, evs, EVENTS, ms < 1 ? 1 : ms);
        }
        int accept_now = 0, served = 0;
        if (atomic_load_explicit(&pc_trace_on, memory_order_relaxed)) w.tr_wake = pc_trace_now();
        now = pc_mono_s();
        for (int i = 0; i < got; i++) {
            void *p = evs[i].data.ptr;
            if (p == &STOP_TAG) { stop = 1; break; }
            /* Accepting may close older connections (the greeting caps): it waits until no
             * event of this batch still points at one. */
            if (p == &LISTEN_TAG) { accept_now = 1; continue; }
            if (p == &HANDOFF_TAG) { take_handoffs(&w, now); continue; }
            conn *c = p;
            served = 1;
            if ((evs[i].events & (EPOLLERR | EPOLLHUP)) && !(evs[i].events & EPOLLIN)) {
                conn_close(&w, c);
                continue;
            }
            if (conn_run(&w, c, now) < 0) conn_close(&w, c);
        }
        if (served && w.poll_s > 0) {   /* poll for this connection's next request, unless backing off */
            if (poll_skip > 0) poll_skip--;
            else poll_until = now + w.poll_s;
        }
        if (accept_now && !stop) do_accept(&w, now);
        if (!w.listening && now >= w.resume_at && listen_on(&w) < 0) w.resume_at = now + w.backoff;
        if (now >= next_tick) {
            tick(&w, now);
            next_tick = now + (w.nwaiting ? WAIT_TICK : w.tick_s);
        }
    }
    handoff_leave(&w);
    while (w.conns) conn_close(&w, w.conns);
    close(w.ep);
    return 0;
}

