// INT8's perturbation a vector at a time: z from its 16 bits (int8.py z_of_half) and the pass
// that applies it to the weights (int8_net.hpp's perturb and zo_update). Apart from int8.hpp, which
// includes it, so that a check program (tests/cpp/zo_lanes.cpp) compiles it without the kernels and
// common.hpp's JSON (a third of the time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "zrng.hpp"

namespace int8 {

using zrng::zi16;
using zrng::zu16;

// The passes' operations take S vectors at once and do each step over all S before the next:
// an in-order core (the A53) then has S - 1 independent operations between a step and the one
// that needs its result, and each_half16 keeps that order (zrng::add_normal says why GCC would not).

// the number of vectors in an array of them
template <class A>
constexpr size_t count_of = std::extent_v<std::remove_reference_t<A>>;

// r = the high 16 bits of each lane's 32-bit product a b: one instruction on x86 (pmulhuw), three
// on NEON (umull, umull2, uzp2); GCC's vectorizer took it through 32-bit lanes
template <size_t S>
inline void mulhi(zu16 (&r)[S], const zu16 (&a)[S], zu16 b) {
#if defined(__aarch64__)
    uint32x4_t lo[S], hi[S];
    for (size_t s = 0; s < S; ++s) lo[s] = vmull_u16(vget_low_u16(a[s]), vget_low_u16(b));
    for (size_t s = 0; s < S; ++s) hi[s] = vmull_high_u16(a[s], b);
    for (size_t s = 0; s < S; ++s) r[s] = vuzp2q_u16(vreinterpretq_u16_u32(lo[s]), vreinterpretq_u16_u32(hi[s]));
#else
    for (size_t s = 0; s < S; ++s) {
#if defined(__AVX512BW__)
        r[s] = (zu16)_mm512_mulhi_epu16((__m512i)a[s], (__m512i)b);
#elif defined(__AVX2__) && !defined(__AVX512F__)
        r[s] = (zu16)_mm256_mulhi_epu16((__m256i)a[s], (__m256i)b);
#elif defined(__SSE2__) && !defined(__AVX2__)
        r[s] = (zu16)_mm_mulhi_epu16((__m128i)a[s], (__m128i)b);
#else   // AVX-512F without BW
        typedef uint32_t wide __attribute__((vector_size(sizeof(zu16) * 2)));
        r[s] = __builtin_convertvector((__builtin_convertvector(a[s], wide) * __builtin_convertvector(b, wide)) >> 16, zu16);
#endif
    }
#endif
}

// z of u: with p = u (2 scale + 1), 0 where p's low 16 bits are below threshold, else p's high
// 16 - scale
template <size_t S>
inline void zo_noise(zi16 (&z)[S], const zu16 (&u)[S], int16_t scale, uint16_t threshold) {
    const uint16_t m = uint16_t(2 * scale + 1);
    zu16 p[S];
    mulhi(p, u, zu16{} + m);
    for (size_t s = 0; s < S; ++s) z[s] = (zi16)p[s] - scale;
    for (size_t s = 0; s < S; ++s) p[s] = u[s] * m;
    for (size_t s = 0; s < S; ++s) z[s] = p[s] < threshold ? zi16{} : z[s];
}

// LANES16 weights from p as 16-bit lanes, and back (every value in [-127, 127]); GCC 12 made
// NEON's widening a byte at a time, and AVX-512's two halves
inline zi16 widen(const int8_t* p) {
#if defined(__AVX512BW__)
    return (zi16)_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__aarch64__)
    return (zi16)vmovl_s8(vld1_s8(p));
#else
    typedef int8_t bytes __attribute__((vector_size(zrng::LANES16)));
    bytes b;
    std::memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, zi16);
#endif
}
inline void narrow(int8_t* p, zi16 v) {
#if defined(__aarch64__)
    vst1_s8(p, vmovn_s16((int16x8_t)v));
#else
    typedef int8_t bytes __attribute__((vector_size(zrng::LANES16)));
    const bytes b = __builtin_convertvector(v, bytes);
    std::memcpy(p, &b, sizeof b);
#endif
}

// clamp(w + e, -127, 127) for S LANES16 weights at w, e their changes (16-bit lanes, |e| <= 127):
// in 8-bit lanes where the ISA saturates them (x86 from SSE2, NEON), two vectors of e to one of
// weights: the pair narrowed with saturation (which keeps them), the sums saturating to
// [-128, 127] and a max taking -128 to -127. A vector without a pair (each_half16 hands over one
// at a time at a chunk's or the range's end), and every vector where the ISA has no saturating
// 8-bit lanes (AVX-512F without BW): widened to 16-bit lanes and back. Widened on every path, a
// Zen 4's INT8 ZO loops took 14 % more time (42.2 against 37.0 us a full-zo step).
#if defined(__AVX512BW__)
typedef __m512i zi8;
#elif defined(__AVX2__) && !defined(__AVX512F__)
typedef __m256i zi8;
#elif defined(__SSE2__) && !defined(__AVX2__)
typedef __m128i zi8;
#elif defined(__aarch64__)
typedef int8x16_t zi8;
#else
#define ZOBENCH_INT8_WIDE 1
#endif

#if !defined(ZOBENCH_INT8_WIDE)
static_assert(sizeof(zi8) == sizeof(zi16));   // a vector of 8-bit lanes holds two of 16-bit lanes
// (a, b) narrowed to 8-bit lanes with saturation, a's lanes first (x86's packs interleaves their
// 128-bit lanes: a permute puts them back)
inline zi8 narrow_pair(zi16 a, zi16 b) {
#if defined(__AVX512BW__)
    return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), _mm512_packs_epi16((__m512i)a, (__m512i)b));
