// zobench-z v3 (docs/zrng.md): the counter-based generator shared with the Python runners.
// Bit-identical to workloads/zrng.py: integer mixing, then one float32 multiply. Keys, initial
// weights and data order use v1's 64-bit mix; the perturbation's z (drawn three times per
// parameter per step) a 32-bit hash whose every operation is a 32-bit SIMD lane operation.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSSE3__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "gauss_table.hpp"

namespace zrng {

constexpr const char* VERSION = "zobench-z v3";   // the result's env.zrng (workloads/zrng.py VERSION)

constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;
constexpr uint64_t STREAM_ZO = 1, STREAM_INIT = 2, STREAM_DATA = 3, STREAM_ZO_QUERY = 5, STREAM_ZO_UNITS = 6,
                   STREAM_ZO_MASK = 7;
constexpr uint64_t MAX_QUERIES = 1024;   // a q-query step's counters: step * MAX_QUERIES + query
constexpr uint32_t WEYL = 0x9E3779B9u, LB1 = 0x7FEB352Du, LB2 = 0x846CA68Bu;
constexpr int32_t Z_OFFSET = 2 * 255;
// float32(sqrt(3 / (256^2 - 1))), bits 0x3BDDB446
inline float z_scale() {
    const uint32_t bits = 0x3BDDB446u;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline uint64_t stream_key(uint64_t seed, uint64_t stream, uint64_t counter) {
    return mix64(mix64(mix64(seed) ^ stream) ^ counter);
}

inline uint64_t bits(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * GOLDEN); }

// the keys of a step's directions, one per query: the first MeZO's (workloads/zrng.py zo_keys)
inline std::vector<uint64_t> zo_keys(uint64_t seed, uint64_t step, int queries) {
    std::vector<uint64_t> keys{stream_key(seed, STREAM_ZO, step)};
    for (int i = 1; i < queries; ++i) keys.push_back(stream_key(seed, STREAM_ZO_QUERY, step * MAX_QUERIES + uint64_t(i)));
    return keys;
}

// k of [0, n), ascending: those with the smallest 64-bit draws, ties to the lower index
// (workloads/zrng.py choose)
inline std::vector<int> choose(uint64_t key, int n, int k) {
    std::vector<int> idx(size_t(n), 0);
    for (int i = 0; i < n; ++i) idx[size_t(i)] = i;
    std::stable_sort(idx.begin(), idx.end(), [key](int a, int b) { return bits(key, uint64_t(a)) < bits(key, uint64_t(b)); });
    idx.resize(size_t(k));
    std::sort(idx.begin(), idx.end());
    return idx;
}

// u[i] in [0, 1): the top 24 bits, exact
inline float uniform(uint64_t key, uint64_t i) { return float(bits(key, i) >> 40) * (1.0f / 16777216.0f); }

// ---- v2: the perturbation's 32 bits per index ----
// T: uint32_t, or a vector of them (zu32 below: the same operations lane by lane)
template <class T>
inline T lowbias32(T x) {
    x = (x ^ (x >> 16)) * LB1;
    x = (x ^ (x >> 15)) * LB2;
    return x ^ (x >> 16);
}

// the key of the indices block * 2^32 ... block * 2^32 + 2^32 - 1
inline uint32_t block_key(uint64_t key, uint64_t block) { return uint32_t(mix64(key ^ block)); }

// z from its 32 bits: the four bytes summed (pairs first: two ands, not four), centred, times
// z_scale() (Irwin-Hall n=4, unit variance)
inline float normal(uint32_t x, float scale) {
    const uint32_t pairs = (x & 0x00FF00FFu) + ((x >> 8) & 0x00FF00FFu);
    return float(int32_t((pairs & 0xFFFFu) + (pairs >> 16)) - Z_OFFSET) * scale;
}

// Gaussian z from its 32 bits (zo_distribution = "gaussian"): the table's entry at the top 16
// (gauss_table.hpp, which the build writes from workloads/gauss_table.py; table: its floats, a
// net's zo_gauss buffer, copied from GAUSS_BITS once)
inline float gauss(uint32_t x, const float* table) { return table[x >> GAUSS_SHIFT]; }

// How many places each_bits32 (FP32's passes other than add_normal's) draws at an iteration: their
// hash chains are independent, so an in-order core (the A53) overlaps them instead of stalling on
// one chain's latencies (FP32: 31 -> 11 cycles per z in its pipeline model, docs/cpus.md); an
// out-of-order core gains nothing and loses nothing.
constexpr uint32_t STREAMS = 4;
// How many vectors add_normal and fill_bits32 hash at an iteration, each operation over all of
// them before the next (hash_stages; the A53 model: add_normal 4.75 cycles per z, 6.9 with four
// vectors, 6.3 with eight, where GCC spills registers)
constexpr uint32_t STAGED = 6;

// g(p, m, k) over [start, start + n) in pieces of m indices from p, k the hash's input at p
// (bits32(key, p) = lowbias32(k), and at p + j lowbias32(k + j * WEYL)). A piece is at most 2^31
// long, so that a SIMD loop's index is 32-bit (a 64-bit one costs AVX2 a third more), and never
// crosses a 2^32 block (each has its key).
template <class G>
inline void each_piece(uint64_t key, size_t start, size_t n, G g) {
    constexpr size_t PIECE = size_t(1) << 31;
    const size_t end = start + n;
    for (size_t p = start; p < end;) {
        const size_t block_end = ((p >> 32) + 1) << 32;
        const uint32_t m = uint32_t(std::min({end - p, PIECE, block_end - p}));
        g(p, m, block_key(key, p >> 32) + uint32_t(p) * WEYL);
        p += m;
    }
}

// f(i, bits32(key, i)) for i in [start, start + n), on the caller's thread, vectorized: a team
// runs it on each thread's own segments of the parameters (the nets' each_z). Each iteration
// draws at STREAMS places, a quarter of the piece apart.
template <class F>
__attribute__((noinline)) void each_bits32(uint64_t key, size_t start, size_t n, F f) {
    each_piece(key, start, n, [&f](size_t p, uint32_t m, uint32_t k) {
        const uint32_t q = m / STREAMS, apart = q * WEYL;
        // x: the hash's input at j, stepped by an add (as k + j * WEYL, GCC kept a multiply-add)
        uint32_t x = k;
#pragma omp simd linear(x : WEYL)
        for (uint32_t j = 0; j < q; ++j) {
            for (uint32_t s = 0; s < STREAMS; ++s)    // the index in size_t, j added last: contiguous
                f(p + size_t(s) * q + j, lowbias32(x + s * apart));
            x += WEYL;
        }
        for (uint32_t j = STREAMS * q; j < m; ++j) f(p + j, lowbias32(k + j * WEYL));
    });
}

// ---- Irwin-Hall z a vector at a time: perturb's pass ----
// ZW lanes, the widest integer vector the build has (32-bit lanes: not fp32_kernels' VF, which
// counts floats, 8 already with AVX, whose 256-bit integer operations came with AVX2); GCC's
// vector types, whose operators are the ISA's lane operations (vpmulld, NEON's mul), and one
// intrinsic or two where the ISA sums a lane's four bytes in them (KERNELS, env.kernels.zrng):
//  - avx512-vnni: vpdpbusd of the bytes by 1, onto -Z_OFFSET;
//  - avx512-maddubs, avx2-maddubs, ssse3-maddubs: vpmaddubsw by 1 (byte pairs into 16 bits),
//    vpmaddwd by 1 (those pairs into 32);
//  - neon-dotprod: udot by 1, onto -Z_OFFSET (wrapping: the sum is read as signed);
//  - neon-uaddlp: uaddlp twice (byte pairs, then their pairs; uadalp onto -Z_OFFSET instead of
//    the second and the subtraction needs the constant copied each time: as many instructions,
//    and 3 % more of the A53 model's cycles);
//  - generic: normal()'s shifts and masks, on the vector types (SSE2, AVX-512F without BW).
#if defined(__AVX512F__)
constexpr int ZW = 16;
#elif defined(__AVX2__)
constexpr int ZW = 8;
#else
constexpr int ZW = 4;
#endif
typedef uint32_t zu32 __attribute__((vector_size(ZW * 4)));
typedef int32_t zi32 __attribute__((vector_size(ZW * 4)));
typedef float zf32 __attribute__((vector_size(ZW * 4)));
typedef float zf32_at __attribute__((vector_size(ZW * 4), aligned(alignof(float))));   // at any float's address

// the sum of each lane's four bytes, less Z_OFFSET: normal()'s integer, exact on every path
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
constexpr const char* KERNELS = "avx512-vnni";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)_mm512_dpbusd_epi32(_mm512_set1_epi32(-Z_OFFSET), (__m512i)x, _mm512_set1_epi8(1));
}
#elif defined(__AVX512F__) && defined(__AVX512BW__)
constexpr const char* KERNELS = "avx512-maddubs";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)_mm512_madd_epi16(_mm512_maddubs_epi16((__m512i)x, _mm512_set1_epi8(1)), _mm512_set1_epi16(1)) - Z_OFFSET;
}
#elif defined(__AVX2__) && !defined(__AVX512F__)
constexpr const char* KERNELS = "avx2-maddubs";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)_mm256_madd_epi16(_mm256_maddubs_epi16((__m256i)x, _mm256_set1_epi8(1)), _mm256_set1_epi16(1)) - Z_OFFSET;
}
#elif defined(__SSSE3__) && !defined(__AVX2__)
constexpr const char* KERNELS = "ssse3-maddubs";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)_mm_madd_epi16(_mm_maddubs_epi16((__m128i)x, _mm_set1_epi8(1)), _mm_set1_epi16(1)) - Z_OFFSET;
}
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
constexpr const char* KERNELS = "neon-dotprod";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)vdotq_u32(vdupq_n_u32(uint32_t(-Z_OFFSET)), vreinterpretq_u8_u32(x), vdupq_n_u8(1));
}
#elif defined(__aarch64__)
constexpr const char* KERNELS = "neon-uaddlp";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    return (zi32)vpaddlq_u16(vpaddlq_u8(vreinterpretq_u8_u32(x))) - Z_OFFSET;
}
#else
constexpr const char* KERNELS = "generic";
__attribute__((always_inline)) inline zi32 centred_byte_sum(zu32 x) {
    const zu32 pairs = (x & 0x00FF00FFu) + ((x >> 8) & 0x00FF00FFu);
    return (zi32)((pairs & 0xFFFFu) + (pairs >> 16)) - Z_OFFSET;
}
#endif

