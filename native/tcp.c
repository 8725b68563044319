/* tcp backend (client side): pipelined range requests, payload received
 * straight into the destination buffers.
 *
 * Wire format of peercache.transport.tcp (little endian):
 *   request: "PCRQ" u32 flags, u32 n, u64 req_id, n x (u32 region, u32 pad,
 *            u64 rkey, u64 offset, u64 length)
 *   reply:   "PCRS" u32 code, u32 n, u64 req_id, n x i32 status, then the
 *            payloads of the ok ops in order (code != 0: u32 len + reason).
 *   with a cluster secret, every connection opens with the handshake of
 *   handshake.h (hello with our nonce; the server's challenge, whose proof
 *   and address are checked before we prove anything; our proof), and each
 *   request carries a 32-byte tag after its ops, under the connection's
 *   session key. A server that does not prove the secret, or proves it from
 *   an address other than the one we reached (a relay), is told nothing:
 *   the error says which server, and what to check.
 * A batch is cut into requests of at most PC_TCP_REQ_OPS ops / PC_TCP_REQ_BYTES
 * bytes (pc.h) and up to PC_TCP_WINDOW of them are in flight on one channel,
 * so the server always has the next request queued while the client drains
 * the current reply.
 * Each batch holds one channel of its own; the channel list's lock is held
 * only to pop or push a socket, never during I/O.
 *
 * Waiting for a reply: the socket is first polled (non-blocking receives)
 * for up to poll_us microseconds, then the thread sleeps in a blocking
 * receive, as an RDMA consumer polls its completion queue before it would
 * arm an event. A sleep costs a wake-up on the reply (a scheduler round trip
 * and, in a VM, an IPI and a halt exit): on this project's 2-vCPU test VM a
 * 4 KiB read over a veth pair took p50 77-99 us sleeping and 43-46 us
 * polling, against 57-72 us for sockperf's round trip (which sleeps). The
 * polling is bounded and backs off: after POLL_MISSES waits in a row that
 * the poll did not cover, a channel list sleeps at once for POLL_SKIP waits,
 * then tries again; so a slow peer costs at most poll_us of CPU per
 * POLL_SKIP waits. poll_us 0 sleeps at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "handshake.h"
#include "pc.h"
#include "trace.h"

#define HEAD_BYTES 20
#define WIRE_OP_BYTES 32
#define MAX_IOV 1024
#define MAX_CHANNELS 256
#define TAG_BYTES PC_HS_MAC_BYTES
#define POLL_MISSES 8
#define POLL_SKIP 256

/* One data connection: its socket, and with a secret its session key and the number of the next
 * request (the tag's). */
typedef struct chan {
    int fd;
    uint64_t seq;
    uint8_t session[PC_HS_KEY_BYTES];
} chan;

typedef struct tcp_conn {
    char host[256];
    char port[16];
    int max_channels;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nopen;
    int nidle;
    chan idle[MAX_CHANNELS];
    atomic_uint_fast64_t next_req;
    int has_key;              /* the cluster secret's data key: every connection shakes hands */
    uint8_t key[PC_HS_KEY_BYTES];
    double poll_s;            /* 0: sleep at once */
    atomic_int poll_missed;   /* waits in a row the poll did not cover */
    atomic_int poll_skip;     /* waits left that sleep at once (backing off) */
    atomic_ullong polled;     /* replies the poll caught / waits that slept after it */
    atomic_ullong slept;
    atomic_ullong missed;     /* polls that ran out (each then slept) */
} tcp_conn;

static int send_all(int fd, const uint8_t *buf, size_t len);
static int recv_all(int fd, uint8_t *buf, size_t len);
static int pending_refusal(const tcp_conn *c, int fd, char *err, size_t errlen);
static int refusal_reason(const tcp_conn *c, int fd, const uint8_t *head, char *err, size_t errlen);

