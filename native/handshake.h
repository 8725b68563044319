/* The tcp data plane's handshake (hello version 2) and request tags, in C.
 *
 * The construction is peercache/auth.py's DataKey, byte for byte (its
 * docstring is the one description; tests/engine/transport/test_data_handshake.py
 * checks both sides on a known vector). The messages on the wire are
 * peercache/transport/tcp.py's:
 *   hello      client -> server  "PCHI" u32 2, u32 32, u64 0, cn (32)
 *   challenge  server -> client  "PCHI" u32 2, u32 82, u64 0, sn (32), the address the
 *                                connection reached (18), server proof (32)
 *   proof      client -> server  client proof (32)
 * then every request carries a tag (32) after its ops. The transcript all
 * three MACs are over is cn || sn || address. The server (server.c) and the
 * native client (tcp.c) use these functions and nothing else of the MAC, so
 * the two cannot drift apart.
 */
#ifndef PC_HANDSHAKE_H
#define PC_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define PC_HS_VERSION 2
#define PC_HS_KEY_BYTES 32
#define PC_HS_NONCE_BYTES 32
#define PC_HS_MAC_BYTES 32
#define PC_HS_HEAD_BYTES 20
/* An address as the handshake binds it: IPv6 (an IPv4 one mapped, ::ffff:a.b.c.d), then the
 * port, both in network byte order. */
#define PC_HS_ADDR_BYTES 18
#define PC_HS_TRANSCRIPT_BYTES (2 * PC_HS_NONCE_BYTES + PC_HS_ADDR_BYTES)
#define PC_HS_HELLO_BYTES (PC_HS_HEAD_BYTES + PC_HS_NONCE_BYTES)
#define PC_HS_CHALLENGE_BODY (PC_HS_NONCE_BYTES + PC_HS_ADDR_BYTES + PC_HS_MAC_BYTES)
#define PC_HS_CHALLENGE_BYTES (PC_HS_HEAD_BYTES + PC_HS_CHALLENGE_BODY)

/* What a MAC over the transcript is for: each has its own label, so no one is another. */
enum { PC_HS_SERVER = 0, PC_HS_CLIENT = 1, PC_HS_SESSION = 2 };

/* MAC(key, label(which) || transcript), the transcript being cn || sn || address: a proof
 * (server, client) or the session key. */
void pc_hs_mac(uint8_t out[PC_HS_MAC_BYTES], const uint8_t key[PC_HS_KEY_BYTES], int which,
               const uint8_t transcript[PC_HS_TRANSCRIPT_BYTES]);

/* The handshake's form of sa (AF_INET or AF_INET6) into out: 0, or -1 for another family. */
int pc_hs_addr(const struct sockaddr *sa, uint8_t out[PC_HS_ADDR_BYTES]);

/* addr as text ("a.b.c.d:port" or "[v6]:port"), for messages. */
void pc_hs_addr_text(const uint8_t addr[PC_HS_ADDR_BYTES], char *buf, size_t len);

/* The tag of a connection's request number seq (0 for its first): MAC(session, label || seq as
 * u64 little endian || the 20-byte request header || its ops). */
void pc_hs_request_tag(uint8_t out[PC_HS_MAC_BYTES], const uint8_t session[PC_HS_KEY_BYTES], uint64_t seq,
                       const uint8_t *head, const uint8_t *ops, size_t opbytes);

/* 1 when the n bytes of a and b are equal; its time does not depend on where they differ. */
int pc_hs_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* A fresh nonce from the kernel's random source: 0, or -1 with errno. */
int pc_hs_nonce(uint8_t out[PC_HS_NONCE_BYTES]);

/* A hello-version-2 header ("PCHI" u32 2, u32 body, u64 0) at out (PC_HS_HEAD_BYTES). */
void pc_hs_head(uint8_t *out, uint32_t body);

#endif