// the hash's inputs of ZW consecutive indices from the one whose input is k
inline zu32 weyl_lanes(uint32_t k) {
    zu32 x;
    for (int l = 0; l < ZW; ++l) x[l] = k + uint32_t(l) * WEYL;
    return x;
}

// h = lowbias32 of the S vectors of inputs from x on (x, x + ZW WEYL, ...), each of its
// operations over all S before the next (add_normal says why)
template <size_t S>
__attribute__((always_inline)) inline void hash_stages(zu32 (&h)[S], zu32 x) {
    zu32 u[S];
    for (size_t s = 0; s < S; ++s) h[s] = x + uint32_t(s * ZW) * WEYL;
    for (size_t s = 0; s < S; ++s) u[s] = h[s] >> 16;
    for (size_t s = 0; s < S; ++s) h[s] ^= u[s];
    for (size_t s = 0; s < S; ++s) h[s] *= LB1;
    for (size_t s = 0; s < S; ++s) u[s] = h[s] >> 15;
    for (size_t s = 0; s < S; ++s) h[s] ^= u[s];
    for (size_t s = 0; s < S; ++s) h[s] *= LB2;
    for (size_t s = 0; s < S; ++s) u[s] = h[s] >> 16;
    for (size_t s = 0; s < S; ++s) h[s] ^= u[s];
}

