/* Internal to checksum.c and checksum_avx2.c: the two builds of the payload checks. */
#ifndef PC_CHECKSUM_H
#define PC_CHECKSUM_H
#include <stddef.h>
#include <stdint.h>

/* Bytes copied, then checked, at a time by the fused copy + hash: small enough
 * to be hashed from L1, large enough that the per-chunk cost vanishes. The
 * source PC_PREFETCH_AHEAD bytes ahead is prefetched before each chunk, so its
 * loads are in flight while the chunk before is hashed. Measured in a C loop
 * on the project's test machine (128 KiB pages, page in L3): 2 KiB chunks
 * 6 KiB ahead copy and hash at 0.91 of a plain memcpy, 4 KiB chunks without
 * prefetch at 0.67. (In drive, where the unverified copy is glibc's, it is
 * less: see the README's bench figures.) */
#define PC_CHECK_CHUNK 2048u
#define PC_PREFETCH_AHEAD 6144u
/* The fused copy with ordinary stores fetches its destination lines this far ahead (pc_copy_pattern_avx2). */
#define PC_PREFETCH_DST_AHEAD 2048u

/* Prefetch the source of the chunk PC_PREFETCH_AHEAD bytes after offset o. */
#define PC_PREFETCH_NEXT(src, o, len)                                          \
    for (size_t q_ = (o) + PC_PREFETCH_AHEAD; q_ < (o) + PC_PREFETCH_AHEAD + PC_CHECK_CHUNK && q_ < (len); \
         q_ += 64)                                                             \
        __builtin_prefetch((src) + q_, 0, 3)

#include "pc.h"   /* PC_STREAM_ABOVE */

uint64_t pc_xxh3_avx2(const void *buf, size_t len, uint64_t seed);
uint64_t pc_copy_xxh3_avx2(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed);
/* Words [0, return) of buf compared with seed + k * golden, in whole 32-byte blocks:
 * how many words were compared, or SIZE_MAX at the first difference. */
size_t pc_pattern_avx2(const uint8_t *buf, size_t words, uint64_t seed, uint64_t golden);
/* The same compare fused with the copy of those words from src to dst, in one pass (whole
 * 64-byte lines; the source prefetched PC_PREFETCH_AHEAD ahead; stores streamed when stream_ok, dst
 * is on a cache line and the copy is PC_STREAM_ABOVE bytes or more): how many words were
 * copied (a multiple of 8), or SIZE_MAX when one differs (all of them copied then too). */
size_t pc_copy_pattern_avx2(uint8_t *dst, const uint8_t *src, size_t words, uint64_t seed, uint64_t golden,
                            int stream_ok);
/* The whole 64-byte lines of src copied to dst (on a cache line) with streamed stores, then an sfence:
 * how many bytes were copied. */
size_t pc_copy_stream_avx2(uint8_t *dst, const uint8_t *src, size_t len);

/* The body of a fused copy + XXH3 (one per build, so each uses its own code
 * path): PC_CHECK_CHUNK bytes copied, then hashed while they are in L1, with
 * XXH3's streaming state (the same digest as one-shot XXH3 of the whole). */
#define PC_COPY_XXH3_BODY                                                      \
    if (len <= PC_CHECK_CHUNK) {                                               \
        memcpy(dst, src, len);                                                 \
        return XXH3_64bits_withSeed(dst, len, seed);                           \
    }                                                                          \
    XXH3_state_t st;                                                           \
    XXH3_INITSTATE(&st);                                                       \
    XXH3_64bits_reset_withSeed(&st, seed);                                     \
    for (size_t o = 0; o < len; o += PC_CHECK_CHUNK) {                         \
        size_t k = len - o < PC_CHECK_CHUNK ? len - o : PC_CHECK_CHUNK;        \
        PC_PREFETCH_NEXT(src, o, len);                                         \
        memcpy(dst + o, src + o, k);                                           \
        XXH3_64bits_update(&st, dst + o, k);                                   \
    }                                                                          \
    return XXH3_64bits_digest(&st);

#endif
