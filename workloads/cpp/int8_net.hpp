// The INT8 network of zobench-train: any network of the description's layer kinds (models.py),
// without biases, trained NITI-style with
// int8 weights, activations and errors and one power-of-two exponent per tensor
// (docs/int8.md; workloads/int8.py is the reference it agrees with bit for bit).
//
// Buffers are what the paper's Eqs. 13-15 count, but for one accumulator: int8 parameters; per layer an int8
// activation, and the int32 accumulator it is requantized from, shared by the layers (each is
// requantized before the next runs, so the largest is all they need); for the BP part an int32
// gradient accumulator per weight (int64 for the convolutions, summed over B*H*W), and int8
// errors with their int32 accumulators. The kernels add padded inputs and errors, repacked
// weights and, for BP through the convolutions (and pointwise layers), per-thread scratch of
// their weight gradient. A pointwise layer's global max is fused into the layer: its
// accumulators are never stored, only each cloud's and channel's maximum (and, for BP, that
// of every block of points).
// All are allocated once, in the constructor, and buffer_bytes counts them all. Each
// activation is uint8: a ReLU output or pixel >> 1, so in [0, 127]; only a point cloud's input
// coordinates are signed int8 held in that buffer (the first layer reads them as such).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"
#include "conv_grad.hpp"
#include "int8.hpp"
#include "pool.hpp"
#include "sha256.hpp"
#include "zrng.hpp"

namespace int8 {

constexpr int padded(int k) { return (k + 15) / 16 * 16; }

// ---- convolution 5x5, stride 1, padding 2 (input pre-padded): one im2col row of patches
// per output row, then a dot product per (pixel, output channel) ----
template <int C, int OC, int H, int W, class A>
inline void conv_forward(int32_t* acc, const A* inpad, const int8_t* wp /* [OC][padded(C*25)] */, int B) {
    constexpr int K = C * 25, KP = padded(K), HP = H + 4, WP = W + 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
            alignas(64) A patch[W][KP];
            for (int x = 0; x < W; ++x) {
                for (int ic = 0; ic < C; ++ic)
                    for (int kh = 0; kh < 5; ++kh) {
                        const A* row = inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP + x;
                        for (int kw = 0; kw < 5; ++kw) patch[x][(ic * 5 + kh) * 5 + kw] = row[kw];
                    }
                for (int k = K; k < KP; ++k) patch[x][k] = 0;
            }
            for (int oc = 0; oc < OC; ++oc) {
                int32_t* o = acc + ((size_t(b) * OC + oc) * H + h) * W;
                for (int x = 0; x < W; ++x) o[x] = dot(patch[x], wp + oc * KP, KP);
            }
        }
}

// lanes of a VNNI convolution's accumulator vector: 8 (ymm) for up to 8 output channels, else 16 (zmm)
constexpr int vnni_lanes(int OC) { return OC <= 8 ? 8 : 16; }

#if ZOBENCH_VNNI
// x86 with VNNI: vpdpbusd adds four uint8 x int8 products into each int32 lane. The output
// channels are the lanes (8 in a ymm for conv1, 16 in a zmm for conv2), and each tap row of
// 5 is read as two groups of 4 input bytes (kw 0-3, 4-7; the weights of kw 5-7 are zero),
// broadcast straight from the padded input: no im2col. P neighbouring pixels accumulate in
// registers. wv: [C][5][2][L][4] int8 (vnni_weights).

template <int C, int OC, int L>   // lanes oc >= OC stay 0
inline void vnni_weights(int8_t* wv, const int8_t* w) {
    std::memset(wv, 0, size_t(C) * 5 * 2 * L * 4);
    for (int oc = 0; oc < OC; ++oc)
        for (int ic = 0; ic < C; ++ic)
            for (int kh = 0; kh < 5; ++kh)
                for (int kw = 0; kw < 5; ++kw)
                    wv[(((ic * 5 + kh) * 2 + kw / 4) * L + oc) * 4 + kw % 4] = w[((oc * C + ic) * 5 + kh) * 5 + kw];
}