// h[s] = centred_byte_sum(h[s]) as int32 lanes, each of its operations over every s before the next
template <size_t S>
__attribute__((always_inline)) inline void centred_byte_sums(zu32 (&h)[S]) {
#if defined(__aarch64__) && !defined(__ARM_FEATURE_DOTPROD)
    for (size_t s = 0; s < S; ++s) h[s] = (zu32)vpaddlq_u8(vreinterpretq_u8_u32(h[s]));
    for (size_t s = 0; s < S; ++s) h[s] = vpaddlq_u16((uint16x8_t)h[s]);
    for (size_t s = 0; s < S; ++s) h[s] -= Z_OFFSET;
#else
    for (size_t s = 0; s < S; ++s) h[s] = (zu32)centred_byte_sum(h[s]);
#endif
}

// target[i] += alpha * normal(bits32(key, i), scale) for i in [start, start + n): an FP32 ZO
// step's three passes where z is Irwin-Hall and unmasked (the nets' add_z). As each_bits32's
// lambda, GCC vectorized normal()'s byte sum into 7 of the loop's 21 operations a vector; here it
// is centred_byte_sum's one or two (Zen 4: the pass 1.7x as fast). The same z, and the same
// arithmetic as the lambda's `target[i] += alpha * z` (contracted to an FMA alike where the build
// has one): the same floats.
// STAGED vectors an iteration, written stage by stage: one operation over every vector,
// then the next, so that an in-order core (the A53) issues five independent operations between an
// operation and the one that needs its result. GCC would undo that order twice: at expansion, TER
// puts each single-use operation next to its use (a vector's whole chain together again), and the
// schedulers reorder by their own model; with both off in this function the stages stay as
// written. The A53 model (benchmarks/a53_estimate.py) gave the loop 8.9 cycles per z with four
// vectors GCC had scheduled, 4.75 with these (the bound its FP/SIMD unit sets: 3.5). Out of order
// cores reorder it themselves. Then a vector at a time, the rest one index at a time.
__attribute__((noinline, optimize("no-tree-ter", "no-schedule-insns", "no-schedule-insns2"))) inline void add_normal(float* target, uint64_t key, size_t start, size_t n, float alpha) {
    const float scale = z_scale();
    each_piece(key, start, n, [=](size_t p, uint32_t m, uint32_t k) {
        constexpr uint32_t S = STAGED, STEP = S * ZW;
        const float sc = scale, a = alpha;    // in registers: not reloaded after each store to t
        float* t = target + p;
        zu32 x = weyl_lanes(k);
        uint32_t j = 0;
        for (; m - j >= STEP; j += STEP) {
            zu32 h[S];
            zf32 z[S], w[S];
            zf32_at* at = reinterpret_cast<zf32_at*>(t + j);
            for (uint32_t s = 0; s < S; ++s) w[s] = at[s];
            hash_stages(h, x);
            centred_byte_sums(h);
            for (uint32_t s = 0; s < S; ++s) z[s] = __builtin_convertvector((zi32)h[s], zf32);
            for (uint32_t s = 0; s < S; ++s) z[s] *= sc;
            for (uint32_t s = 0; s < S; ++s) w[s] += a * z[s];
            for (uint32_t s = 0; s < S; ++s) at[s] = w[s];
            x += STEP * WEYL;
        }
        for (; m - j >= uint32_t(ZW); j += ZW) {
            const zf32 z = __builtin_convertvector(centred_byte_sum(lowbias32(x)), zf32) * sc;
            zf32_at* at = reinterpret_cast<zf32_at*>(t + j);
            const zf32 w = *at;
            *at = w + a * z;
            x += ZW * WEYL;
        }
        for (; j < m; ++j) t[j] += a * normal(lowbias32(k + j * WEYL), sc);
    });
}

