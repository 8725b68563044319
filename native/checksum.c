/* Payload checks of read_slots: the slot checksum and the bench pattern.
 *
 * The checksum is XXH3-64 from xxHash (Debian's libxxhash-dev, used header
 * only: XXH_INLINE_ALL), seeded with the key hash and generation so a
 * payload is tied to the object it was written as. Chosen by measurement on
 * this project's test machine (AMD EPYC, 128 KiB pages hot in cache): XXH3
 * with AVX2 hashes at ~56 GB/s, CRC32C with the SSE4.2 instruction at
 * ~9.7 GB/s on one dependency chain (~14 GB/s over three interleaved ones,
 * which then need combining). Next to a copy at ~20 GB/s, a CRC32C pass
 * would cost about two thirds of the throughput, XXH3 about a quarter. The
 * AVX2 code is compiled in checksum_avx2.c and chosen at run time when the
 * CPU has it; otherwise the SSE2 code below (part of x86-64) runs.
 *
 * The copies of the shm path: pc_copy_stream copies a large page with its
 * stores streamed past the cache (PC_STREAM_ABOVE); pc_copy_pattern copies and compares in
 * one AVX2 pass (each line loaded once, stored, compared in registers, the
 * source prefetched ahead; a large page's stores streamed past the cache from
 * the destination's first cache line on, see PC_STREAM_ABOVE), so the
 * bench check costs little beyond the copy;
 * pc_copy_checksum copies PC_CHECK_CHUNK bytes at a time and hashes them
 * while they are in L1, the next chunk prefetched meanwhile (checksum.h):
 * one pass over memory instead of two, but the hash's own work remains.
 *
 * peercache.tags.checksum is the same function in Python (the xxhash
 * package); tests compare the two.
 */
#if !__has_include(<xxhash.h>)
#error "xxhash.h not found: install libxxhash-dev (apt-get install libxxhash-dev), then rebuild"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <string.h>

#include "checksum.h"
#include "pc.h"

#define GOLDEN 0x9E3779B97F4A7C15ull
#define MIX 0xBF58476D1CE4E5B9ull


uint64_t pc_checksum_seed(uint64_t key_hash, uint64_t generation) {
    return key_hash ^ (generation * GOLDEN);
}

static int have_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    static int cached = -1;
    if (cached < 0) cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    return cached;
#else
    return 0;
#endif
}

uint64_t pc_checksum(const void *buf, size_t len, uint64_t seed) {
    uint64_t h = have_avx2() ? pc_xxh3_avx2(buf, len, seed) : XXH3_64bits_withSeed(buf, len, seed);
    return h ? h : 1;
}

static uint64_t copy_xxh3_sse2(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed) {
    PC_COPY_XXH3_BODY
}

uint64_t pc_copy_checksum(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed) {
    uint64_t h = have_avx2() ? pc_copy_xxh3_avx2(dst, src, len, seed) : copy_xxh3_sse2(dst, src, len, seed);
    return h ? h : 1;
}

/* Word k of the bench content is seed + k * GOLDEN (peercache.tags.fill_pattern),
 * the last word cut to the length; first0 is the word index of buf[0]. The
 * whole 32-byte blocks go through the AVX2 loop when the CPU has it; the rest
 * (or all, without AVX2) is compared here in blocks of an XOR-OR accumulation
 * with an early exit between blocks. */
static int pattern_from(const uint8_t *buf, size_t len, uint64_t seed, uint64_t first0) {
    uint64_t s0 = seed + first0 * GOLDEN;
    size_t words = len / 8, i = 0;
    if (have_avx2()) {
        i = pc_pattern_avx2(buf, words, s0, GOLDEN);
        if (i == (size_t)-1) return 0;
    }
    while (i < words) {
        size_t end = words - i > 512 ? i + 512 : words;
        uint64_t acc = 0;
        for (size_t k = i; k < end; k++) {
            uint64_t w;
            memcpy(&w, buf + k * 8, 8);
            acc |= w ^ (s0 + (uint64_t)k * GOLDEN);
        }
        if (acc) return 0;
        i = end;
    }
    if (len % 8) {
        uint64_t want = s0 + (uint64_t)words * GOLDEN;
        if (memcmp(buf + words * 8, &want, len % 8) != 0) return 0;
    }
    return 1;
}

int pc_pattern_ok(const uint8_t *buf, size_t len, uint64_t key_hash, uint64_t generation) {
    return pattern_from(buf, len, key_hash ^ (generation * MIX), 0);
}

int pc_copy_stream(uint8_t *dst, const uint8_t *src, size_t len) {
    if (len < PC_STREAM_ABOVE || !have_avx2()) return 0;
    size_t head = (64 - ((uintptr_t)dst & 63)) & 63;     /* ordinary stores up to the line */
    memcpy(dst, src, head);
    size_t done = head + pc_copy_stream_avx2(dst + head, src + head, len - head);
    memcpy(dst + done, src + done, len - done);            /* and after the last whole line */
    return 1;
}

int pc_copy_pattern(uint8_t *dst, const uint8_t *src, size_t len, uint64_t key_hash, uint64_t generation,
                    int stream) {
    uint64_t seed = key_hash ^ (generation * MIX);
    int ok = 1;
    if (have_avx2()) {   /* one pass: each line loaded once, stored, and compared in registers */
        /* words up to a cache line of dst first, so the AVX2 pass may stream its stores to whole lines:
         * a line written partly by ordinary stores (this head, a neighbour page's tail) and partly
         * streamed is flushed from the cache and read again */
        size_t head = ((64 - ((uintptr_t)dst & 63)) & 63) / 8;
        if (((uintptr_t)dst & 7) || head * 8 > len) head = 0;
        if (head) {
            memcpy(dst, src, head * 8);
            ok = pattern_from(dst, head * 8, seed, 0);
        }
        size_t w = pc_copy_pattern_avx2(dst + head * 8, src + head * 8, len / 8 - head, seed + head * GOLDEN, GOLDEN,
                                        stream);
        if (w == (size_t)-1) {
            ok = 0;
            w = (len / 8 - head) & ~(size_t)7;
        }
        w += head;
        size_t start = w * 8;
        if (start < len) {
            memcpy(dst + start, src + start, len - start);
            if (ok) ok = pattern_from(dst + start, len - start, seed, w);
        }
        return ok;
    }
    for (size_t o = 0; o < len; o += PC_CHECK_CHUNK) {
        size_t k = len - o < PC_CHECK_CHUNK ? len - o : PC_CHECK_CHUNK;
        PC_PREFETCH_NEXT(src, o, len);
        memcpy(dst + o, src + o, k);
        if (ok) ok = pattern_from(dst + o, k, seed, o / 8);   /* the copy goes on: the bytes are the result */
    }
    return ok;
}