template <int OC>
struct Lanes;
template <>
struct Lanes<8> {
    using V = __m256i;
    static V zero() { return _mm256_setzero_si256(); }
    static V load(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    static V dp(V acc, uint32_t a4, V w) { return _mm256_dpbusd_epi32(acc, _mm256_set1_epi32(int(a4)), w); }
    static void store(int32_t* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
template <>
struct Lanes<16> {
    using V = __m512i;
    static V zero() { return _mm512_setzero_si512(); }
    static V load(const int8_t* p) { return _mm512_loadu_si512(p); }
    static V dp(V acc, uint32_t a4, V w) { return _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(int(a4)), w); }
    static void store(int32_t* p, V v) { _mm512_storeu_si512(p, v); }
};

template <int C, int OC, int L, int H, int W, int P>
__attribute__((always_inline)) inline void vnni_tile(int32_t* out, const uint8_t* in, const int8_t* wv, int h, int x0) {
    using S = Lanes<L>;
    constexpr int HP = H + 4, WP = W + 4;
    typename S::V acc[P];
    for (int p = 0; p < P; ++p) acc[p] = S::zero();
    for (int ic = 0; ic < C; ++ic)
        for (int kh = 0; kh < 5; ++kh) {
            const uint8_t* row = in + (ic * HP + h + kh) * WP + x0;
            for (int g = 0; g < 2; ++g) {
                const typename S::V w = S::load(wv + ((ic * 5 + kh) * 2 + g) * L * 4);
                for (int p = 0; p < P; ++p) {
                    uint32_t a4;
                    std::memcpy(&a4, row + p + 4 * g, 4);
                    acc[p] = S::dp(acc[p], a4, w);
                }
            }
        }
    alignas(64) int32_t tmp[P][L];
    for (int p = 0; p < P; ++p) S::store(tmp[p], acc[p]);
    for (int oc = 0; oc < OC; ++oc)
        for (int p = 0; p < P; ++p) out[(oc * H + h) * W + x0 + p] = tmp[p][oc];
}

// the input must be readable 3 bytes past its end (kw 5-7 of the last pixel)
template <int C, int OC, int H, int W>
inline void conv_forward_vnni(int32_t* acc, const uint8_t* inpad, const int8_t* wv, int B) {
    constexpr int L = vnni_lanes(OC), P = 7;
    static_assert(W % P == 0, "rows are whole tiles");
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int x = 0; x < W; x += P)
                vnni_tile<C, OC, L, H, W, P>(acc + size_t(b) * OC * H * W, inpad + size_t(b) * C * (H + 4) * (W + 4), wv, h, x);
}
#endif

// weights [OC][K] -> [OC][padded(K)], zero tail
inline void pad_weights(int8_t* wp, const int8_t* w, int OC, int K) {
    const int KP = padded(K);
    for (int oc = 0; oc < OC; ++oc) {
        std::memcpy(wp + oc * KP, w + oc * K, size_t(K));
        std::memset(wp + oc * KP + K, 0, size_t(KP - K));
    }
}

// a forward convolution's int32 accumulators: its weights repacked for the kernel (into wk,
// conv_packed_size(C, OC) bytes), then the kernel
constexpr int conv_packed_size(int C, int OC) { return VNNI ? C * 5 * 2 * vnni_lanes(OC) * 4 : OC * padded(C * 25); }

template <int C, int OC, int H, int W>
inline void conv_forward_packed(int32_t* acc, const uint8_t* inpad, int8_t* wk, const int8_t* w, int B) {
#if ZOBENCH_VNNI
    vnni_weights<C, OC, vnni_lanes(OC)>(wk, w);
    conv_forward_vnni<C, OC, H, W>(acc, inpad, wk, B);
#else
    pad_weights(wk, w, OC, C * 25);
    conv_forward<C, OC, H, W>(acc, inpad, wk, B);
#endif
}

// conv [OC][C][5][5] -> the input-gradient convolution's [C][OC][5][5] flipped, padded
inline void flip_weights_padded(int8_t* wf, const int8_t* w, int C, int OC) {
    const int KP = padded(OC * 25);
    std::memset(wf, 0, size_t(C) * KP);
    for (int oc = 0; oc < OC; ++oc)
        for (int ic = 0; ic < C; ++ic)
            for (int t = 0; t < 25; ++t) wf[ic * KP + oc * 25 + 24 - t] = w[(oc * C + ic) * 25 + t];
}

// requantize a conv output, ReLU, and 2x2 max-pool into `pooled` (pad = its zero border);
// `out` (the pre-pool activation, which only BP through the layer needs) may be null.
// Requantization and ReLU are monotonic, so the pool takes the max of the accumulators.
// Returns the exponent increment.
inline int requant_relu_pool(uint8_t* out, uint8_t* pooled, int pad, const int32_t* acc, int BC, int H, int W) {
    const int s = requant_shift(acc, size_t(BC) * H * W);
    const int OH = H / 2, OW = W / 2, PH = OH + 2 * pad, PW = OW + 2 * pad;
    auto act = [s](int32_t a) { return requant_relu(a, s); };
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < BC; ++bc) {
        if (out)
            for (int i = 0; i < H * W; ++i) out[size_t(bc) * H * W + i] = act(acc[size_t(bc) * H * W + i]);
        for (int h = 0; h < OH; ++h)
            for (int x = 0; x < OW; ++x) {
                const int32_t* p = acc + (size_t(bc) * H + 2 * h) * W + 2 * x;
                pooled[(size_t(bc) * PH + h + pad) * PW + x + pad] = act(std::max(std::max(p[0], p[1]), std::max(p[W], p[W + 1])));
            }
    }
    return std::max(s, 0);
}

// requantize an FC output (ReLU unless it is the logits); returns the exponent increment
template <class T>
inline int requant_to(T* out, const int32_t* acc, size_t n, bool relu) {
    const int s = requant_shift(acc, n);
    for (size_t i = 0; i < n; ++i) out[i] = T(relu ? std::max(requant_value(acc[i], s), 0) : requant_value(acc[i], s));
    return std::max(s, 0);
}

inline void fc_forward(int32_t* acc, const uint8_t* in, const int8_t* w, int B, int I, int O) {
    const int BB = (B + 3) / 4;  // blocks of four images; the last block repeats its final image
#pragma omp parallel for collapse(2) schedule(static) if (size_t(B) * I * O > (1u << 18))
    for (int bb = 0; bb < BB; ++bb)
        for (int o = 0; o < O; ++o) {
            const uint8_t* a[4];
            for (int j = 0; j < 4; ++j) a[j] = in + size_t(std::min(4 * bb + j, B - 1)) * I;
            int32_t s[4];
            dot4(s, a, w + size_t(o) * I, I);
            for (int j = 0; j < 4 && 4 * bb + j < B; ++j) acc[size_t(4 * bb + j) * O + o] = s[j];
        }
}

// dw[o][i] += sum_b err[b][o] * in[b][i]; G: int32, or int64 where B counts points
template <class G, class A>
inline void fc_weight_grad(G* dw, const int8_t* err, const A* in, int B, int I, int O) {
#pragma omp parallel for schedule(static)
    for (int o = 0; o < O; ++o)
        for (int b = 0; b < B; ++b) {
            const int32_t e = err[size_t(b) * O + o];
            if (e == 0) continue;
            const A* x = in + size_t(b) * I;
            G* row = dw + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) row[i] += G(e * int32_t(x[i]));
        }
}

// eacc[b][i] = sum_o err[b][o] * w[o][i]
inline void fc_input_grad(int32_t* eacc, const int8_t* err, const int8_t* w, int B, int I, int O) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) {
        int32_t* row = eacc + size_t(b) * I;
        std::fill(row, row + I, 0);
        for (int o = 0; o < O; ++o) {
            const int32_t e = err[size_t(b) * O + o];
            if (e == 0) continue;
            const int8_t* wr = w + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) row[i] += e * int32_t(wr[i]);
        }
    }
}

// requantized error, kept only where the layer's input (a ReLU output) is positive
inline void error_through_relu(int8_t* err, const int32_t* eacc, const uint8_t* act, size_t n) {
    const int s = requant_shift(eacc, n);
    for (size_t i = 0; i < n; ++i) err[i] = act[i] > 0 ? int8_t(requant_value(eacc[i], s)) : int8_t(0);
}