static void set_timeouts(int fd, double t) {
    struct timeval tv = {.tv_sec = (time_t)t, .tv_usec = (suseconds_t)((t - (time_t)t) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* A connected socket to the peer (blocking, with the timeouts), or -1 with err set. */
static int dial_socket(tcp_conn *c, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(c->host, c->port, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", c->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, last = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) { last = errno; continue; }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (poll(&p, 1, (int)(c->timeout_s * 1000)) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            last = soerr ? soerr : ETIMEDOUT;
        } else {
            last = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "cannot connect to %s:%s: %s", c->host, c->port, strerror(last));
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_timeouts(fd, c->timeout_s);
    return fd;
}

/* The handshake failed because the server did not prove the secret (what: how): -1, err set. */
static int not_proved(const tcp_conn *c, const char *what, char *err, size_t errlen) {
    snprintf(err, errlen, "the data server at %s:%s did not prove it holds the cluster secret (%s), so "
             "nothing was sent to it; check that the producer runs with this consumer's secret "
             "(--auth-key-file / $PEERCACHE_AUTH_KEY) and that the directory's record of this node is a "
             "member's (whoever can write to the directory can point it elsewhere)", c->host, c->port, what);
    return -1;
}

/* The server's answer to our hello: the challenge (its nonce, its address, its proof) into body,
 * or -1 with err set (its refusal, or why it is not a challenge). */
static int recv_challenge(tcp_conn *c, int fd, uint8_t body[PC_HS_CHALLENGE_BODY], char *err, size_t errlen) {
    uint8_t head[HEAD_BYTES], want[HEAD_BYTES];
    if (recv_all(fd, head, HEAD_BYTES) < 0) {
        char what[96];
        snprintf(what, sizeof what, errno == EAGAIN || errno == EWOULDBLOCK ? "no answer to our hello "
                 "within %g s" : "it closed the connection after our hello", c->timeout_s);
        return not_proved(c, what, err, errlen);
    }
    if (memcmp(head, "PCRS", 4) == 0 && refusal_reason(c, fd, head, err, errlen)) return -1;
    pc_hs_head(want, PC_HS_CHALLENGE_BODY);
    if (memcmp(head, want, HEAD_BYTES) != 0) return not_proved(c, "its answer is not a challenge", err, errlen);
    if (recv_all(fd, body, PC_HS_CHALLENGE_BODY) < 0)
        return not_proved(c, "its challenge was cut short", err, errlen);
    return 0;
}

/* The server proved the secret from the address its side of the connection has (addr): 0 when
 * that is the address we reached, else -1 with err set (something forwards our connections). */
static int same_address(const tcp_conn *c, int fd, const uint8_t *addr, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    uint8_t ours[PC_HS_ADDR_BYTES] = {0};
    char at[64], reached[64];
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && pc_hs_addr((struct sockaddr *)&ss, ours) == 0 &&
        memcmp(ours, addr, PC_HS_ADDR_BYTES) == 0)
        return 0;
    pc_hs_addr_text(addr, at, sizeof at);
    pc_hs_addr_text(ours, reached, sizeof reached);
    snprintf(err, errlen, "the data server at %s:%s proved the cluster secret from %s, but we reached %s: "
             "something forwards our connections to it (NAT, a port mapping, a proxy, or a relay of whoever "
             "rewrote the directory's record of this node), so nothing was sent to it; the handshake binds "
             "the address: let consumers reach the producer directly", c->host, c->port, at, reached);
    return -1;
}

/* Hello, the server's challenge and our proof on the new connection ch->fd: 0, its session key
 * set, or -1 with err set. We prove nothing before the server proved itself, from the address
 * we reached. */
static int handshake(tcp_conn *c, chan *ch, char *err, size_t errlen) {
    uint8_t hello[PC_HS_HELLO_BYTES], body[PC_HS_CHALLENGE_BODY], want[PC_HS_MAC_BYTES], proof[PC_HS_MAC_BYTES];
    uint8_t t[PC_HS_TRANSCRIPT_BYTES];   /* cn || sn || the server's address */
    uint8_t *cn = hello + HEAD_BYTES;
    const uint8_t *addr = body + PC_HS_NONCE_BYTES, *theirs = addr + PC_HS_ADDR_BYTES;
    if (pc_hs_nonce(cn) < 0) {
        snprintf(err, errlen, "cannot draw a nonce for the data connection to %s:%s: %s", c->host, c->port,
                 strerror(errno));
        return -1;
    }
    pc_hs_head(hello, PC_HS_NONCE_BYTES);
    if (send_all(ch->fd, hello, sizeof hello) < 0) {
        int e = errno;
        if (!pending_refusal(c, ch->fd, err, errlen))
            snprintf(err, errlen, "sending the hello to %s:%s failed: %s", c->host, c->port, strerror(e));
        return -1;
    }
    if (recv_challenge(c, ch->fd, body, err, errlen) < 0) return -1;
    memcpy(t, cn, PC_HS_NONCE_BYTES);
    memcpy(t + PC_HS_NONCE_BYTES, body, PC_HS_NONCE_BYTES + PC_HS_ADDR_BYTES);
    pc_hs_mac(want, c->key, PC_HS_SERVER, t);
    if (!pc_hs_equal(want, theirs, PC_HS_MAC_BYTES))
        return not_proved(c, "its proof is wrong", err, errlen);
    if (same_address(c, ch->fd, addr, err, errlen) < 0) return -1;
    pc_hs_mac(proof, c->key, PC_HS_CLIENT, t);
    if (send_all(ch->fd, proof, sizeof proof) < 0) {
        snprintf(err, errlen, "sending the handshake proof to %s:%s failed: %s", c->host, c->port, strerror(errno));
        return -1;
    }
    pc_hs_mac(ch->session, c->key, PC_HS_SESSION, t);
    ch->seq = 0;
    return 0;
}

/* A new channel: connected, and with a secret past the handshake. 0, or -1 with err set. */
static int dial(tcp_conn *c, chan *ch, char *err, size_t errlen) {
    ch->fd = dial_socket(c, err, errlen);
    if (ch->fd < 0) return -1;
    ch->seq = 0;
    if (c->has_key && handshake(c, ch, err, errlen) < 0) {
        close(ch->fd);
        ch->fd = -1;
        return -1;
    }
    return 0;
}

/* A channel into ch: a pooled one (*pooled = 1; the server may have closed it
 * while it sat idle) or a new one. 0, or -1 (dial failed) / -2 (none free) with err set. */
static int acquire(tcp_conn *c, chan *ch, int *pooled, char *err, size_t errlen) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    double wait = c->timeout_s * 4;
    dl.tv_sec += (time_t)wait;
    dl.tv_nsec += (long)((wait - (time_t)wait) * 1e9);
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->nidle > 0) {
            *ch = c->idle[--c->nidle];
            pthread_mutex_unlock(&c->mu);
            *pooled = 1;
            return 0;
        }
        if (c->nopen < c->max_channels) {
            c->nopen++;
            *pooled = 0;
            pthread_mutex_unlock(&c->mu);
            if (dial(c, ch, err, errlen) < 0) {
                pthread_mutex_lock(&c->mu);
                c->nopen--;
                pthread_cond_signal(&c->cv);
                pthread_mutex_unlock(&c->mu);
                return -1;
            }
            return 0;
        }
        if (pthread_cond_timedwait(&c->cv, &c->mu, &dl) == ETIMEDOUT) {
            pthread_mutex_unlock(&c->mu);
            snprintf(err, errlen, "no free data channel to %s:%s within %.0f s; raise --max-channels",
                     c->host, c->port, wait);
            return -2;
        }
    }
}

