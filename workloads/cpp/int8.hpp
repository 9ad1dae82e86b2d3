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
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common.hpp"
#include "int8_z.hpp"
#include "zrng.hpp"

namespace int8 {

// ---- the dot-product instruction every kernel is built on, one per path (env.kernels.int8) ----
// dp(acc, u, w) adds to each int32 lane of acc the four products of its four bytes of u (uint8
// activations, in [0, 127]) and of w (int8): x86's vpdpbusd. dps is the same for a signed u (an
// error). Why no path can saturate: docs/int8.md, "Kernel paths". Vec<L> holds L int32 lanes;
// WIDEST is the path's widest (0: no dot-product instruction, `dot` alone); the register tiles are
// sized for the build's VREGS vector registers (common.hpp).
//  - avx512-vnni: vpdpbusd itself, 256- and 512-bit;
//  - avx512-maddubs, avx2-maddubs, ssse3-maddubs: vpmaddubsw (two products into int16) then
//    vpmaddwd by 1 (two of those into int32), 512- and 256-bit (AVX-512BW), 256-bit (AVX2) or
//    128-bit (SSSE3); dps by the sign trick;
//  - sse2-maddwd: pmaddwd of the even and of the odd bytes, widened to int16, 128-bit;
//  - neon-dotprod: sdot, 128-bit; an activation <= 127 is the same value read as int8;
//  - neon-smull (armv8-a, no sdot): smull (the low eight byte products into int16), smlal2
//    (the high eight's added: |sum| <= 2 * 127^2), sadalp (pairs of those into int32), 128-bit.
//    Lane l's four bytes are therefore 2l, 2l + 1, 2l + 8, 2l + 9 (quad_byte), and u comes as
//    two registers (U): the low half of the first and the high half of the second, which
//    bcast4 fills with bytes 0-1 and 2-3 of the four it broadcasts (ld2r), and as_u with one
//    vector twice;
//  - generic (omp simd): no kernels of its own.
// U is the activation operand of dp (B but on neon-smull).
#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
constexpr const char* KERNELS = "avx512-vnni";
#define ZOBENCH_I8_WIDEST 16
#define ZOBENCH_I8_VNNI 1
#elif defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr const char* KERNELS = "avx512-maddubs";
#define ZOBENCH_I8_WIDEST 16
#elif defined(__AVX2__)
constexpr const char* KERNELS = "avx2-maddubs";
#define ZOBENCH_I8_WIDEST 8
#elif defined(__SSSE3__)
constexpr const char* KERNELS = "ssse3-maddubs";
#define ZOBENCH_I8_WIDEST 4
#elif defined(__SSE2__)
constexpr const char* KERNELS = "sse2-maddwd";
#define ZOBENCH_I8_WIDEST 4
#elif defined(__ARM_FEATURE_DOTPROD)
constexpr const char* KERNELS = "neon-dotprod";
#define ZOBENCH_I8_WIDEST 4
#elif defined(__aarch64__)
constexpr const char* KERNELS = "neon-smull";
#define ZOBENCH_I8_WIDEST 4
#else
constexpr const char* KERNELS = "generic";
#define ZOBENCH_I8_WIDEST 0
#endif
constexpr int WIDEST = ZOBENCH_I8_WIDEST;

// keep_top's masks: 64 zero bytes, then 64 of all ones
struct TopMask {
    int8_t m[128];
};
constexpr TopMask top_mask() {
    TopMask t{};
    for (int i = 64; i < 128; ++i) t.m[i] = -1;
    return t;
}
alignas(64) inline constexpr TopMask TOP_MASK = top_mask();

inline uint32_t load4(const void* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

template <int L>
struct Vec;

#if defined(__AVX2__)
template <>
struct Vec<8> {
    using A = __m256i;  // int32 lanes
    using B = __m256i;  // their bytes
    using U = B;
    static constexpr int BYTES = 32;
    static A zero() { return _mm256_setzero_si256(); }
    static A set1(int32_t v) { return _mm256_set1_epi32(v); }
    static B load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
    static B bcast4(const void* p) { return _mm256_castps_si256(_mm256_broadcast_ss(static_cast<const float*>(p))); }
    // all but the top r bytes zeroed (0 < r < BYTES)
    static B keep_top(B v, int r) { return _mm256_and_si256(v, load(TOP_MASK.m + 64 - BYTES + r)); }
    static A dp(A acc, B u, B w) {
#if defined(ZOBENCH_I8_VNNI)
        return _mm256_dpbusd_epi32(acc, u, w);
#else
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, w), _mm256_set1_epi16(1)));
#endif
    }
    // a * w = |a| * (w with a's sign), exact while w != -128
    static A dps(A acc, B a, B w) { return dp(acc, _mm256_abs_epi8(a), _mm256_sign_epi8(w, a)); }
    static A max(A a, A b) { return _mm256_max_epi32(a, b); }
    static A min(A a, A b) { return _mm256_min_epi32(a, b); }
    static void store(int32_t* p, A v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
    static int32_t sum(A v) {
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
    }
};
#endif