// the requantized error of a pooled output, routed to the first maximum of its window where
// that (ReLU) value is positive
inline void error_through_pool(int8_t* din, const int32_t* eacc, const uint8_t* in, int BC, int H, int W) {
    const int s = requant_shift(eacc, size_t(BC) * (H / 2) * (W / 2));
    maxpool_backward(din, in, BC, H, W, [&](size_t o, uint8_t v) {
        return v > 0 ? int8_t(requant_value(eacc[o], s)) : int8_t(0);
    });
}

// dw[oc][ic][kh][kw] += sum_{b,h,x} err[b][oc][h][x] * inpad[b][ic][h+kh][x+kw]. Per image,
// each of the C*25 taps' shifted input planes is made contiguous once, and then every
// weight gradient is a dot product of an error plane with a shifted plane: dot4 takes four
// taps per error load (vpdpbusd on VNNI). int32 per image (at most H*W*127^2), int64 over
// the batch, summed over threads at the end. Scratch: per thread, the planes
// (conv_grad_planes bytes) and its own sums (conv_grad_sums int64), for at most `threads`.
constexpr size_t conv_grad_planes(int C, int H, int W) { return size_t(C) * 25 * H * W; }
constexpr size_t conv_grad_sums(int C, int OC) { return size_t(OC) * C * 25; }

template <int C, int OC, int H, int W>
inline void conv_weight_grad(int64_t* dw, const int8_t* err, const uint8_t* inpad, int B, uint8_t* planes_scratch,
                             size_t planes_stride, int64_t* sums_scratch, size_t sums_stride, int threads) {
    constexpr int HP = H + 4, WP = W + 4, T = C * 25, N = H * W;
#pragma omp parallel num_threads(threads)
    {
        uint8_t* planes = planes_scratch + size_t(omp_get_thread_num()) * planes_stride;
        int64_t* local = sums_scratch + size_t(omp_get_thread_num()) * sums_stride;
        std::fill(local, local + OC * T, int64_t(0));
#pragma omp for schedule(static)
        for (int b = 0; b < B; ++b) {
            for (int t = 0; t < T; ++t) {
                const int ic = t / 25, kh = t / 5 % 5, kw = t % 5;
                for (int h = 0; h < H; ++h)
                    std::memcpy(planes + size_t(t) * N + h * W, inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP + kw, W);
            }
            for (int oc = 0; oc < OC; ++oc) {
                const int8_t* e = err + (size_t(b) * OC + oc) * N;
                for (int t = 0; t < T; t += 4) {
                    const uint8_t* a[4];
                    for (int j = 0; j < 4; ++j) a[j] = planes + size_t(std::min(t + j, T - 1)) * N;
                    int32_t s[4];
                    dot4(s, a, e, N);
                    for (int j = 0; j < 4 && t + j < T; ++j) local[size_t(oc) * T + t + j] += s[j];
                }
            }
        }
#pragma omp critical
        for (int i = 0; i < OC * T; ++i) dw[i] += local[i];
    }
}

// ---- the runtime-sized kernels, for shapes without a fast path (conv_forward_any: conv_grad.hpp) ----

// acc[r][o] = in[r] . w[o] for signed inputs (a point cloud's few coordinates): each input
// value times a row of wt, w transposed to [I][O] (I * O bytes), the output channels as SIMD
// lanes -- fc_input_grad's product with wt in place of the error's weights
inline void rows_forward_signed(int32_t* acc, const int8_t* in, int8_t* wt, const int8_t* w, long R, int I, int O) {
    transpose(wt, w, O, I);
    fc_input_grad(acc, in, wt, int(R), O, I);
}

// acc[r][o] = in[r] . w[o] for the R rows of a pointwise layer (uint8 activations). With VNNI,
// a GEMM whose output channels are the lanes: per group of four inputs, each row's four bytes
// are broadcast against wq, the weights packed [C/4][O][4] (zero past C), and vpdpbusd adds
// the four products into each of 32 output channels (two zmm) of 6 rows held in registers;
// elsewhere (and for O not a multiple of 32) fc_forward's dot products. wq: pointwise_packed_size.
constexpr int PW_MR = 6, PW_NR = 32;
inline size_t pointwise_packed_size(int C, int O) { return size_t(C + 3) / 4 * 4 * O; }

#if ZOBENCH_VNNI
// a[i][0..1] = sum_q sum_k x[i][q * step + k] * wq[(q * O + o0 + j) * 4 + k] for the PW_NR
// lanes j: the register tile of the pointwise forward (rows x output channels, step 4) and of
// its weight gradient (input channels x output channels, four rows a group; step 4 * C)
__attribute__((always_inline)) inline void vnni_tile(__m512i a[PW_MR][2], const uint8_t* const x[PW_MR], size_t step,
                                                     const int8_t* wq, int O, int o0, int CQ) {
    for (int i = 0; i < PW_MR; ++i) a[i][0] = a[i][1] = _mm512_setzero_si512();
    for (int q = 0; q < CQ; ++q) {
        const int8_t* wv = wq + (size_t(q) * O + o0) * 4;
        const __m512i w0 = _mm512_loadu_si512(wv), w1 = _mm512_loadu_si512(wv + 64);
        for (int i = 0; i < PW_MR; ++i) {
            uint32_t x4;
            std::memcpy(&x4, x[i] + q * step, 4);
            const __m512i v = _mm512_set1_epi32(int(x4));
            a[i][0] = _mm512_dpbusd_epi32(a[i][0], v, w0);
            a[i][1] = _mm512_dpbusd_epi32(a[i][1], v, w1);
        }
    }
}

// w [O][C] -> wq [C/4][O][4], zero past C
inline void pack_quads(int8_t* wq, const int8_t* w, int C, int O) {
    for (int q = 0; q < (C + 3) / 4; ++q)
        for (int o = 0; o < O; ++o)
            for (int k = 0; k < 4; ++k) wq[(size_t(q) * O + o) * 4 + k] = 4 * q + k < C ? w[size_t(o) * C + 4 * q + k] : 0;
}
#endif