// bits32(key, j) at one index
inline uint32_t bits32(uint64_t key, uint64_t j) { return lowbias32(block_key(key, j >> 32) + uint32_t(j) * WEYL); }

// h[j - first] = bits32(key, j) for j in [first, first + m): each_half16's chunk of hashes,
// STAGED vectors an iteration, stage by stage as in add_normal (the A53 model: 2.9 cycles
// a hash; each_bits32's four places an iteration, GCC's order, 4.0)
__attribute__((noinline, optimize("no-tree-ter", "no-schedule-insns", "no-schedule-insns2"))) inline void
fill_bits32(uint32_t* h, uint64_t key, size_t first, size_t m) {
    each_piece(key, first, m, [=](size_t p, uint32_t n, uint32_t k) {
        constexpr uint32_t S = STAGED, STEP = S * ZW;
        uint32_t* o = h + (p - first);
        zu32 x = weyl_lanes(k);
        uint32_t j = 0;
        for (; n - j >= STEP; j += STEP) {
            zu32 v[S];
            hash_stages(v, x);
            for (uint32_t s = 0; s < S; ++s) std::memcpy(o + j + s * ZW, &v[s], sizeof v[s]);
            x += STEP * WEYL;
        }
        for (; n - j >= uint32_t(ZW); j += ZW) {
            const zu32 v = lowbias32(x);
            std::memcpy(o + j, &v, sizeof v);
            x += ZW * WEYL;
        }
        for (; j < n; ++j) o[j] = lowbias32(k + j * WEYL);
    });
}