#if defined(__SSE2__) && !defined(__AVX2__)
template <>
struct Vec<4> {
    using A = __m128i;
    using B = __m128i;
    using U = B;
    static constexpr int BYTES = 16;
    static A zero() { return _mm_setzero_si128(); }
    static A set1(int32_t v) { return _mm_set1_epi32(v); }
    static B load(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
    static B bcast4(const void* p) { return _mm_castps_si128(_mm_load1_ps(static_cast<const float*>(p))); }
    static B keep_top(B v, int r) { return _mm_and_si128(v, load(TOP_MASK.m + 64 - BYTES + r)); }
#if defined(__SSSE3__)
    static A dp(A acc, B u, B w) { return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(u, w), _mm_set1_epi16(1))); }
    static A dps(A acc, B a, B w) { return dp(acc, _mm_abs_epi8(a), _mm_sign_epi8(w, a)); }
    static A max(A a, A b) { return _mm_max_epi32(a, b); }
    static A min(A a, A b) { return _mm_min_epi32(a, b); }
#else
    // the even bytes of each 16-bit lane and the odd ones, as int16 (sign-extended for int8):
    // pmaddwd of each pair adds two of a lane's four products, in int32
    static A dp2(A acc, B even_u, B odd_u, B w) {
        const B even_w = _mm_srai_epi16(_mm_slli_epi16(w, 8), 8), odd_w = _mm_srai_epi16(w, 8);
        return _mm_add_epi32(_mm_add_epi32(acc, _mm_madd_epi16(even_u, even_w)), _mm_madd_epi16(odd_u, odd_w));
    }
    static A dp(A acc, B u, B w) { return dp2(acc, _mm_and_si128(u, _mm_set1_epi16(0xFF)), _mm_srli_epi16(u, 8), w); }
    static A dps(A acc, B a, B w) { return dp2(acc, _mm_srai_epi16(_mm_slli_epi16(a, 8), 8), _mm_srai_epi16(a, 8), w); }
    static A max(A a, A b) { return pick(_mm_cmpgt_epi32(a, b), a, b); }
    static A min(A a, A b) { return pick(_mm_cmpgt_epi32(a, b), b, a); }
    static A pick(A mask, A yes, A no) { return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no)); }
#endif
    static void store(int32_t* p, A v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
    static int32_t sum(A v) {
        v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
        return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1)));
    }
};
#endif

#if defined(__AVX512BW__) && defined(__AVX512VL__)
template <>
struct Vec<16> {
    using A = __m512i;
    using B = __m512i;
    using U = B;
    static constexpr int BYTES = 64;
    static A zero() { return _mm512_setzero_si512(); }
    static A set1(int32_t v) { return _mm512_set1_epi32(v); }
    static B load(const void* p) { return _mm512_loadu_si512(p); }
    static B bcast4(const void* p) { return _mm512_castps_si512(_mm512_broadcastss_ps(_mm_load_ss(static_cast<const float*>(p)))); }
    static B keep_top(B v, int r) { return _mm512_maskz_mov_epi8(~__mmask64(0) << (BYTES - r), v); }
    static A dp(A acc, B u, B w) {
#if defined(ZOBENCH_I8_VNNI)
        return _mm512_dpbusd_epi32(acc, u, w);
#else
        return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, w), _mm512_set1_epi16(1)));