inline void pointwise_forward(int32_t* acc, const uint8_t* in, int8_t* wq, const int8_t* w, long R, int C, int O) {
#if ZOBENCH_VNNI
    if (O % PW_NR == 0) {
        pack_quads(wq, w, C, O);
        const long RB = (R + PW_MR - 1) / PW_MR;
#pragma omp parallel for collapse(2) schedule(static)
        for (long rb = 0; rb < RB; ++rb)
            for (int o0 = 0; o0 < O; o0 += PW_NR) {
                const long r0 = rb * PW_MR;
                const int mr = int(std::min<long>(PW_MR, R - r0));
                const uint8_t* x[PW_MR];
                for (int i = 0; i < PW_MR; ++i) x[i] = in + size_t(r0 + std::min(i, mr - 1)) * C;  // a short block repeats its last row
                __m512i a[PW_MR][2];  // bytes past C (the next row, or the buffer's slack) meet zero weights
                vnni_tile(a, x, 4, wq, O, o0, (C + 3) / 4);
                for (int i = 0; i < mr; ++i) {
                    int32_t* out = acc + size_t(r0 + i) * O + o0;
                    _mm512_storeu_si512(out, a[i][0]);
                    _mm512_storeu_si512(out + 16, a[i][1]);
                }
            }
        return;
    }
#endif
    fc_forward(acc, in, w, int(R), C, O);
}

// dw[o][c] += sum_r d[r][o] in[r][c] over the R = B*N rows of a pointwise layer. With VNNI,
// pointwise_forward's GEMM with the rows as its inner dimension: the threads split the rows,
// PW_RB at a time, packed four rows a group (the inputs to xq [PW_RB/4][C][4], the errors to
// dq [PW_RB/4][O][4], zero past the last row), and vnni_tile sums each tile of PW_MR input x
// PW_NR output channels over them in int32, exact as PW_RB * 127^2 < 2^31, into the thread's
// int64 sums [C][O], added up at the end. Scratch per thread: pointwise_grad_pack bytes and
// C * O int64, for at most `threads`. Elsewhere fc_weight_grad.
constexpr int PW_RB = 256;
inline size_t pointwise_grad_pack(int C, int O) { return size_t(PW_RB) * (C + O); }

inline void pointwise_weight_grad(int64_t* dw, const int8_t* d, const uint8_t* in, uint8_t* pack_scratch,
                                  size_t pack_stride, int64_t* sums_scratch, size_t sums_stride, int threads, long R,
                                  int C, int O) {
#if ZOBENCH_VNNI
    if (O % PW_NR == 0) {
        const long NB = (R + PW_RB - 1) / PW_RB;
#pragma omp parallel num_threads(threads)
        {
            uint8_t* xq = pack_scratch + size_t(omp_get_thread_num()) * pack_stride;
            int8_t* dq = reinterpret_cast<int8_t*>(xq + size_t(PW_RB) * C);
            int64_t* local = sums_scratch + size_t(omp_get_thread_num()) * sums_stride;
            std::fill(local, local + size_t(C) * O, int64_t(0));
#pragma omp for schedule(static)
            for (long nb = 0; nb < NB; ++nb) {
                const long r0 = nb * PW_RB;
                const int rn = int(std::min<long>(PW_RB, R - r0)), QN = (rn + 3) / 4;
                for (int r = 0; r < 4 * QN; ++r) {
                    const int q = r / 4, k = r % 4;
                    for (int c = 0; c < C; ++c) xq[(size_t(q) * C + c) * 4 + k] = r < rn ? in[size_t(r0 + r) * C + c] : 0;
                    for (int o = 0; o < O; ++o) dq[(size_t(q) * O + o) * 4 + k] = r < rn ? d[size_t(r0 + r) * O + o] : 0;
                }
                for (int c0 = 0; c0 < C; c0 += PW_MR) {
                    const int mc = std::min(PW_MR, C - c0);
                    const uint8_t* x[PW_MR];
                    for (int i = 0; i < PW_MR; ++i) x[i] = xq + size_t(c0 + std::min(i, mc - 1)) * 4;  // a short block repeats its last channel
                    for (int o0 = 0; o0 < O; o0 += PW_NR) {
                        __m512i a[PW_MR][2];
                        vnni_tile(a, x, size_t(4) * C, dq, O, o0, QN);
                        for (int i = 0; i < mc; ++i) {
                            int64_t* row = local + size_t(c0 + i) * O + o0;
                            for (int h = 0; h < 4; ++h) {
                                const __m256i part = h % 2 ? _mm512_extracti64x4_epi64(a[i][h / 2], 1) : _mm512_castsi512_si256(a[i][h / 2]);
                                _mm512_storeu_si512(row + 8 * h, _mm512_add_epi64(_mm512_loadu_si512(row + 8 * h), _mm512_cvtepi32_epi64(part)));
                            }
                        }
                    }
                }
            }
        }
#pragma omp parallel for schedule(static)
        for (int o = 0; o < O; ++o)
            for (int t = 0; t < threads; ++t)
                for (int c = 0; c < C; ++c) dw[size_t(o) * C + c] += sums_scratch[size_t(t) * sums_stride + size_t(c) * O + o];
        return;
    }
#endif
    fc_weight_grad(dw, d, in, int(R), C, O);
}

// A pointwise layer and its global max, fused: its [B*N, O] accumulators are never stored,
// only each cloud's and channel's largest, mx [B][O], and the whole tensor's range, which sets
// the shift exactly as requant_shift would. Requantization and ReLU are monotonic, so the
// pooled value is that of the largest accumulator. BP through the max needs each maximum's
// point, which `argmax` (may be null) receives: the first point whose requantized value is
// the maximum, as the reference routes it, which may come before the first largest
// accumulator (requantization maps neighbours to one value). So the kernel also keeps the
// largest accumulator of every PW_GB points, `blocks` [B][O][gmax_blocks(N)]; once the shift
// is known, the first block reaching the maximum is recomputed point by point up to the
// first that does. Returns the exponent increment.
constexpr int PW_GB = 8 * PW_MR;
inline int gmax_blocks(int N) { return (N + PW_GB - 1) / PW_GB; }

