/* The AVX2 code of the payload checks (checksum.c chooses it at run time when
 * the CPU has AVX2): XXH3-64 with its AVX2 code path, one-shot and fused with
 * a copy, and the bench-pattern compare. Only this file is compiled for AVX2
 * (the target pragma), so the module still loads on any x86-64. */
#if defined(__x86_64__) || defined(__i386__)
#pragma GCC target("avx2")
#define XXH_VECTOR XXH_AVX2
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "checksum.h"


uint64_t pc_xxh3_avx2(const void *buf, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(buf, len, seed);
}

uint64_t pc_copy_xxh3_avx2(uint8_t *dst, const uint8_t *src, size_t len, uint64_t seed) {
    PC_COPY_XXH3_BODY
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

size_t pc_copy_pattern_avx2(uint8_t *dst, const uint8_t *src, size_t words, uint64_t seed, uint64_t golden,
                            int stream_ok) {
    __m256i want = _mm256_set_epi64x((long long)(seed + 3 * golden), (long long)(seed + 2 * golden),
                                     (long long)(seed + golden), (long long)seed);
    const __m256i step = _mm256_set1_epi64x((long long)(4 * golden));
    size_t whole = words & ~(size_t)7, k = 0;
    __m256i acc = _mm256_setzero_si256();
    /* non-temporal stores (no read of the destination's lines first) for a large aligned copy */
    int stream = stream_ok && ((uintptr_t)dst & 63) == 0 && words * 8 >= PC_STREAM_ABOVE;
    for (; k < whole; k += 8) {      /* 64 bytes a step: one cache line */
        __builtin_prefetch(src + k * 8 + PC_PREFETCH_AHEAD, 0, 3);
        /* stores through the cache: each destination line is read before it is written; fetched ahead,
         * those reads overlap (a C loop of 128 KiB pages: 0.94 -> 1.00-1.02 of glibc's rep movsb) */
        if (!stream) __builtin_prefetch(dst + k * 8 + PC_PREFETCH_DST_AHEAD, 0, 3);
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + k * 8));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + k * 8 + 32));
        if (stream) {
            _mm256_stream_si256((__m256i *)(dst + k * 8), a);
            _mm256_stream_si256((__m256i *)(dst + k * 8 + 32), b);
        } else {
            _mm256_storeu_si256((__m256i *)(dst + k * 8), a);
            _mm256_storeu_si256((__m256i *)(dst + k * 8 + 32), b);
        }
        acc = _mm256_or_si256(acc, _mm256_xor_si256(a, want));
        want = _mm256_add_epi64(want, step);
        acc = _mm256_or_si256(acc, _mm256_xor_si256(b, want));
        want = _mm256_add_epi64(want, step);
    }
    if (stream) _mm_sfence();
    return _mm256_testz_si256(acc, acc) ? whole : (size_t)-1;
}

size_t pc_copy_stream_avx2(uint8_t *dst, const uint8_t *src, size_t len) {
    size_t whole = len & ~(size_t)63;
    for (size_t k = 0; k < whole; k += 64) {      /* one cache line a step, stored past the cache */
        __builtin_prefetch(src + k + PC_PREFETCH_AHEAD, 0, 3);
        __m256i a = _mm256_loadu_si256((const __m256i *)(src + k));
        __m256i b = _mm256_loadu_si256((const __m256i *)(src + k + 32));
        _mm256_stream_si256((__m256i *)(dst + k), a);
        _mm256_stream_si256((__m256i *)(dst + k + 32), b);
    }
    _mm_sfence();
    return whole;
}

size_t pc_pattern_avx2(const uint8_t *buf, size_t words, uint64_t seed, uint64_t golden) {
    __m256i want = _mm256_set_epi64x((long long)(seed + 3 * golden), (long long)(seed + 2 * golden),
                                     (long long)(seed + golden), (long long)seed);
    const __m256i step = _mm256_set1_epi64x((long long)(4 * golden));
    size_t k = 0, whole = words & ~(size_t)3;
    while (k < whole) {
        size_t end = whole - k > 64 ? k + 64 : whole;
        __m256i acc = _mm256_setzero_si256();
        for (; k < end; k += 4) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(buf + k * 8));
            acc = _mm256_or_si256(acc, _mm256_xor_si256(w, want));
            want = _mm256_add_epi64(want, step);
        }
        if (!_mm256_testz_si256(acc, acc)) return (size_t)-1;
    }
    return whole;
}
#endif
