/* The MAC of the data plane's handshake and request tags: keyed BLAKE2b-256
 * (libb2, already linked for the directory table's key hash). handshake.h
 * says what each function computes. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#if !__has_include(<blake2.h>)
#error "blake2.h not found: install libb2-dev (apt-get install libb2-dev), then rebuild"
#endif
#include <blake2.h>

#include "handshake.h"

/* peercache/auth.py's _DATA_LABELS and _REQUEST_LABEL. */
static const char *const LABELS[] = {"peercache data v2 server", "peercache data v2 client",
                                     "peercache data v2 session"};
static const char REQUEST_LABEL[] = "peercache data v2 request";

void pc_hs_mac(uint8_t out[PC_HS_MAC_BYTES], const uint8_t key[PC_HS_KEY_BYTES], int which,
               const uint8_t transcript[PC_HS_TRANSCRIPT_BYTES]) {
    blake2b_state s;
    const char *label = LABELS[which];
    blake2b_init_key(&s, PC_HS_MAC_BYTES, key, PC_HS_KEY_BYTES);
    blake2b_update(&s, (const uint8_t *)label, strlen(label));
    blake2b_update(&s, transcript, PC_HS_TRANSCRIPT_BYTES);
    blake2b_final(&s, out, PC_HS_MAC_BYTES);
}

int pc_hs_addr(const struct sockaddr *sa, uint8_t out[PC_HS_ADDR_BYTES]) {
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;   /* ::ffff:a.b.c.d, so one host reached over either family is one address */
        memcpy(out + 12, &a->sin_addr, 4);
        memcpy(out + 16, &a->sin_port, 2);
        return 0;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        memcpy(out, &a->sin6_addr, 16);
        memcpy(out + 16, &a->sin6_port, 2);
        return 0;
    }
    return -1;
}

void pc_hs_addr_text(const uint8_t addr[PC_HS_ADDR_BYTES], char *buf, size_t len) {
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    char ip[INET6_ADDRSTRLEN];
    unsigned port = (unsigned)addr[16] << 8 | addr[17];
    if (memcmp(addr, mapped, 12) == 0) {
        inet_ntop(AF_INET, addr + 12, ip, sizeof ip);
        snprintf(buf, len, "%s:%u", ip, port);
    } else {
        inet_ntop(AF_INET6, addr, ip, sizeof ip);
        snprintf(buf, len, "[%s]:%u", ip, port);
    }
}

void pc_hs_request_tag(uint8_t out[PC_HS_MAC_BYTES], const uint8_t session[PC_HS_KEY_BYTES], uint64_t seq,
                       const uint8_t *head, const uint8_t *ops, size_t opbytes) {
    blake2b_state s;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(seq >> (8 * i));   /* little endian on any host */
    blake2b_init_key(&s, PC_HS_MAC_BYTES, session, PC_HS_KEY_BYTES);
    blake2b_update(&s, (const uint8_t *)REQUEST_LABEL, sizeof REQUEST_LABEL - 1);
    blake2b_update(&s, le, sizeof le);
    blake2b_update(&s, head, PC_HS_HEAD_BYTES);
    if (opbytes) blake2b_update(&s, ops, opbytes);
    blake2b_final(&s, out, PC_HS_MAC_BYTES);
}

int pc_hs_equal(const uint8_t *a, const uint8_t *b, size_t n) {
    unsigned diff = 0;   /* no early exit: a forger learns nothing from how long a wrong MAC took */
    for (size_t i = 0; i < n; i++) diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

int pc_hs_nonce(uint8_t out[PC_HS_NONCE_BYTES]) {
    size_t got = 0;
    while (got < PC_HS_NONCE_BYTES) {
        ssize_t k = getrandom(out + got, PC_HS_NONCE_BYTES - got, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)k;
    }
    return 0;
}

void pc_hs_head(uint8_t *out, uint32_t body) {
    uint32_t version = PC_HS_VERSION;
    uint64_t zero = 0;
    memcpy(out, "PCHI", 4);
    memcpy(out + 4, &version, 4);
    memcpy(out + 8, &body, 4);
    memcpy(out + 12, &zero, 8);
}