inline int pointwise_gmax_forward(uint8_t* pooled, int* argmax, int32_t* mx, int32_t* blocks, const uint8_t* in,
                                  int8_t* wq, const int8_t* w, int B, int N, int C, int O) {
    const int NG = gmax_blocks(N);
    int32_t lo = INT32_MAX, hi = INT32_MIN;
#if ZOBENCH_VNNI
    if (O % PW_NR == 0) {
        pack_quads(wq, w, C, O);
#pragma omp parallel for collapse(2) schedule(static) reduction(min : lo) reduction(max : hi)
        for (int b = 0; b < B; ++b)
            for (int o0 = 0; o0 < O; o0 += PW_NR) {
                __m512i top[2] = {_mm512_set1_epi32(INT32_MIN), _mm512_set1_epi32(INT32_MIN)}, bot[2];
                bot[0] = bot[1] = _mm512_set1_epi32(INT32_MAX);
                for (int g = 0; g < NG; ++g) {
                    __m512i blk[2] = {_mm512_set1_epi32(INT32_MIN), _mm512_set1_epi32(INT32_MIN)};
                    for (int n0 = g * PW_GB; n0 < std::min(N, (g + 1) * PW_GB); n0 += PW_MR) {
                        const int mr = std::min(PW_MR, N - n0);
                        const uint8_t* x[PW_MR];  // a short block repeats its last row: max and min are unchanged
                        for (int i = 0; i < PW_MR; ++i) x[i] = in + (size_t(b) * N + n0 + std::min(i, mr - 1)) * C;
                        __m512i a[PW_MR][2];
                        vnni_tile(a, x, 4, wq, O, o0, (C + 3) / 4);
                        for (int i = 0; i < PW_MR; ++i)
                            for (int h = 0; h < 2; ++h) {
                                blk[h] = _mm512_max_epi32(blk[h], a[i][h]);
                                bot[h] = _mm512_min_epi32(bot[h], a[i][h]);
                            }
                    }
                    for (int h = 0; h < 2; ++h) {
                        top[h] = _mm512_max_epi32(top[h], blk[h]);
                        if (blocks) {
                            alignas(64) int32_t t[16];
                            _mm512_store_si512(t, blk[h]);
                            for (int j = 0; j < 16; ++j) blocks[(size_t(b) * O + o0 + 16 * h + j) * NG + g] = t[j];
                        }
                    }
                }
                _mm512_storeu_si512(mx + size_t(b) * O + o0, top[0]);
                _mm512_storeu_si512(mx + size_t(b) * O + o0 + 16, top[1]);
                hi = std::max(hi, _mm512_reduce_max_epi32(_mm512_max_epi32(top[0], top[1])));
                lo = std::min(lo, _mm512_reduce_min_epi32(_mm512_min_epi32(bot[0], bot[1])));
            }
    } else
#endif
    {
#pragma omp parallel for collapse(2) schedule(static) reduction(min : lo) reduction(max : hi)
        for (int b = 0; b < B; ++b)
            for (int o = 0; o < O; ++o) {
                int32_t top = INT32_MIN;
                for (int g = 0; g < NG; ++g) {
                    int32_t blk = INT32_MIN;
                    for (int p = g * PW_GB; p < std::min(N, (g + 1) * PW_GB); ++p) {
                        const int32_t v = dot(in + (size_t(b) * N + p) * C, w + size_t(o) * C, C);
                        blk = std::max(blk, v);
                        lo = std::min(lo, v);
                    }
                    if (blocks) blocks[(size_t(b) * O + o) * NG + g] = blk;
                    top = std::max(top, blk);
                }
                mx[size_t(b) * O + o] = top;
                hi = std::max(hi, top);
            }
    }
    const int s = shift_of_max(uint32_t(std::max<int64_t>(hi, -int64_t(lo))));
    auto act = [s](int32_t a) { return requant_relu(a, s); };
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < size_t(B) * O; ++i) {
        const uint8_t m = pooled[i] = act(mx[i]);
        if (!argmax) continue;
        const int32_t* blk = blocks + i * NG;
        const int g = int(std::find_if(blk, blk + NG, [&](int32_t v) { return act(v) == m; }) - blk);
        const size_t b = i / O, o = i % O;
        int p = g * PW_GB;
        while (act(dot(in + (b * N + p) * C, w + o * C, C)) != m) ++p;
        argmax[i] = p;
    }
    return std::max(s, 0);
}

// requantize a pointwise output, ReLU, and take the max over the N points into `pooled`.
// Requantization and ReLU are monotonic, so the max of the accumulators gives the pooled
// value; BP through the max needs each maximum's point, which `argmax` (may be null)
// receives: the first maximum of the requantized values (ties there are not ties of the
// accumulators), as the reference routes it. Returns the exponent increment.
inline int requant_relu_gmax(uint8_t* pooled, int* argmax, const int32_t* acc, int B, int N, int O) {
    const int s = requant_shift(acc, size_t(B) * N * O);
    auto act = [s](int32_t a) { return requant_relu(a, s); };
    constexpr int CB = 256;  // the running maxima of CB channels, while the rows stream past in order
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
        for (int c0 = 0; c0 < O; c0 += CB) {
            const int nc = std::min(CB, O - c0);
            const int32_t* first = acc + size_t(b) * N * O + c0;
            uint8_t* p = pooled + size_t(b) * O + c0;
            if (argmax) {
                uint8_t m[CB];
                int at[CB] = {};
                for (int c = 0; c < nc; ++c) m[c] = act(first[c]);
                for (int n = 1; n < N; ++n) {
                    const int32_t* row = first + size_t(n) * O;
#pragma omp simd
                    for (int c = 0; c < nc; ++c) {
                        const uint8_t v = act(row[c]);
                        const bool gt = v > m[c];
                        m[c] = gt ? v : m[c];
                        at[c] = gt ? n : at[c];
                    }
                }
                std::copy(m, m + nc, p);
                std::copy(at, at + nc, argmax + size_t(b) * O + c0);
            } else {
                int32_t m[CB];
                std::copy(first, first + nc, m);
                for (int n = 1; n < N; ++n) {
                    const int32_t* row = first + size_t(n) * O;
#pragma omp simd
                    for (int c = 0; c < nc; ++c) m[c] = std::max(m[c], row[c]);
                }
                for (int c = 0; c < nc; ++c) p[c] = act(m[c]);
            }
        }
    return std::max(s, 0);
}