// INT8's z, two to a hash (docs/zrng.md, "INT8 z"): element i's 16 bits are the half i & 1 of
// bits32(key, i >> 1), the low half for even i; a vector of ZW hashes, read as 2 ZW 16-bit lanes,
// holds elements 2j .. 2j + 2 ZW - 1 in order (every target is little-endian). LANES16 such lanes.
constexpr int LANES16 = 2 * ZW;
typedef uint16_t zu16 __attribute__((vector_size(ZW * 4)));
typedef int16_t zi16 __attribute__((vector_size(ZW * 4)));

// f(i, u, len) over [start, start + n): u an array of vectors of 16-bit lanes, the elements i ..
// i + len - 1's 16 bits in order (len = all of their lanes but at the range's ends, where u is
// one vector). A chunk's hashes are drawn first (fill_bits32), into a buffer in L1 that f then
// reads HALF16_BATCH vectors at a time. f's chain of a dozen dependent operations a vector stalls
// the A53's in-order pipeline unless the other vectors' operations fill it: the passes
// (int8::zo_pass) take each step over all the batch's vectors before the next, and TER is off in
// this function so that GCC keeps them apart (its schedulers stay on: here they help, 122 cycles
// against 263 for a perturbation's batch of eight in the A53 model). With eight vectors, the
// model's perturbation was 1.9 cycles a weight and the update 4.4, where GCC's unrolled loop of
// one vector a call gave 3.5 and 5.3, four vectors staged 2.3 and 4.3; with the changes added in
// 8-bit lanes (int8::add_changes) 1.7 and 3.9, the update's looked up (int8::ChangeTable) 1.95.
// The hash and f in one loop made the A53 model's ZO loops 8.5 % of an INT8 step against 6.6 %,
// and took a Zen 4 15 % more time. An odd first element (the high half of its hash) and an
// unpaired last one (the low) go alone.
constexpr size_t HALF16_CHUNK = 512;      // hashes a chunk: 2 KB
constexpr size_t HALF16_BATCH = 8;        // vectors f takes at once

template <class F>
__attribute__((noinline, optimize("no-tree-ter"))) void
each_half16(uint64_t key, size_t start, size_t n, F f) {
    alignas(64) uint32_t h[HALF16_CHUNK];
    const size_t end = start + n;
    size_t i = start;
    if (i < end && (i & 1)) {
        zu16 u[1] = {};
        u[0][0] = uint16_t(bits32(key, i >> 1) >> 16);
        f(i++, u, 1);
    }
    while (end - i >= 2) {
        const size_t m = std::min(HALF16_CHUNK, (end - i) >> 1), first = i >> 1;
        fill_bits32(h, key, first, m);
        size_t j = 0;
        for (; m - j >= HALF16_BATCH * ZW; j += HALF16_BATCH * ZW) {
            zu16 u[HALF16_BATCH];
            std::memcpy(u, h + j, sizeof u);
            f(i + 2 * j, u, int(HALF16_BATCH) * LANES16);
        }
        for (; m - j >= size_t(ZW); j += ZW) {
            zu16 u[1];
            std::memcpy(u, h + j, sizeof u);
            f(i + 2 * j, u, LANES16);
        }
        if (j < m) {
            zu16 u[1] = {};
            std::memcpy(u, h + j, (m - j) * sizeof *h);
            f(i + 2 * j, u, int(2 * (m - j)));
        }
        i += 2 * m;
    }
    if (i < end) {
        zu16 u[1] = {};
        u[0][0] = uint16_t(bits32(key, i >> 1));
        f(i, u, 1);
    }
}

}  // namespace zrng
