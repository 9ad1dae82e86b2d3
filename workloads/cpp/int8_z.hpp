// INT8's perturbation a vector at a time: z from its 16 bits (int8.py z_of_half) and the pass
// that applies it to the weights (int8_net.hpp's perturb and zo_update). Apart from int8.hpp, which
// includes it, so that a check program (tests/cpp/zo_lanes.cpp) compiles it without the kernels and
// common.hpp's JSON (a third of the time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

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

// the high 16 bits of each lane's 32-bit product a b: one instruction on x86 (pmulhuw), three on
// NEON (umull, umull2, uzp2); GCC's vectorizer took it through 32-bit lanes
inline zu16 mulhi(zu16 a, zu16 b) {
#if defined(__AVX512BW__)
    return (zu16)_mm512_mulhi_epu16((__m512i)a, (__m512i)b);
#elif defined(__AVX2__) && !defined(__AVX512F__)
    return (zu16)_mm256_mulhi_epu16((__m256i)a, (__m256i)b);
#elif defined(__SSE2__) && !defined(__AVX2__)
    return (zu16)_mm_mulhi_epu16((__m128i)a, (__m128i)b);
#elif defined(__aarch64__)
    return vuzp2q_u16(vreinterpretq_u16_u32(vmull_u16(vget_low_u16(a), vget_low_u16(b))),
                      vreinterpretq_u16_u32(vmull_high_u16(a, b)));
#else   // AVX-512F without BW
    typedef uint32_t wide __attribute__((vector_size(sizeof(zu16) * 2)));
    return __builtin_convertvector((__builtin_convertvector(a, wide) * __builtin_convertvector(b, wide)) >> 16, zu16);
#endif
}

// p = u (2 scale + 1): 0 where p's low 16 bits are below threshold, else p's high 16 - scale
inline zi16 zo_noise(zu16 u, int16_t scale, uint16_t threshold) {
    const uint16_t m = uint16_t(2 * scale + 1);
    const zi16 z = (zi16)mulhi(u, zu16{} + m) - scale;
    return u * m < threshold ? zi16{} : z;
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

// w[i] = g(w[i], z's 16 bits) over [start, start + n), LANES16 at a time (zrng::each_half16); a
// short vector at the range's ends through a copy
template <class G>
inline void zo_pass(int8_t* w, uint64_t key, size_t start, size_t n, G g) {
    zrng::each_half16(key, start, n, [=](size_t i, zu16 u, int len) {
        if (len == zrng::LANES16) return narrow(w + i, g(widen(w + i), u));
        int8_t t[zrng::LANES16] = {};
        std::memcpy(t, w + i, size_t(len));
        narrow(t, g(widen(t), u));
        std::memcpy(w + i, t, size_t(len));
    });
}

}  // namespace int8