static void release(tcp_conn *c, const chan *ch, int healthy) {
    pthread_mutex_lock(&c->mu);
    if (healthy && c->nidle < MAX_CHANNELS) {
        c->idle[c->nidle++] = *ch;
    } else {
        close(ch->fd);
        c->nopen--;
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *tcp_connect(const void *params, char *err, size_t errlen) {
    const pc_tcp_params *p = params;
    if (strlen(p->host) >= sizeof(((tcp_conn *)0)->host)) {
        snprintf(err, errlen, "host name too long: %s", p->host);
        return NULL;
    }
    tcp_conn *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return NULL; }
    snprintf(c->host, sizeof c->host, "%s", p->host);
    snprintf(c->port, sizeof c->port, "%d", p->port);
    c->max_channels = p->max_channels < 1 ? 1 : (p->max_channels > MAX_CHANNELS ? MAX_CHANNELS : p->max_channels);
    c->timeout_s = p->timeout_s;   /* positive: checked by the caller (module.c) */
    c->poll_s = p->poll_us > 0 ? p->poll_us * 1e-6 : 0;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    atomic_init(&c->next_req, 1);
    if (p->key) {
        memcpy(c->key, p->key, PC_HS_KEY_BYTES);
        c->has_key = 1;
    }
    /* One channel now, so an unreachable peer, or one that does not prove the secret, is
     * reported at connect time. */
    chan ch;
    if (dial(c, &ch, err, errlen) < 0) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return NULL;
    }
    c->nopen = 1;
    c->idle[c->nidle++] = ch;
    return c;
}

