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

/* Prefetch the source of the chunk PC_PREFETCH_AHEAD bytes after offset o. */
#define PC_PREFETCH_NEXT(src, o, len)                                          \
    for (size_t q_ = (o) + PC_PREFETCH_AHEAD; q_ < (o) + PC_PREFETCH_AHEAD + PC_CHECK_CHUNK && q_ < (len); \
         q_ += 64)                                                             \
        __builtin_prefetch((src) + q_, 0, 3)

/* From this many bytes on, shm copies (pc_copy_stream) and the fused copy + pattern compare stream their
 * stores (non-temporal, from a cache line of the destination on): a store then needs no read of the
 * destination line first. That kept the fused pass at 0.82-0.88 of glibc's memcpy (rep movsb) on 128 KiB
 * pages in make bench's shm drive, and rep movsb itself below a streaming copy: in a C loop on the test
 * machine (random 128 KiB slots of a pool into a buffer 16 bytes off a line, as drive's), 1.11-1.14x
 * faster streamed for batches of 32 out of 32 MiB (15.7 -> 18.1 GB/s), 1.56-1.59x for batches of 128
 * out of 64 MiB (10.3 -> 16.0 GB/s). A destination that is read right after loses its copy in cache;
 * 128 KiB pages are past what L1 and L2 keep anyway, and a HiCache host page is read by the GPU's DMA. */
#define PC_STREAM_ABOVE (64u << 10)

uint64_t pc_xxh3_avx2(const void *buf, size_t len, uint64_t seed);
uint64_t pc_copy_xxh3_avx2(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed);
/* Words [0, return) of buf compared with seed + k * golden, in whole 32-byte blocks:
 * how many words were compared, or SIZE_MAX at the first difference. */
size_t pc_pattern_avx2(const uint8_t *buf, size_t words, uint64_t seed, uint64_t golden);
/* The same compare fused with the copy of those words from src to dst, in one pass (whole
 * 64-byte lines; the source prefetched PC_PREFETCH_AHEAD ahead; stores streamed when dst is on
 * a cache line and the copy is PC_STREAM_ABOVE bytes or more): how many words were
 * copied (a multiple of 8), or SIZE_MAX when one differs (all of them copied then too). */
size_t pc_copy_pattern_avx2(uint8_t *dst, const uint8_t *src, size_t words, uint64_t seed, uint64_t golden);
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