#elif defined(__AVX2__)
    return _mm256_permute4x64_epi64(_mm256_packs_epi16((__m256i)a, (__m256i)b), 0xD8);
#elif defined(__SSE2__)
    return _mm_packs_epi16((__m128i)a, (__m128i)b);
#else
    return vqmovn_high_s16(vqmovn_s16((int16x8_t)a), (int16x8_t)b);
#endif
}
// clamp(w + e, -127, 127) lane by lane
inline zi8 add_clamped(zi8 w, zi8 e) {
#if defined(__AVX512BW__)
    return _mm512_max_epi8(_mm512_adds_epi8(w, e), _mm512_set1_epi8(-127));
#elif defined(__AVX2__)
    return _mm256_max_epi8(_mm256_adds_epi8(w, e), _mm256_set1_epi8(-127));
#elif defined(__SSE2__)   // pmaxsb came with SSE4.1: -128 is the one sum below -127, and -128 + 1 = -127
    const __m128i v = _mm_adds_epi8(w, e);
    return _mm_sub_epi8(v, _mm_cmpeq_epi8(v, _mm_set1_epi8(-128)));
#else
    return vmaxq_s8(vqaddq_s8(w, e), vdupq_n_s8(-127));
#endif
}
#endif

template <size_t S>
inline void add_changes(int8_t* w, const zi16 (&e)[S]) {
#if !defined(ZOBENCH_INT8_WIDE)
    if constexpr (S % 2 == 0) {
        zi8 v[S / 2], d[S / 2];
        for (size_t s = 0; s < S / 2; ++s) std::memcpy(&v[s], w + s * sizeof(zi8), sizeof(zi8));
        for (size_t s = 0; s < S / 2; ++s) d[s] = narrow_pair(e[2 * s], e[2 * s + 1]);
        for (size_t s = 0; s < S / 2; ++s) v[s] = add_clamped(v[s], d[s]);
        for (size_t s = 0; s < S / 2; ++s) std::memcpy(w + s * sizeof(zi8), &v[s], sizeof(zi8));
        return;
    }
#endif
    for (size_t s = 0; s < S; ++s) {
        zi16 v = widen(w + s * zrng::LANES16) + e[s];
        v = v > 127 ? zi16{} + 127 : v;
        v = v < -127 ? zi16{} - 127 : v;
        narrow(w + s * zrng::LANES16, v);
    }
}

// A change that depends on z alone (the ZO update's z - psto_sign(g z)) takes one of 2r + 1 values:
// where the ISA looks 16-bit lanes up in a table of 64 (AVX-512BW's vpermi2w; NEON's tbl over four
// registers, a byte a lane), the values made once a pass (int8_net.hpp zo_update) and looked up
// replace a dozen operations a vector, for r <= LOOKUP_SCALE (every tuned scale): a Zen 4's update
// 17.0 -> 10.4 us a full-zo step, the A53 model's 3.9 -> 1.95 cycles a weight. Elsewhere the pass
// computes them.
#if defined(__AVX512BW__) || defined(__aarch64__)
#define ZOBENCH_INT8_LOOKUP 1
constexpr int LOOKUP_SCALE = 31;
class ChangeTable {
#if defined(__AVX512BW__)
    __m512i lo_, hi_;          // the values of index 0..31 and 32..63
    zi16 base_;                // index = z + r
#else
    uint8x16x4_t t_;           // the values + 64, as bytes (all in [0, 127])
    zi16 base_;                // z + r + 0xFF00: each lane's high byte out of the table's range, so 0
#endif
public:
    // value's lanes in order: the value of z at z + r, for z in [-r, r]
    ChangeTable(const zi16 (&value)[64 / zrng::LANES16], int r) {
#if defined(__AVX512BW__)
        lo_ = (__m512i)value[0];
        hi_ = (__m512i)value[1];
        base_ = zi16{} + int16_t(r);
#else
        uint8_t b[64];
        for (int i = 0; i < 64; ++i) b[i] = uint8_t(value[i / zrng::LANES16][i % zrng::LANES16] + 64);
        t_ = vld1q_u8_x4(b);
        base_ = zi16{} + int16_t(r + 0xFF00);
#endif
    }
    // z = its value, lane by lane
    template <size_t S>
    void apply(zi16 (&z)[S]) const {
        for (size_t s = 0; s < S; ++s) z[s] += base_;
#if defined(__AVX512BW__)
        for (size_t s = 0; s < S; ++s) z[s] = (zi16)_mm512_permutex2var_epi16(lo_, (__m512i)z[s], hi_);
#else
        for (size_t s = 0; s < S; ++s) z[s] = (zi16)vqtbl4q_u8(t_, vreinterpretq_u8_s16((int16x8_t)z[s]));
        for (size_t s = 0; s < S; ++s) z[s] -= 64;
#endif
    }
};
#endif

// w[i] = clamp(w[i] + e[i], -127, 127) over [start, start + n) (zrng::each_half16): g(e, u) gives
// e, an array of vectors of 16-bit lanes (|e| <= 127), from u, their z's 16 bits. A short vector
// at the range's ends (each_half16 hands those over one at a time) through a copy
template <class G>
inline void zo_pass(int8_t* w, uint64_t key, size_t start, size_t n, G g) {
    zrng::each_half16(key, start, n, [=](size_t i, const auto& u, int len) {
        constexpr size_t S = count_of<decltype(u)>;
        zi16 e[S];
        g(e, u);
        if (len == int(S) * zrng::LANES16) {
            add_changes(w + i, e);
        } else if constexpr (S == 1) {
            int8_t t[zrng::LANES16] = {};
            std::memcpy(t, w + i, size_t(len));
            add_changes(t, e);
            std::memcpy(w + i, t, size_t(len));
        }
    });
}

}  // namespace int8