// the signs of both losses' differences beside the one the update used
struct StepResult : StepRecord<int> {
    int sign_float = 0, sign_integer = 0;
    void add_to(json& rec) const {
        StepRecord::add_to(rec);
        if (!zo) return;
        rec["sign_float"] = sign_float;
        rec["sign_integer"] = sign_integer;
    }
};

struct Net {
    const Arch& a;
    int B, n, first_bp, scale;
    size_t n_zo, n_bp;
    std::string zo_loss;
    std::vector<size_t> off;      // per layer, its weight's offset in q
    std::vector<int8_t> q;        // every layer's weights, no biases
    std::vector<int> exps;        // per layer, its weights' exponent
    int logit_exp[2] = {};        // each pass's logits' exponent
    ActivationPlan<uint8_t, int8_t> act;
    // the int32 accumulators a layer's activation is requantized from (only their pooled maxima
    // where fused_gmax): one buffer for every layer, as each is requantized before the next runs
    std::vector<int32_t> acc;
    std::vector<int8_t> wk, wflip;          // a convolution's or pointwise layer's repacked weights, a convolution's flipped (the largest)
    std::vector<int> labels;
    // the BP part: gradient accumulators (int64 where a weight sums over points or pixels),
    // errors of each BP layer's activation, their int32 accumulators at its input, and a
    // conv2d's error padded for its input gradient
    std::vector<std::vector<int32_t>> g32, eacc;
    std::vector<std::vector<int64_t>> g64;
    std::vector<std::vector<int8_t>> err;   // of a global max's output where one follows (pointwise_gmax_backward)
    std::vector<std::vector<int>> argmax;   // per BP layer with a global max, per pass, each cloud's and channel's maximum point [B][O]
    std::vector<int8_t> errpad;
    std::vector<int32_t> gmax_max;          // a fused global max's block maxima, where BP reads its argmax
    // conv_weight_grad's and pointwise_weight_grad's per-thread scratch (fast-path convolutions
    // and, with VNNI, pointwise layers without a pool trained by BP): planes or packed rows, and sums
    int grad_threads = 0;
    size_t planes_stride = 0, sums_stride = 0;
    std::vector<uint8_t> grad_planes;
    std::vector<int64_t> grad_sums;

    // LeNet-5's convolutions run shape-specialised kernels (above); every other shape the
    // runtime-sized ones
    static bool fast(const Layer& L) {
        return L.kind == CONV2D && L.KH == 5 && L.KW == 5 && L.pad == 2 &&
               ((L.C == 1 && L.O == 6 && L.OH == 28 && L.OW == 28) || (L.C == 6 && L.O == 16 && L.OH == 14 && L.OW == 14));
    }

    // a pointwise layer with a global max, on uint8 inputs: pointwise_gmax_forward
    bool fused_gmax(int l) const {
        const Layer& L = a.layers[l];
        return L.kind == POINTWISE && L.pool == GLOBAL_MAX && l > 0;
    }