static void tcp_close(void *p) {
    tcp_conn *c = p;
    if (!c) return;
    for (int i = 0; i < c->nidle; i++) close(c->idle[i].fd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    explicit_bzero(c, sizeof *c);   /* the data key and the session keys: not left in freed memory */
    free(c);
}

static int send_all(int fd, const uint8_t *buf, size_t len) {
    while (len) {
        ssize_t k = send(fd, buf, len, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += k;
        len -= (size_t)k;
    }
    return 0;
}

/* A send failed because the server closed the connection: the refusal it sent before closing
 * (the connection's, req_id 0: at its connection limit, a wrong proof...), if one waits in the
 * socket. 1 with err set to it, else 0. */
static int pending_refusal(const tcp_conn *c, int fd, char *err, size_t errlen) {
    uint8_t head[HEAD_BYTES];
    ssize_t k = recv(fd, head, sizeof head, MSG_DONTWAIT);
    if (k != (ssize_t)sizeof head || memcmp(head, "PCRS", 4) != 0) return 0;
    return refusal_reason(c, fd, head, err, errlen);
}

/* head (a reply header already read) is a refusal of the connection: 1 with err set to its
 * reason (the length and text after head, read now), else 0. */
static int refusal_reason(const tcp_conn *c, int fd, const uint8_t *head, char *err, size_t errlen) {
    char reason[256];
    uint32_t code, ln;
    memcpy(&code, head + 4, 4);
    if (code == 0 || recv(fd, &ln, 4, MSG_WAITALL) != 4) return 0;
    if (ln > sizeof reason - 1) ln = sizeof reason - 1;
    ssize_t k = recv(fd, reason, ln, MSG_WAITALL);
    reason[k > 0 ? k : 0] = 0;
    snprintf(err, errlen, "%s:%s refused the connection: %s", c->host, c->port, reason);
    return 1;
}

static int recv_all(int fd, uint8_t *buf, size_t len) {
    while (len) {
        ssize_t k = recv(fd, buf, len, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) { errno = ECONNRESET; return -1; }
        buf += k;
        len -= (size_t)k;
    }
    return 0;
}

/* The first bytes of a reply by polling (see the top of this file): the
 * count received, or -1 with errno EAGAIN when the poll ran out (the caller
 * then sleeps), or another errno / 0 for a closed connection. */
static ssize_t poll_reply(tcp_conn *c, int fd, uint8_t *head) {
    if (atomic_load_explicit(&c->poll_skip, memory_order_relaxed) > 0) {
        atomic_fetch_sub_explicit(&c->poll_skip, 1, memory_order_relaxed);
        errno = EAGAIN;
        return -1;
    }
    double end = pc_mono_s() + c->poll_s;
    for (;;) {
        ssize_t k = recv(fd, head, HEAD_BYTES, MSG_DONTWAIT);
        if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            atomic_store_explicit(&c->poll_missed, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->polled, 1, memory_order_relaxed);
            return k;
        }
        if (pc_mono_s() >= end) break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    atomic_fetch_add_explicit(&c->missed, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&c->poll_missed, 1, memory_order_relaxed) + 1 >= POLL_MISSES) {
        atomic_store_explicit(&c->poll_missed, 0, memory_order_relaxed);
        atomic_store_explicit(&c->poll_skip, POLL_SKIP, memory_order_relaxed);
    }
    errno = EAGAIN;
    return -1;
}

/* The header of a reply: -4 (errno ECONNRESET) when the peer closed before
 * sending any of it, as a server does with a connection idle too long. */
static int recv_reply_head(tcp_conn *c, int fd, uint8_t *head) {
    ssize_t k = -1;
    errno = EAGAIN;
    if (c->poll_s > 0) k = poll_reply(c, fd, head);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        atomic_fetch_add_explicit(&c->slept, 1, memory_order_relaxed);
        do k = recv(fd, head, HEAD_BYTES, 0); while (k < 0 && errno == EINTR);
    }
    if (k == 0 || (k < 0 && (errno == ECONNRESET || errno == EPIPE))) {
        errno = ECONNRESET;
        return -4;
    }
    if (k < 0) return -1;
    return recv_all(fd, head + k, HEAD_BYTES - (size_t)k);
}

