// INT8 training (ElasticZO-INT8; NITI-style), the operations of docs/int8.md. Every function
// here has a twin of the same name in workloads/int8.py, the torch reference, and the two
// agree bit for bit (tests/test_int8.py).
//
// Activations are stored as uint8: every layer input is a ReLU output or pixel >> 1, so it is
// in [0, 127]; weights and errors are int8. Products accumulate in int32 (a layer's output,
// an error, an FC gradient) or int64 (a convolution's weight gradient, summed over B*H*W).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// ZOBENCH_VNNI: x86 with AVX-512 VNNI (vpdpbusd: four uint8 x int8 products per int32 lane),
// with the BW byte loads and the VL 256-bit forms the kernels use; otherwise portable loops
// (and NEON on aarch64). The integer results are the same on every path.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ZOBENCH_VNNI 1
#include <immintrin.h>
#else
#define ZOBENCH_VNNI 0
#endif
#if defined(__aarch64__)
#include <arm_neon.h>  // armv8-a: vmull_s8 / vpadalq_s16, no dot-product instructions
#endif

#include "common.hpp"
#include "zrng.hpp"

namespace int8 {

constexpr bool VNNI = ZOBENCH_VNNI;

constexpr int ACT_BITS = 7, INPUT_EXP = -7, CE_OFFSET = 10, ERR_BITS_IN = 11, ZO_GRAD_BITS = 1;
constexpr int64_t LOG2E_Q15 = 47274;
constexpr int LOSS_FRAC_BITS = 6;
// 2^(f/64) in Q30, f = 0..63 (int8.py POW2_Q30)
constexpr int64_t POW2_Q30[64] = {
    1073741824, 1085434106, 1097253708, 1109202018, 1121280436, 1133490379, 1145833280, 1158310587,
    1170923762, 1183674286, 1196563654, 1209593378, 1222764986, 1236080024, 1249540052, 1263146652,
    1276901417, 1290805962, 1304861917, 1319070932, 1333434672, 1347954824, 1362633090, 1377471191,
    1392470869, 1407633882, 1422962010, 1438457051, 1454120821, 1469955159, 1485961921, 1502142985,
    1518500250, 1535035634, 1551751076, 1568648537, 1585730000, 1602997467, 1620452965, 1638098541,
    1655936265, 1673968228, 1692196547, 1710623359, 1729250827, 1748081133, 1767116489, 1786359126,
    1805811301, 1825475297, 1845353420, 1865448001, 1885761398, 1906295993, 1927054196, 1948038440,
    1969251188, 1990694927, 2012372174, 2034285470, 2056437387, 2078830522, 2101467502, 2124350982};

inline int grad_bits(int epoch) { return epoch < 20 ? 5 : epoch < 50 ? 4 : 3; }
inline uint64_t sparsity_threshold(int epoch) { return epoch < 20 ? 21627 : epoch < 50 ? 32768 : 58982; }

inline int ceil_log2(uint64_t m) { return m > 1 ? 64 - __builtin_clzll(m - 1) : 0; }

template <class T>
inline T round_shift(T x, int s) { return (x >> s) + ((x >> (s - 1)) & 1); }

// NITI's pseudo-stochastic rounding of |x| / 2^s, sign put back (int8.py psto_shift);
// branch-free, so the ZO update loop vectorizes
template <class T>
inline T psto_shift(T x, int s) {
    const T a = x < 0 ? -x : x;
    const T rem = a & ((T(1) << s) - 1);
    const int h = s >> 1;
    const T prob = rem >> h, rand = (rem & ((T(1) << h) - 1)) << (s & 1);
    const T r = (a >> s) + T(prob > rand);
    return x < 0 ? -r : r;
}

inline int clamp127(int64_t v) { return int(std::min<int64_t>(127, std::max<int64_t>(-127, v))); }

// the requantization shift of a tensor whose largest |value| is m
inline int shift_of_max(uint32_t m) { return ceil_log2(m) - ACT_BITS; }

// max |acc| over a whole tensor: the requantization shift of the layer
inline int requant_shift(const int32_t* acc, size_t n) {
    uint32_t m = 0;
#pragma omp parallel for simd reduction(max : m) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i) {
        const uint32_t a = uint32_t(acc[i] < 0 ? -acc[i] : acc[i]);
        m = a > m ? a : m;
    }
    return shift_of_max(m);
}

inline int requant_value(int32_t a, int s) { return clamp127(s > 0 ? round_shift(a, s) : a); }
// the same, then the ReLU: an activation in [0, 127]
inline uint8_t requant_relu(int32_t a, int s) { return uint8_t(std::max(requant_value(a, s), 0)); }

// ---- the dot product every layer is made of: activations (uint8 in [0, 127], or int8
// errors) x int8 weights -> int32 ----
template <class A>
__attribute__((always_inline)) inline int32_t dot(const A* __restrict a, const int8_t* __restrict w, int n) {
    int i = 0;
    int32_t s = 0;
#if defined(__aarch64__)
    int32x4_t acc = vdupq_n_s32(0);
    for (; i + 16 <= n; i += 16) {  // uint8 activations are <= 127: as int8 they are the same values
        int8x16_t av;
        if constexpr (std::is_same_v<A, uint8_t>) av = vreinterpretq_s8_u8(vld1q_u8(a + i));
        else av = vld1q_s8(a + i);
        const int8x16_t wv = vld1q_s8(w + i);
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(av), vget_low_s8(wv)));
        acc = vpadalq_s16(acc, vmull_high_s8(av, wv));
    }
    s = vaddvq_s32(acc);
#endif
#pragma omp simd reduction(+ : s)
    for (int k = i; k < n; ++k) s += int32_t(a[k]) * int32_t(w[k]);
    return s;
}