    Net(int batch, const Spec& s) : a(s.arch), B(batch), n(s.arch.n()), scale(s.h.zo_scale), zo_loss(s.zo_loss) {
        first_bp = first_bp_layer(s);
        size_t total = 0;
        for (const Layer& L : a.layers) off.push_back(total), total += L.w_size();
        n_zo = first_bp < n ? off[first_bp] : total;
        n_bp = total - n_zo;
        q.resize(total);
        const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_INIT, 1);
        for (size_t i = 0; i < total; ++i)
            q[i] = int8_t(int((((zrng::bits(key, uint64_t(i)) & 0xFFFFFFFFull) * 255ull) >> 32)) - 127);
        for (const Layer& L : a.layers) exps.push_back(init_exponent(L.fan_in(), L.O * L.KH * L.KW));
        const bool two = s.method == "elastic-zo";
        act.alloc(a, B, first_bp, two, 64);  // + slack: the VNNI kernel reads 3 bytes past a row
        // a pooled activation is kept only where BP reads it: requant_relu_pool pools the
        // accumulators; BP through a global max reads its argmax instead
        for (int l = 0; l < n; ++l)
            if ((l < first_bp && a.layers[l].pool != NO_POOL) || a.layers[l].pool == GLOBAL_MAX)
                std::vector<uint8_t>().swap(act.layer[l].own_out);
        labels.assign(B, 0);
        g32.resize(n), g64.resize(n), eacc.resize(n), err.resize(n), argmax.resize(n);
        size_t acc_size = 0, wk_size = 0, flip_size = 0, pad_size = 0;
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            acc_size = std::max(acc_size, size_t(B) * (fused_gmax(l) ? L.O : L.out_size()));
            if (fast(L)) wk_size = std::max(wk_size, size_t(conv_packed_size(L.C, L.O)));
            if (L.kind == POINTWISE) wk_size = std::max(wk_size, l > 0 ? pointwise_packed_size(L.C, L.O) : L.w_size());
            if (l < first_bp) continue;
            if (L.kind == FC) g32[l].assign(L.w_size(), 0);
            else g64[l].assign(L.w_size(), 0);
            err[l].assign(size_t(B) * (L.pool == GLOBAL_MAX ? L.O : L.out_size()), 0);
            if (L.pool == GLOBAL_MAX) argmax[l].assign(size_t(two ? 2 : 1) * B * L.O, 0);
            if (fused_gmax(l)) gmax_max.assign(size_t(B) * L.O * gmax_blocks(L.rows), 0);
            if (VNNI && L.kind == POINTWISE && l > 0 && L.pool == NO_POOL && L.O % PW_NR == 0) {
                grad_threads = omp_get_max_threads();
                planes_stride = std::max(planes_stride, pointwise_grad_pack(L.C, L.O));
                sums_stride = std::max(sums_stride, size_t(L.C) * L.O);
            }
            if (fast(L) && l <= 1 + first_bp) {
                grad_threads = omp_get_max_threads();
                planes_stride = std::max(planes_stride, conv_grad_planes(L.C, L.OH, L.OW));
                sums_stride = std::max(sums_stride, conv_grad_sums(L.C, L.O));
            }
            if (l == first_bp) continue;
            eacc[l].assign(size_t(B) * L.in_size(), 0);
            if (L.kind == CONV2D) {
                flip_size = std::max(flip_size, fast(L) ? size_t(L.C) * padded(L.O * 25) : L.w_size());
                pad_size = std::max(pad_size, size_t(B) * L.O * (L.OH + 2 * (L.KH - 1 - L.pad)) * (L.OW + 2 * (L.KW - 1 - L.pad)));
            }
        }
        acc.assign(acc_size, 0);
        wk.assign(wk_size, 0);
        wflip.assign(flip_size, 0);
        errpad.assign(pad_size, 0);
        grad_planes.assign(grad_threads * planes_stride, 0);
        grad_sums.assign(grad_threads * sums_stride, 0);
    }

    int8_t* Wt(int l) { return q.data() + off[l]; }
    uint8_t* in(int l, int k) { return act.in(l, l > 0 && l >= first_bp ? k : 0); }
    uint8_t* own_out(int l) { return act.layer[l].own_out.empty() ? nullptr : act.layer[l].own_out.data(); }
    int8_t* logits(int k) { return act.logits[k].data(); }
    int* Argmax(int l, int k) { return argmax[l].empty() ? nullptr : argmax[l].data() + size_t(k) * B * a.layers[l].O; }

    void forward(int b, int k) {
        int e = INPUT_EXP;
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            const bool last = l + 1 == n;
            int32_t* ac = acc.data();
            uint8_t* x = in(l, k);
            if (L.kind == CONV2D) {
                if (fast(L) && L.C == 1) conv_forward_packed<1, 6, 28, 28>(ac, x, wk.data(), Wt(l), b);
                else if (fast(L)) conv_forward_packed<6, 16, 14, 14>(ac, x, wk.data(), Wt(l), b);
                else conv_forward_any(ac, x, Wt(l), b, L.C, L.O, L.OH, L.OW, L.KH, L.KW, [](int) { return int32_t(0); });
            } else if (L.kind == POINTWISE && l == 0) {  // a cloud's coordinates are signed
                rows_forward_signed(ac, reinterpret_cast<const int8_t*>(x), wk.data(), Wt(l), long(b) * L.rows, L.C, L.O);
            } else if (fused_gmax(l)) {
                int32_t* blocks = gmax_max.empty() ? nullptr : gmax_max.data();
                e += exps[l] + pointwise_gmax_forward(in(l + 1, k), Argmax(l, k), ac, blocks, x, wk.data(), Wt(l), b, L.rows,
                                                      L.C, L.O);
                continue;
            } else if (L.kind == POINTWISE) {
                pointwise_forward(ac, x, wk.data(), Wt(l), long(b) * L.rows, L.C, L.O);
            } else {
                fc_forward(ac, x, Wt(l), b, L.C, L.O);
            }
            e += exps[l];
            const size_t count = size_t(b) * L.out_size();
            if (last) {
                logit_exp[k] = e + requant_to(logits(k), ac, count, false);
                break;
            }
            const Layer& N = a.layers[l + 1];
            uint8_t* next = in(l + 1, k);
            if (L.pool == MAX2X2) e += requant_relu_pool(own_out(l), next, N.pad, ac, b * L.O, L.OH, L.OW);
            else if (L.pool == GLOBAL_MAX) e += requant_relu_gmax(next, Argmax(l, k), ac, b, L.rows, L.O);
            else if (N.pad > 0) {
                e += requant_to(own_out(l), ac, count, L.relu);
                pad_rect(next, own_out(l), b * L.O, L.OH, L.OW, N.pad, N.pad);
            } else {
                e += requant_to(next, ac, count, L.relu);
            }
        }
    }

    // accumulate the BP layers' gradients for pass k (NITI's backward; int8.py Int8Engine.backward)
    void backward(int k) {
        ce_error(err[n - 1].data(), logits(k), logit_exp[k], labels.data(), B, a.classes);
        for (int l = n - 1; l >= first_bp; --l) {
            const Layer& L = a.layers[l];
            const int8_t* d = err[l].data();
            const uint8_t* x = in(l, k);
            if (L.kind == CONV2D && fast(L)) {
                auto grad = L.C == 1 ? conv_weight_grad<1, 6, 28, 28> : conv_weight_grad<6, 16, 14, 14>;
                grad(g64[l].data(), d, x, B, grad_planes.data(), planes_stride, grad_sums.data(), sums_stride, grad_threads);
            } else if (L.kind == CONV2D) {
                conv_weight_grad_any<int32_t, int64_t>(g64[l].data(), d, x, B, L.C, L.O, L.OH, L.OW, L.KH, L.KW);
            } else if (L.kind == POINTWISE && L.pool == GLOBAL_MAX) {
                int32_t* din = l == first_bp ? nullptr : eacc[l].data();
                if (l == 0)
                    pointwise_gmax_backward(din, g64[l].data(), static_cast<int64_t*>(nullptr), d, Argmax(l, k),
                                            reinterpret_cast<const int8_t*>(x), Wt(l), B, L.rows, L.C, L.O);
                else
                    pointwise_gmax_backward(din, g64[l].data(), static_cast<int64_t*>(nullptr), d, Argmax(l, k), x, Wt(l), B, L.rows, L.C, L.O);
            } else if (L.kind == POINTWISE && l == 0) {
                fc_weight_grad(g64[l].data(), d, reinterpret_cast<const int8_t*>(x), B * L.rows, L.C, L.O);
            } else if (L.kind == POINTWISE) {
                pointwise_weight_grad(g64[l].data(), d, x, grad_planes.data(), planes_stride, grad_sums.data(), sums_stride,
                                      grad_threads, long(B) * L.rows, L.C, L.O);
            } else {
                fc_weight_grad(g32[l].data(), d, x, B, L.C, L.O);
            }
            if (l == first_bp) break;
            int32_t* ea = eacc[l].data();
            if (L.kind == CONV2D) {  // a convolution of the error padded by kernel - 1 - padding, weights flipped
                pad_rect(errpad.data(), d, B * L.O, L.OH, L.OW, L.KH - 1 - L.pad, L.KW - 1 - L.pad);
                if (fast(L) && L.C == 6) {
                    flip_weights_padded(wflip.data(), Wt(l), L.C, L.O);
                    conv_forward<16, 6, 14, 14>(ea, errpad.data(), wflip.data(), B);
                } else {
                    flip_weights(wflip.data(), Wt(l), L.C, L.O, L.KH, L.KW);
                    conv_forward_any(ea, errpad.data(), wflip.data(), B, L.O, L.C, L.H, L.W, L.KH, L.KW,
                                     [](int) { return int32_t(0); });
                }
            } else if (L.pool != GLOBAL_MAX) {  // pointwise_gmax_backward made a global max's
                fc_input_grad(ea, d, Wt(l), B * L.rows, L.C, L.O);
            }
            const Layer& P = a.layers[l - 1];
            int8_t* dp = err[l - 1].data();
            const uint8_t* out = own_out(l - 1) ? own_out(l - 1) : x;
            const size_t count = size_t(B) * L.in_size();
            const int s = requant_shift(ea, count);
            auto pass = [&](size_t o, uint8_t v) { return !P.relu || v > 0 ? int8_t(requant_value(ea[o], s)) : int8_t(0); };
            if (P.pool == MAX2X2) maxpool_backward(dp, out, B * P.O, P.OH, P.OW, pass);
            else  // a global max's: of its output, x
                for (size_t i = 0; i < count; ++i) dp[i] = pass(i, out[i]);
        }
    }

    // The trainable state, as train.cpp's warm_up saves and restores it: the int8 weights are
    // all of it. The exponents never change after init; the gradient accumulators g32/g64 are
    // zeroed by every apply_gradient (bp_update ends every step that fills them); logit_exp,
    // the activations, errors, argmax and scratch are written by a step before it reads them.
    std::vector<int8_t>& trainable() { return q; }

    void bp_update(int epoch) {
        const int bits = grad_bits(epoch);
        for (int l = first_bp; l < n; ++l) {
            if (!g64[l].empty()) apply_gradient(Wt(l), g64[l].data(), g64[l].size(), bits);
            else apply_gradient(Wt(l), g32[l].data(), g32[l].size(), bits);
        }
    }

    void perturb(uint64_t key, int k, int epoch) {
        const uint64_t thr = sparsity_threshold(epoch);
        int8_t* w = q.data();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n_zo; ++i) w[i] = int8_t(clamp127(w[i] + k * zo_noise(key, i, scale, thr)));
    }

    // restore (+z) and update (-round(g z) to one bit) in one pass
    void zo_update(uint64_t key, int g, int epoch) {
        const uint64_t thr = sparsity_threshold(epoch);
        const int s = std::max(zo_update_shift(scale), 0);   // psto_shift by 0 is the identity
        int8_t* w = q.data();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n_zo; ++i) {
            const int z = zo_noise(key, i, scale, thr);
            const int r = psto_shift(g * z, s), d = r > 1 ? 1 : r < -1 ? -1 : r;
            w[i] = int8_t(clamp127(w[i] + z - d));
        }
    }

    // ---- the interface train() drives (fp32_net.hpp has the same) ----
    void load(const Split& split, const int* idx, int b) {
        // pixels >> 1 (in [0, 127]); coordinates to int8 at exponent -7 (int8.py quantize_points)
        load_batch(in(0, 0), labels.data(), a.layers[0], split, idx, b, [](uint8_t v) { return uint8_t(v >> 1); },
                   [](float v) { return uint8_t(int8_t(std::min(127.f, std::max(-127.f, std::floor(v * 128.f + 0.5f))))); });
    }

    static int sign(double v) { return (v > 0) - (v < 0); }

    // one step (workloads/methods.py int8_bp_step / int8_zo_step)
    StepResult step(const Spec&, uint64_t key, int epoch, double, double, PhaseClock& clock) {
        if (n_zo == 0) {
            forward(B, 0);
            clock.lap(FORWARD);
            const double loss = float_loss(logits(0), logit_exp[0], labels.data(), B, a.classes);
            clock.lap(LOSS);
            backward(0);
            clock.lap(BACKWARD);
            bp_update(epoch);
            clock.lap(BP_UPDATE);
            return {{loss}};
        }
        const bool bp = n_bp > 0;
        double lf[2];
        int64_t li[2];
        for (int j = 0; j < 2; ++j) {
            perturb(key, j == 0 ? 1 : -2, epoch);
            clock.lap(ZO_PERTURB);
            const int k = bp ? j : 0;
            forward(B, k);
            clock.lap(FORWARD);
            lf[j] = float_loss(logits(k), logit_exp[k], labels.data(), B, a.classes);
            li[j] = integer_loss(logits(k), logit_exp[k], labels.data(), B, a.classes);
            clock.lap(LOSS);
        }
        const int sf = sign(lf[0] - lf[1]), si = sign(double(li[0] - li[1]));
        const int g = zo_loss == "integer" ? si : sf;
        zo_update(key, g, epoch);
        clock.lap(ZO_UPDATE);
        if (bp) {
            backward(0);
            backward(1);
            clock.lap(BACKWARD);
            bp_update(epoch);
            clock.lap(BP_UPDATE);
        }
        return {{0.5 * (lf[0] + lf[1]), true, lf[0], lf[1], g}, sf, si};
    }

    void eval(int b, double& loss_sum, long& correct) {
        forward(b, 0);
        loss_sum += float_loss(logits(0), logit_exp[0], labels.data(), b, a.classes) * b;
        correct += count_correct(logits(0), labels.data(), b, a.classes);
    }

    size_t params_total() const { return q.size(); }
    size_t buffer_bytes() const {
        size_t bytes = act.bytes() + bytes_of(q, acc, gmax_max, wk, wflip, labels, errpad, grad_planes, grad_sums);
        for (int l = 0; l < n; ++l) bytes += bytes_of(g32[l], g64[l], eacc[l], err[l], argmax[l]);
        return bytes;
    }
    std::string weights_sha256() const {  // int8 weights, then each layer's exponent as int32 LE
        std::vector<uint8_t> bytes(q.begin(), q.end());
        for (int e : exps)
            for (int k = 0; k < 4; ++k) bytes.push_back(uint8_t(uint32_t(e) >> (8 * k)));
        return sha256_hex(bytes.data(), bytes.size());
    }
};

}  // namespace int8