/* Receive into the iovec list, advancing over partial reads. */
static int recv_iov(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t k = recvmsg(fd, &mh, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) { errno = ECONNRESET; return -1; }
        size_t got = (size_t)k;
        while (cnt > 0 && got >= iov->iov_len) {
            got -= iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + got;
            iov->iov_len -= got;
        }
    }
    return 0;
}

typedef struct chunk { size_t start, end; uint64_t req_id; } chunk;

static size_t chunk_end(const pc_op *ops, size_t start, size_t n) {
    size_t end = start;
    uint64_t bytes = 0;
    while (end < n && end - start < PC_TCP_REQ_OPS
           && (end == start || bytes + ops[end].length <= PC_TCP_REQ_BYTES)) {
        bytes += ops[end].length;
        end++;
    }
    return end;
}

/* The request of ops [ch->start, ch->end) on channel k, tagged when the connection shook hands. */
static int send_chunk(const tcp_conn *c, chan *k, const pc_op *ops, const chunk *ch) {
    uint8_t buf[HEAD_BYTES + PC_TCP_REQ_OPS * WIRE_OP_BYTES + TAG_BYTES];
    uint32_t flags = 0, m = (uint32_t)(ch->end - ch->start);
    memcpy(buf, "PCRQ", 4);
    memcpy(buf + 4, &flags, 4);
    memcpy(buf + 8, &m, 4);
    memcpy(buf + 12, &ch->req_id, 8);
    uint8_t *w = buf + HEAD_BYTES;
    for (size_t i = ch->start; i < ch->end; i++, w += WIRE_OP_BYTES) {
        uint32_t pad = 0;
        memcpy(w, &ops[i].region, 4);
        memcpy(w + 4, &pad, 4);
        memcpy(w + 8, &ops[i].rkey, 8);
        memcpy(w + 16, &ops[i].remote_offset, 8);
        memcpy(w + 24, &ops[i].length, 8);
    }
    if (c->has_key) {
        pc_hs_request_tag(w, k->session, k->seq++, buf, buf + HEAD_BYTES, (size_t)(w - buf) - HEAD_BYTES);
        w += TAG_BYTES;
    }
    pc_trace(PC_TR_SEND_BEGIN, ch->req_id);
    int rc = send_all(k->fd, buf, (size_t)(w - buf));
    pc_trace(PC_TR_SEND_END, ch->req_id);
    return rc;
}

/* 0 ok; -1 socket failure (errno); -2 protocol error (err set); -3 refused (err set);
 * -4 the peer closed the connection before replying (errno). */
static int recv_chunk(tcp_conn *c, int fd, const pc_op *ops, const chunk *ch, const pc_local *locals,
                      int32_t *status, char *err, size_t errlen, const pc_notify *notify) {
    uint8_t head[HEAD_BYTES];
    int hr = recv_reply_head(c, fd, head);
    if (hr < 0) return hr;
    pc_trace(PC_TR_REPLY_HEAD, ch->req_id);
    uint32_t code, m;
    uint64_t rid;
    memcpy(&code, head + 4, 4);
    memcpy(&m, head + 8, 4);
    memcpy(&rid, head + 12, 8);
    /* req_id 0 with a refusal: the server refused the connection itself (its hello) */
    if (memcmp(head, "PCRS", 4) != 0 || (rid != ch->req_id && !(code != 0 && rid == 0))) {
        snprintf(err, errlen, "unexpected reply from %s:%s (request %llu got %.4s/%llu); not a "
                 "PeerCache data server?", c->host, c->port, (unsigned long long)ch->req_id,
                 (const char *)head, (unsigned long long)rid);
        return -2;
    }
    if (code != 0) {
        uint32_t ln = 0;
        char reason[256] = "";
        if (recv_all(fd, (uint8_t *)&ln, 4) == 0) {
            uint32_t keep = ln < sizeof reason - 1 ? ln : sizeof reason - 1;
            if (recv_all(fd, (uint8_t *)reason, keep) == 0) reason[keep] = 0;
        }
        snprintf(err, errlen, "%s:%s refused a read request: %s", c->host, c->port, reason);
        return -3;
    }
    size_t cnt = ch->end - ch->start;
    if (m != cnt) {
        snprintf(err, errlen, "reply from %s:%s carries %u statuses for %zu ops", c->host, c->port, m, cnt);
        return -2;
    }
    if (recv_all(fd, (uint8_t *)(status + ch->start), cnt * 4) < 0) return -1;
    struct iovec iov[MAX_IOV];
    int k = 0;
    for (size_t i = ch->start; i < ch->end; i++) {
        if (status[i] != PC_OK) continue;
        iov[k].iov_base = locals[ops[i].local_region].base + ops[i].local_offset;
        iov[k].iov_len = ops[i].length;
        if (++k == MAX_IOV) {
            if (recv_iov(fd, iov, k) < 0) return -1;
            k = 0;
        }
    }
    if (k && recv_iov(fd, iov, k) < 0) return -1;
    pc_trace(PC_TR_REPLY_DONE, ch->req_id);
    if (notify)   /* this reply's payloads (at most PC_TCP_REQ_BYTES) are still in cache */
        for (size_t i = ch->start; i < ch->end; i++)
            if (status[i] == PC_OK) notify->done(notify->ctx, i);
    return 0;
}