#endif
    }
    static A dps(A acc, B a, B w) {  // no vpsignb on 512 bits: negate w where a < 0
        return dp(acc, _mm512_abs_epi8(a), _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(a), _mm512_setzero_si512(), w));
    }
    static A max(A a, A b) { return _mm512_max_epi32(a, b); }
    static A min(A a, A b) { return _mm512_min_epi32(a, b); }
    static void store(int32_t* p, A v) { _mm512_storeu_si512(p, v); }
    static int32_t sum(A v) { return _mm512_reduce_add_epi32(v); }
};
#endif

#if defined(__aarch64__)
template <>
struct Vec<4> {
    using A = int32x4_t;
    using B = int8x16_t;
    static constexpr int BYTES = 16;
    static A zero() { return vdupq_n_s32(0); }
    static A set1(int32_t v) { return vdupq_n_s32(v); }
    static B load(const void* p) { return vld1q_s8(static_cast<const int8_t*>(p)); }
    static B keep_top(B v, int r) { return vandq_s8(v, load(TOP_MASK.m + 64 - BYTES + r)); }
#if defined(__ARM_FEATURE_DOTPROD)
    using U = B;
    static U bcast4(const void* p) { return vreinterpretq_s8_u32(vdupq_n_u32(load4(p))); }
    static A dp(A acc, U u, B w) { return vdotq_s32(acc, u, w); }
#else
    using U = int8x16x2_t;
    // ld2r: bytes 0-1 in every 16-bit lane of the first register, bytes 2-3 in the second's
    // (the instruction reads two bytes at a time whatever their alignment)
    static U bcast4(const void* p) {
        const int16x8x2_t h = vld2q_dup_s16(static_cast<const int16_t*>(p));
        return {{vreinterpretq_s8_s16(h.val[0]), vreinterpretq_s8_s16(h.val[1])}};
    }
    // int16 lane j: the products of bytes j and j + 8 (no overflow: both factors' |values| <=
    // 127); int32 lane l: int16 lanes 2l, 2l + 1. Its three instructions one by one (T), for
    // kernels that interleave several dps: an in-order core otherwise waits out each latency.
    using T = int16x8_t;
    static T mul(U u, B w) { return vmull_s8(vget_low_s8(u.val[0]), vget_low_s8(w)); }
    static T mla(T t, U u, B w) { return vmlal_high_s8(t, u.val[1], w); }
    static A widen(A acc, T t) { return vpadalq_s16(acc, t); }
    static A dp(A acc, U u, B w) { return widen(acc, mla(mul(u, w), u, w)); }
#endif
    static A dps(A acc, U a, B w) { return dp(acc, a, w); }
    static A max(A a, A b) { return vmaxq_s32(a, b); }
    static A min(A a, A b) { return vminq_s32(a, b); }
    static void store(int32_t* p, A v) { vst1q_s32(p, v); }
    static int32_t sum(A v) { return vaddvq_s32(v); }
};
#endif

#if ZOBENCH_I8_WIDEST
// where dp takes lane l's k-th byte (l < the path's lanes, k < 4) in a row of its weights
constexpr int quad_byte(int l, int k) {
#if defined(__aarch64__) && !defined(__ARM_FEATURE_DOTPROD)
    return l / 4 * 16 + 2 * (l % 4) + k % 2 + (k / 2) * 8;
#else
    return 4 * l + k;
#endif
}

// a vector of activations as dp's operand, where only the sum of all lanes is wanted (a dot
// product): on neon-smull its lanes then hold other bytes than those of quad_byte
template <class S>
inline typename S::U as_u(typename S::B v) {
    if constexpr (std::is_same_v<typename S::U, typename S::B>) return v;
    else return {{v, v}};
}
#endif