// out[j] = a_j . w for four activation rows: each weight load feeds four images (FC forward)
__attribute__((always_inline)) inline void dot4(int32_t out[4], const uint8_t* const a[4], const int8_t* __restrict w,
                                                int n) {
#if ZOBENCH_VNNI
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int i = 0; i < n; i += 64) {
        const __mmask64 m = n - i >= 64 ? ~__mmask64(0) : (__mmask64(1) << (n - i)) - 1;
        const __m512i wv = _mm512_maskz_loadu_epi8(m, w + i);
        for (int j = 0; j < 4; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], _mm512_maskz_loadu_epi8(m, a[j] + i), wv);
    }
    for (int j = 0; j < 4; ++j) out[j] = _mm512_reduce_add_epi32(acc[j]);
#else
    for (int j = 0; j < 4; ++j) out[j] = dot(a[j], w, n);
#endif
}

// ---- the sparse uniform perturbation z[i] (int8.py zo_noise) ----
inline int zo_noise(uint64_t key, uint64_t i, int64_t scale, uint64_t threshold) {
    const uint64_t b = zrng::bits(key, i);
    if ((b >> 48) < threshold) return 0;
    return int(int64_t(((b & 0xFFFFFFFFull) * uint64_t(2 * scale + 1)) >> 32) - scale);
}

inline int zo_update_shift(int scale) { return ceil_log2(uint64_t(scale)) - ZO_GRAD_BITS; }

// ---- losses of int8 logits q with exponent e ----
inline int64_t base2_logit(int q, int e) {
    const int64_t t = int64_t(q) * LOG2E_Q15;
    return e <= 15 ? t >> (15 - e) : t << (e - 15);
}

// float64 mean cross-entropy of q * 2^e (the paper's INT8)
inline double float_loss(const int8_t* q, int e, const int* labels, int B, int C) {
    const double scale = std::ldexp(1.0, e);
    double total = 0;
    for (int b = 0; b < B; ++b) {
        const int8_t* l = q + b * C;
        const double m = scale * *std::max_element(l, l + C);
        double s = 0;
        for (int k = 0; k < C; ++k) s += std::exp(scale * l[k] - m);
        total += std::log(s) + m - scale * l[labels[b]];
    }
    return total / B;
}

inline int64_t log2_fixed(uint64_t v) {
    const int msb = 63 - __builtin_clzll(v);
    uint64_t m = msb <= 30 ? v << (30 - msb) : v >> (msb - 30);
    int64_t out = msb;
    for (int k = 0; k < LOSS_FRAC_BITS; ++k) {
        m = (m * m) >> 30;
        const uint64_t bit = m >> 31;
        m >>= bit;
        out = (out << 1) | int64_t(bit);
    }
    return out;
}

// Eq. 12's integer loss summed over the batch, in units of 2^-6 bits (the paper's INT8*)
inline int64_t integer_loss(const int8_t* q, int e, const int* labels, int B, int C) {
    int64_t total = 0;
    for (int b = 0; b < B; ++b) {
        int64_t s[MAX_CLASSES];
        int64_t m = INT64_MIN;
        for (int k = 0; k < C; ++k) m = std::max(m, s[k] = base2_logit(q[b * C + k], e + LOSS_FRAC_BITS));
        uint64_t acc = 0;
        for (int k = 0; k < C; ++k) {
            const int64_t d = s[k] - m;
            const int64_t ip = -(d >> LOSS_FRAC_BITS);
            if (ip <= 30) acc += uint64_t(POW2_Q30[d & 63] >> ip);
        }
        total += log2_fixed(acc) - (int64_t(30) << LOSS_FRAC_BITS) + m - s[labels[b]];
    }
    return total;
}

// NITI's integer cross-entropy gradient dL/dlogits as int8 values (int8.py ce_error)
inline void ce_error(int8_t* err, const int8_t* q, int e, const int* labels, int B, int C) {
    for (int b = 0; b < B; ++b) {
        int64_t s[MAX_CLASSES], p[MAX_CLASSES];
        int64_t m = INT64_MIN, sum = 0, scaled = 0;
        for (int k = 0; k < C; ++k) m = std::max(m, s[k] = base2_logit(q[b * C + k], e));
        for (int k = 0; k < C; ++k) {
            const int64_t d = std::max<int64_t>(s[k] - m + CE_OFFSET, 0);
            sum += p[k] = (int64_t(1) << d) - 1;
        }
        for (int k = 0; k < C; ++k) scaled += p[k] = (p[k] << ERR_BITS_IN) / sum;
        p[labels[b]] -= scaled;
        for (int k = 0; k < C; ++k) err[b * C + k] = int8_t(clamp127(round_shift(p[k], 4)));
    }
}

// NITI's gradient rounding to `bits` bits; w -= g, clamped; acc zeroed (int8.py grad_round)
template <class T>
inline void apply_gradient(int8_t* w, T* acc, size_t n, int bits) {
    uint64_t m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max<uint64_t>(m, uint64_t(acc[i] < 0 ? -int64_t(acc[i]) : acc[i]));
    const int b = ceil_log2(m), s = b - bits;
    if (b > 0)
        for (size_t i = 0; i < n; ++i) w[i] = int8_t(clamp127(int64_t(w[i]) - (s < 1 ? acc[i] : psto_shift(acc[i], s))));
    std::fill(acc, acc + n, T(0));
}

// The weights' exponents: 127 * 2^e ~ Xavier's uniform bound (int8.py init_weights)
inline int init_exponent(int fan_in, int fan_out) {
    return int(std::ceil(std::log2(std::sqrt(6.0 / (fan_in + fan_out))))) - ACT_BITS;
}

}  // namespace int8