static int tcp_read_batch(void *p, const pc_op *ops, size_t n, const pc_local *locals, size_t nlocals,
                          int32_t *status, char *err, size_t errlen, const pc_notify *notify) {
    tcp_conn *c = p;
    (void)nlocals;
    int pooled = 0;
    chan k;
    int got = acquire(c, &k, &pooled, err, errlen);
    if (got < 0) {
        for (size_t i = 0; i < n; i++) status[i] = got == -1 ? PC_PEER_GONE : PC_CONNECTION;
        return -1;
    }
    chunk win[PC_TCP_WINDOW];
    size_t head, tail, next, done;
    int rc;
again:
    head = tail = next = done = 0;  /* chunks [tail, head) are in flight, ring-indexed */
    rc = 0;
    while (done < n) {
        while (next < n && head - tail < PC_TCP_WINDOW) {
            chunk *ch = &win[head % PC_TCP_WINDOW];
            ch->start = next;
            ch->end = chunk_end(ops, next, n);
            ch->req_id = atomic_fetch_add(&c->next_req, 1);
            if (send_chunk(c, &k, ops, ch) < 0) {
                if (pooled && tail == 0 && (errno == EPIPE || errno == ECONNRESET)) goto redial;
                int e = errno;
                if (pending_refusal(c, k.fd, err, errlen)) {   /* why the server closed it */
                    rc = -3;
                    goto fail;
                }
                snprintf(err, errlen, "sending a read request to %s:%s failed: %s", c->host, c->port,
                         e == EAGAIN ? "timed out" : strerror(e));
                rc = -1;
                goto fail;
            }
            next = ch->end;
            head++;
        }
        chunk *ch = &win[tail % PC_TCP_WINDOW];
        int r = recv_chunk(c, k.fd, ops, ch, locals, status, err, errlen, notify);
        if (r == -4 && pooled && tail == 0) goto redial;
        if (r == -1 || r == -4) {
            snprintf(err, errlen, "reading a reply from %s:%s failed: %s", c->host, c->port,
                     errno == EAGAIN ? "timed out" : strerror(errno));
        }
        if (r < 0) {
            rc = r;
            goto fail;
        }
        done = ch->end;
        tail++;
    }
    release(c, &k, 1);
    return 0;
redial:
    /* A pooled channel the server closed while it sat idle (nothing of this
     * batch was received): the same batch once more, on a new connection in
     * the same slot. */
    close(k.fd);
    pooled = 0;
    if (dial(c, &k, err, errlen) < 0) {
        pthread_mutex_lock(&c->mu);
        c->nopen--;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        for (size_t i = 0; i < n; i++) status[i] = PC_PEER_GONE;
        return -1;
    }
    goto again;
fail:
    /* Framing is lost for this channel: every op without a confirmed payload fails. */
    for (size_t i = done; i < n; i++) status[i] = rc == -3 ? PC_REFUSED : PC_CONNECTION;
    release(c, &k, 0);
    return -1;
}

static void tcp_wait_stats(void *p, uint64_t *polled, uint64_t *slept, uint64_t *missed) {
    tcp_conn *c = p;
    *polled = atomic_load(&c->polled);
    *slept = atomic_load(&c->slept);
    *missed = atomic_load(&c->missed);
}

const pc_backend pc_tcp_backend = {
    .name = "tcp",
    .connect = tcp_connect,
    .read_batch = tcp_read_batch,
    .alive = NULL,
    .close = tcp_close,
    .wait_stats = tcp_wait_stats,
};