// whether S has dp in stages (S::T, mul, mla, widen)
template <class S, class = void>
struct staged : std::false_type {};
template <class S>
struct staged<S, std::void_t<typename S::T>> : std::true_type {};

// dp for uint8 activations, dps for int8 errors
template <class S, class T>
__attribute__((always_inline)) inline typename S::A dp_of(typename S::A acc, typename S::U a, typename S::B w) {
    if constexpr (std::is_same_v<T, uint8_t>) return S::dp(acc, a, w);
    else return S::dps(acc, a, w);
}

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
inline uint32_t sparsity_threshold(int epoch) { return epoch < 20 ? 21627 : epoch < 50 ? 32768 : 58982; }

inline int ceil_log2(uint64_t m) { return m > 1 ? 64 - __builtin_clzll(m - 1) : 0; }

template <class T>
inline T round_shift(T x, int s) { return (x >> s) + ((x >> (s - 1)) & 1); }

// NITI's pseudo-stochastic rounding of |x| / 2^s, sign put back (int8.py psto_shift); branch-free
template <class T>
inline T psto_shift(T x, int s) {
    const T a = x < 0 ? -x : x;
    const T rem = a & ((T(1) << s) - 1);
    const int h = s >> 1;
    const T prob = rem >> h, rand = (rem & ((T(1) << h) - 1)) << (s & 1);
    const T r = (a >> s) + T(prob > rand);
    return x < 0 ? -r : r;
}

// x = clamp(psto_shift(x, s), -1, 1), the ZO update's one-bit step, lane by lane in fewer
// operations: |x| / 2^s rounds to at least 1 where |x| >= 2^s or, below, where the rounding adds
// one (for s = 0 wherever x != 0); there sign(x), elsewhere 0. S vectors, a step over all at once
// (int8_z.hpp)
template <size_t S>
inline void psto_sign(zrng::zi16 (&x)[S], int s) {
    const int h = s >> 1, odd = s & 1;
    const int16_t top = int16_t((1 << s) - 1), low = int16_t((1 << h) - 1);
    zrng::zi16 a[S], up[S], p[S];
    for (size_t k = 0; k < S; ++k) a[k] = x[k] < 0 ? -x[k] : x[k];
    for (size_t k = 0; k < S; ++k) x[k] = (x[k] >> 15) | 1;      // the sign, as -1 or 1
    for (size_t k = 0; k < S; ++k) up[k] = a[k] > top;
    for (size_t k = 0; k < S; ++k) p[k] = a[k] >> h;
    for (size_t k = 0; k < S; ++k) a[k] &= low;
    for (size_t k = 0; k < S; ++k) a[k] <<= odd;
    for (size_t k = 0; k < S; ++k) p[k] = p[k] > a[k];
    for (size_t k = 0; k < S; ++k) up[k] |= p[k];
    for (size_t k = 0; k < S; ++k) x[k] &= up[k];
}

inline int clamp127(int64_t v) { return int(std::min<int64_t>(127, std::max<int64_t>(-127, v))); }
// the same in int: a loop over int32 values keeps its lanes (int64 would halve them)
inline int clamp127(int v) { return std::min(127, std::max(-127, v)); }

// the requantization shift of a tensor whose largest |value| is m
inline int shift_of_max(uint32_t m) { return ceil_log2(m) - ACT_BITS; }

// max |acc| over a whole tensor: the requantization shift of the layer
inline int requant_shift(const int32_t* acc, size_t n) {
    const uint32_t m = team::reduce(long(n), uint32_t(0), [=](long lo, long hi, uint32_t& top) {
        uint32_t m = 0;
#pragma omp simd reduction(max : m)
        for (long i = lo; i < hi; ++i) {
            const uint32_t a = uint32_t(acc[i] < 0 ? -acc[i] : acc[i]);
            m = a > m ? a : m;
        }
        top = m;
    }, [](uint32_t a, uint32_t b) { return std::max(a, b); }, 65537);
    return shift_of_max(m);
}

// round_shift(a, s) where s > 0, else a, clamped. Branch-free (shifts by s and s - 1, or 0 and 0
// with the rounding bit masked off), so that loops over a tensor vectorize.
__attribute__((always_inline)) inline int requant_value(int32_t a, int s) {
    const int up = s > 0;
    const int32_t r = (a >> (up ? s : 0)) + ((a >> (up ? s - 1 : 0)) & up);
    return clamp127(int(r));
}
// the same, then the ReLU: an activation in [0, 127]
__attribute__((always_inline)) inline uint8_t requant_relu(int32_t a, int s) { return uint8_t(std::max(requant_value(a, s), 0)); }

// ---- the dot product every layer is made of: activations (uint8 in [0, 127], or int8
// errors) x int8 weights -> int32 ----

// S::sum of the dot products a[j] . w (j < R) of n >= S::BYTES bytes, in S's vectors: the last
// vector ends at n, overlapping the one before, and its overlapping bytes of w are zeroed
template <class S, class A, int R>
__attribute__((always_inline)) inline void dot_vec(int32_t out[R], const A* const a[R], const int8_t* __restrict w, int n) {
    typename S::A acc[R];
    for (int j = 0; j < R; ++j) acc[j] = S::zero();
    int i = 0;
    if constexpr (staged<S>::value) {  // two vectors at a time, each stage for all their dps
        for (; i + 2 * S::BYTES <= n; i += 2 * S::BYTES) {
            typename S::B wv[2];
            typename S::U av[2][R];
            typename S::T t[2][R];
            for (int u = 0; u < 2; ++u) {
                wv[u] = S::load(w + i + u * S::BYTES);
                for (int j = 0; j < R; ++j) av[u][j] = as_u<S>(S::load(a[j] + i + u * S::BYTES));
            }
            for (int u = 0; u < 2; ++u)
                for (int j = 0; j < R; ++j) t[u][j] = S::mul(av[u][j], wv[u]);
            for (int u = 0; u < 2; ++u)
                for (int j = 0; j < R; ++j) t[u][j] = S::mla(t[u][j], av[u][j], wv[u]);
            for (int u = 0; u < 2; ++u)
                for (int j = 0; j < R; ++j) acc[j] = S::widen(acc[j], t[u][j]);
        }
    }
    for (; i + S::BYTES <= n; i += S::BYTES) {
        const typename S::B wv = S::load(w + i);
        for (int j = 0; j < R; ++j) acc[j] = dp_of<S, A>(acc[j], as_u<S>(S::load(a[j] + i)), wv);
    }
    if (i < n) {
        const int last = n - S::BYTES;
        const typename S::B wv = S::keep_top(S::load(w + last), n - i);
        for (int j = 0; j < R; ++j) acc[j] = dp_of<S, A>(acc[j], as_u<S>(S::load(a[j] + last)), wv);
    }
    for (int j = 0; j < R; ++j) out[j] = S::sum(acc[j]);
}

template <class A>
__attribute__((always_inline)) inline int32_t dot(const A* __restrict a, const int8_t* __restrict w, int n) {
#if ZOBENCH_I8_WIDEST
    if (n >= Vec<WIDEST>::BYTES) {
        const A* rows[1] = {a};
        int32_t s;
        dot_vec<Vec<WIDEST>, A, 1>(&s, rows, w, n);
        return s;
    }
#endif
    int32_t s = 0;
#pragma omp simd reduction(+ : s)
    for (int k = 0; k < n; ++k) s += int32_t(a[k]) * int32_t(w[k]);
    return s;
}

// out[j] = a_j . w for four activation rows: each weight load feeds four images (FC forward)
__attribute__((always_inline)) inline void dot4(int32_t out[4], const uint8_t* const a[4], const int8_t* __restrict w,
                                                int n) {
#if ZOBENCH_I8_WIDEST
    if (n >= Vec<WIDEST>::BYTES) return dot_vec<Vec<WIDEST>, uint8_t, 4>(out, a, w, n);
#endif
    for (int j = 0; j < 4; ++j) out[j] = dot(a[j], w, n);
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
