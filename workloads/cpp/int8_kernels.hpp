// The INT8 kernels of zobench-train (int8_net.hpp's Net runs them): LeNet-5's 5x5
// convolutions shape-specialised (ZOBENCH_INT8_CONV_SHAPES lists the shapes, once), every
// other shape, pointwise and FC layers runtime-sized; requantization, pooling and the global
// max fused where a pass allows. Bit for bit what workloads/int8.py computes (docs/int8.md).
#pragma once
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
// bytes after each padded input and error that a kernel may read: dp_tile reads kw 5-7 of a
// row's last pixel, 3 bytes past it
constexpr size_t READ_SLACK = 64;

// ---- convolution 5x5, stride 1, padding 2 (input pre-padded), LeNet-5's shapes. A kernel
// computes one output row of one image for one group of conv_lanes(OC) output channels, into
// row[x][j] (pixel x, channel g * lanes + j), from the image as ConvInput holds it;
// conv_forward_packed scatters the rows into the accumulators [B][OC][H][W], conv_pool_packed
// max-pools them in pairs. The weights are repacked for the kernel (conv_pack, into
// conv_packed_size(C, OC) bytes) once per pass. The input is uint8 activations or, for the
// input gradient, int8 errors (its weights flipped). ----

#if ZOBENCH_I8_WIDEST
// On the path's dot-product instruction (Vec::dp: four byte products into each int32 lane),
// the output channels are the lanes, and the four bytes of each product group are broadcast
// straight from the image: no im2col. The 25 taps of an input channel are 7 groups: kh 0-3 of
// each kw (a column's four bytes: the image is also held transposed) and kh 4 as two groups of
// a row's bytes (kw 0-3, 4-7; the weights of kw 5-7 are zero). P neighbouring pixels accumulate
// in registers: P x (lanes / vector lanes) vectors (conv_lanes). Packed weights: per group,
// [C][7][lanes][4], each row of lanes in dp's byte order (quad_byte).

// a group's lanes: 8 for up to 8 output channels, else 16, as far as P pixels of them fit the
// registers: one vector each where there are 16 registers, two where there are 32
constexpr int conv_lanes(int OC) { return std::min(OC <= 8 ? 8 : 16, (VREGS >= 32 ? 2 : 1) * WIDEST); }
constexpr int conv_packed_size(int C, int OC) {
    return (OC + conv_lanes(OC) - 1) / conv_lanes(OC) * C * 7 * conv_lanes(OC) * 4;
}

template <int C, int OC>   // lanes oc >= OC stay 0
inline void conv_pack(int8_t* wk, const int8_t* w) {
    constexpr int L = conv_lanes(OC);
    std::memset(wk, 0, conv_packed_size(C, OC));
    for (int oc = 0; oc < OC; ++oc)
        for (int ic = 0; ic < C; ++ic)
            for (int kh = 0; kh < 5; ++kh)
                for (int kw = 0; kw < 5; ++kw) {
                    const int slot = kh < 4 ? kw : 5 + kw / 4, k = kh < 4 ? kh : kw % 4;
                    wk[((oc / L * C + ic) * 7 + slot) * L * 4 + quad_byte(oc % L, k)] = w[((oc * C + ic) * 5 + kh) * 5 + kw];
                }
}

// one image: its padded planes [C][H + 4][W + 4] and their transpose [C][W + 4][H + 4]
template <int C, int H, int W, class A>
struct ConvInput {
    const A* in = nullptr;
    alignas(64) A t[C][W + 4][H + 4];
    void load(const A* image) {
        in = image;
        for (int ic = 0; ic < C; ++ic)
            for (int y = 0; y < H + 4; ++y)
                for (int x = 0; x < W + 4; ++x) t[ic][x][y] = image[(ic * (H + 4) + y) * (W + 4) + x];
    }
};

template <int C, int OC, int H, int W, int P, class A>
__attribute__((always_inline)) inline void dp_tile(int32_t* row, const ConvInput<C, H, W, A>& im, const int8_t* wv,
                                                   int h, int x0) {
    constexpr int L = conv_lanes(OC), VL = std::min(L, WIDEST), NV = L / VL, HP = H + 4, WP = W + 4;
    using S = Vec<VL>;
    typename S::A acc[P][NV];
    for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v) acc[p][v] = S::zero();
    // slot: the group's weights; pixel x0 + p's four input bytes at a + p * step
    auto group = [&](int slot, const A* a, int step) {
        typename S::B w[NV];
        for (int v = 0; v < NV; ++v) w[v] = S::load(wv + (slot * L + v * VL) * 4);
        if constexpr (staged<S>::value) {
            // pipelined: pixel s's mul, s - 1's mla, s - 2's widen (compilers keep a dp's three
            // instructions together to spare registers, and an in-order core then waits out
            // both latencies of every dp)
            typename S::U u[2];
            typename S::T t[3][NV];
            for (int s = 0; s < P + 2; ++s) {
                if (s < P) {
                    u[s % 2] = S::bcast4(a + s * step);
                    for (int v = 0; v < NV; ++v) t[s % 3][v] = S::mul(u[s % 2], w[v]);
                }
                if (s >= 1 && s <= P)
                    for (int v = 0; v < NV; ++v) t[(s - 1) % 3][v] = S::mla(t[(s - 1) % 3][v], u[(s - 1) % 2], w[v]);
                if (s >= 2)
                    for (int v = 0; v < NV; ++v) acc[s - 2][v] = S::widen(acc[s - 2][v], t[(s - 2) % 3][v]);
            }
        } else {
            for (int p = 0; p < P; ++p) {
                const typename S::U a4 = S::bcast4(a + p * step);
                for (int v = 0; v < NV; ++v) acc[p][v] = dp_of<S, A>(acc[p][v], a4, w[v]);
            }
        }
    };
    for (int ic = 0; ic < C; ++ic) {
        const A* col = &im.t[ic][x0][h];
        const A* row = im.in + (ic * HP + h + 4) * WP + x0;
        auto column = [&](int kw) { group(ic * 7 + kw, col + kw * HP, HP); };
        if constexpr ((P + 7) * NV + 4 < VREGS) {
            for (int kw = 0; kw < 5; ++kw) column(kw);
        } else {  // unrolled, the groups' weights, the tile and the temporaries outgrow the registers
#pragma GCC unroll 1
            for (int kw = 0; kw < 5; ++kw) column(kw);
        }
        for (int g = 0; g < 2; ++g) group(ic * 7 + 5 + g, row + 4 * g, 1);
    }
    for (int p = 0; p < P; ++p)
        for (int v = 0; v < NV; ++v) S::store(row + (x0 + p) * L + v * VL, acc[p][v]);
}

// the planes must be readable 3 bytes past their end (kw 5-7 of the last pixel)
template <int C, int OC, int H, int W, class A>
__attribute__((always_inline)) inline void conv_row(int32_t* row, const ConvInput<C, H, W, A>& im, const int8_t* wk,
                                                    int h, int g) {
    constexpr int P = 7;
    static_assert(W % P == 0, "rows are whole tiles");
    for (int x = 0; x < W; x += P) dp_tile<C, OC, H, W, P>(row, im, wk + size_t(g) * C * 7 * conv_lanes(OC) * 4, h, x);
}
#else
// one im2col row of patches, then a dot product per (pixel, output channel): one group of OC
// lanes. Packed weights: [OC][padded(C * 25)], a zero tail.
constexpr int conv_lanes(int OC) { return OC; }
constexpr int conv_packed_size(int C, int OC) { return OC * padded(C * 25); }

template <int C, int OC>
inline void conv_pack(int8_t* wk, const int8_t* w) {
    constexpr int K = C * 25, KP = padded(K);
    for (int oc = 0; oc < OC; ++oc) {
        std::memcpy(wk + oc * KP, w + oc * K, size_t(K));
        std::memset(wk + oc * KP + K, 0, size_t(KP - K));
    }
}

template <int C, int H, int W, class A>
struct ConvInput {
    const A* in = nullptr;
    void load(const A* image) { in = image; }
};

template <int C, int OC, int H, int W, class A>
inline void conv_row(int32_t* row, const ConvInput<C, H, W, A>& im, const int8_t* wk, int h, int) {
    constexpr int K = C * 25, KP = padded(K), HP = H + 4, WP = W + 4;
    alignas(64) A patch[W][KP];
    for (int x = 0; x < W; ++x) {
        for (int ic = 0; ic < C; ++ic)
            for (int kh = 0; kh < 5; ++kh) {
                const A* r = im.in + (ic * HP + h + kh) * WP + x;
                for (int kw = 0; kw < 5; ++kw) patch[x][(ic * 5 + kh) * 5 + kw] = r[kw];
            }
        for (int k = K; k < KP; ++k) patch[x][k] = 0;
    }
    for (int x = 0; x < W; ++x)
        for (int oc = 0; oc < OC; ++oc) row[x * OC + oc] = dot(patch[x], wk + oc * KP, KP);
}
#endif

// The threads share the (image, row) pairs as they come, each loading an image into its own
// ConvInput when its next pair starts another; the parallel region's end is the one barrier.
template <int C, int OC, int H, int W, class A>
inline void conv_forward_packed(int32_t* acc, const A* inpad, int8_t* wk, const int8_t* w, int B) {
    constexpr int L = conv_lanes(OC);
    conv_pack<C, OC>(wk, w);
    team::ranges(long(B) * H, [&](long lo, long hi) {
        ConvInput<C, H, W, A> im;
        int at = -1;
        for (long i = lo; i < hi; ++i) {
            const int b = int(i / H), h = int(i % H);
            {
                if (b != at) im.load(inpad + size_t(b) * C * (H + 4) * (W + 4)), at = b;
                for (int g = 0; g * L < OC; ++g) {
                    alignas(64) int32_t row[W][L];
                    conv_row<C, OC, H, W>(row[0], im, wk, h, g);
                    for (int oc = g * L; oc < std::min(OC, (g + 1) * L); ++oc)
                        for (int x = 0; x < W; ++x) acc[((size_t(b) * OC + oc) * H + h) * W + x] = row[x][oc - g * L];
                }
            }
        }
    });
}

// max |a[i]|, i < N, in 16 lanes: their maxima are independent chains (one would make an
// in-order core wait out each max's latency)
template <int N>
inline uint32_t max_abs(const int32_t* a) {
    static_assert(N % 16 == 0, "whole chunks");
    uint32_t m[16] = {};
    for (int i = 0; i < N; i += 16)
#pragma omp simd
        for (int k = 0; k < 16; ++k) m[k] = std::max(m[k], uint32_t(a[i + k] < 0 ? -a[i + k] : a[i + k]));
    return *std::max_element(m, m + 16);
}

// the convolution and its 2x2 max pool, where the activation before the pool is not kept: the
// pooled accumulators (requantization and ReLU are monotonic) in the next layer's padded
// layout, [B][OC][H/2 + 2 pad][W/2 + 2 pad] with a zero border, and the largest |accumulator|
// before the pool, which gives the requantization's shift
template <int C, int OC, int H, int W>
inline uint32_t conv_pool_packed(int32_t* pooled, int pad, const uint8_t* inpad, int8_t* wk, const int8_t* w, int B) {
    constexpr int L = conv_lanes(OC), OH = H / 2, OW = W / 2;
    static_assert(H % 2 == 0 && W % 2 == 0, "no odd row or column to drop");
    const int PH = OH + 2 * pad, PW = OW + 2 * pad;
    conv_pack<C, OC>(wk, w);
    return team::reduce(long(B) * OH, uint32_t(0), [&](long lo, long hi, uint32_t& m) {
        ConvInput<C, H, W, uint8_t> im;
        int at = -1;
        for (long i = lo; i < hi; ++i) {
            const int b = int(i / OH), h = int(i % OH);
            {
                if (b != at) im.load(inpad + size_t(b) * C * (H + 4) * (W + 4)), at = b;
                for (int g = 0; g * L < OC; ++g) {
                    alignas(64) int32_t rows[2][W][L], top[OW][L];
                    for (int k = 0; k < 2; ++k) conv_row<C, OC, H, W>(rows[k][0], im, wk, 2 * h + k, g);
                    m = std::max(m, max_abs<2 * W * L>(rows[0][0]));
                    for (int x = 0; x < OW; ++x) {  // the lanes are the vector: no branch on the data
                        const int32_t *a = rows[0][2 * x], *c = rows[1][2 * x];
#pragma omp simd
                        for (int j = 0; j < L; ++j) top[x][j] = std::max(std::max(a[j], a[L + j]), std::max(c[j], c[L + j]));
                    }
                    for (int oc = g * L; oc < std::min(OC, (g + 1) * L); ++oc) {
                        int32_t* plane = pooled + (size_t(b) * OC + oc) * PH * PW;
                        if (h == 0) std::fill(plane, plane + pad * PW, 0);
                        if (h == OH - 1) std::fill(plane + (OH + pad) * PW, plane + PH * PW, 0);
                        int32_t* o = plane + (h + pad) * PW;
                        std::fill(o, o + pad, 0);
                        std::fill(o + pad + OW, o + PW, 0);
                        for (int x = 0; x < OW; ++x) o[pad + x] = top[x][oc - g * L];
                    }
                }
            }
        }
    }, [](uint32_t a, uint32_t b) { return std::max(a, b); });
}

// requantized accumulators [lo, hi), ReLU: a function of its own, so that the loop vectorizes
// wherever a team's region inlines it (a byte store into a closure's copy of `out` may alias its
// other fields, and then GCC keeps the loop scalar: 19% of an INT8 LeNet-5 step)
__attribute__((noinline)) inline void requant_relu_range(uint8_t* __restrict out, const int32_t* __restrict acc, uint32_t lo,
                                                         uint32_t hi, int s) {
#pragma omp simd
    for (uint32_t i = lo; i < hi; ++i) out[i] = requant_relu(acc[i], s);
}

// requantized accumulators, ReLU (conv_pool_packed's: their zero border stays zero)
inline void requant_relu_all(uint8_t* out, const int32_t* acc, size_t n, int s) {
    team::ranges(long(n), [=](long lo, long hi) { requant_relu_range(out, acc, uint32_t(lo), uint32_t(hi), s); });
}

// requantize a conv output, ReLU, and 2x2 max-pool into `pooled` (pad = its zero border);
// `out` (the pre-pool activation, which only BP through the layer needs) may be null.
// Requantization and ReLU are monotonic, so the pool takes the max of the accumulators.
// Returns the exponent increment.
inline int requant_relu_pool(uint8_t* out, uint8_t* pooled, int pad, const int32_t* acc, int BC, int H, int W) {
    const int s = requant_shift(acc, size_t(BC) * H * W);
    const int OH = H / 2, OW = W / 2, PH = OH + 2 * pad, PW = OW + 2 * pad;
    team::each(BC, [&](long bc) {
        const int32_t* a = acc + size_t(bc) * H * W;
        if (out) {
            uint8_t* o = out + size_t(bc) * H * W;
#pragma omp simd
            for (int i = 0; i < H * W; ++i) o[i] = requant_relu(a[i], s);
        }
        for (int h = 0; h < OH; ++h) {
            const int32_t *r = a + 2 * h * W, *r1 = r + W;
            uint8_t* p = pooled + (size_t(bc) * PH + h + pad) * PW + pad;
#pragma omp simd
            for (int x = 0; x < OW; ++x)
                p[x] = requant_relu(std::max(std::max(r[2 * x], r[2 * x + 1]), std::max(r1[2 * x], r1[2 * x + 1])), s);
        }
    });
    return std::max(s, 0);
}

// requantize an FC output (ReLU unless it is the logits); returns the exponent increment
template <class T>
inline int requant_to(T* out, const int32_t* acc, size_t n, bool relu) {
    const int s = requant_shift(acc, n);
    for (size_t i = 0; i < n; ++i) out[i] = T(relu ? requant_relu(acc[i], s) : requant_value(acc[i], s));
    return std::max(s, 0);
}

// acc[b][o] = in[b] . w[o] as dot products: fc_forward's where no dot-product instruction is,
// and pointwise_forward's where its GEMM's tiles do not divide O
inline void fc_dots(int32_t* acc, const uint8_t* in, const int8_t* w, int B, int I, int O) {
    const int BB = (B + 3) / 4;  // blocks of four images; the last block repeats its final image
    team::each(long(BB) * O, [&](long i) {  // by output: a thread reads its rows of w alone (owned_segments)
        const int o = int(i / BB), bb = int(i % BB);
        const uint8_t* a[4];
        for (int j = 0; j < 4; ++j) a[j] = in + size_t(std::min(4 * bb + j, B - 1)) * I;
        int32_t s[4];
        dot4(s, a, w + size_t(o) * I, I);
        for (int j = 0; j < 4 && 4 * bb + j < B; ++j) acc[size_t(4 * bb + j) * O + o] = s[j];
    }, size_t(B) * I * O > (1u << 18) ? 1 : team::ALONE);
}

// dw[o][i] += sum_b err[b][o] * in[b][i]; G: int32, or int64 where B counts points
template <class G, class A>
inline void fc_weight_grad(G* dw, const int8_t* err, const A* in, int B, int I, int O) {
    team::each(O, [&](long o) {
        for (int b = 0; b < B; ++b) {
            const int32_t e = err[size_t(b) * O + o];
            if (e == 0) continue;
            const A* x = in + size_t(b) * I;
            G* row = dw + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) row[i] += G(e * int32_t(x[i]));
        }
    });
}

// eacc[b][i] = sum_o err[b][o] * w[o][i]
inline void fc_input_grad(int32_t* eacc, const int8_t* err, const int8_t* w, int B, int I, int O) {
    team::each(B, [&](long b) {
        int32_t* row = eacc + size_t(b) * I;
        std::fill(row, row + I, 0);
        for (int o = 0; o < O; ++o) {
            const int32_t e = err[size_t(b) * O + o];
            if (e == 0) continue;
            const int8_t* wr = w + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) row[i] += e * int32_t(wr[i]);
        }
    });
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
// taps per error load (Vec::dp on a dot-product path). int32 per image (at most H*W*127^2),
// int64 over the batch, summed over threads at the end. Scratch: per thread of the team, the
// planes (conv_grad_planes bytes) and its own sums (conv_grad_sums int64).
constexpr size_t conv_grad_planes(int C, int H, int W) { return size_t(C) * 25 * H * W; }
constexpr size_t conv_grad_sums(int C, int OC) { return size_t(OC) * C * 25; }

template <int C, int OC, int H, int W>
inline void conv_weight_grad(int64_t* dw, const int8_t* err, const uint8_t* inpad, int B, uint8_t* planes_scratch,
                             size_t planes_stride, int64_t* sums_scratch, size_t sums_stride) {
    constexpr int HP = H + 4, WP = W + 4, T = C * 25, N = H * W;
    int team_size = 1;
    team::run([&](int thread, int threads) {
        if (thread == 0) team_size = threads;
        uint8_t* planes = planes_scratch + size_t(thread) * planes_stride;
        int64_t* local = sums_scratch + size_t(thread) * sums_stride;
        std::fill(local, local + OC * T, int64_t(0));
        const auto [lo, hi] = team::share(B, thread, threads);
        for (int b = int(lo); b < int(hi); ++b) {
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
    });
    // the threads' sums (exact in int64: their order does not matter)
    team::ranges(long(OC) * T, [&](long lo, long hi) {
        for (int t = 0; t < team_size; ++t) {
            const int64_t* local = sums_scratch + size_t(t) * sums_stride;
            for (long i = lo; i < hi; ++i) dw[i] += local[i];
        }
    });
}

// ---- the runtime-sized kernels, for shapes without a fast path (conv_forward_any: conv_grad.hpp) ----

// acc[r][o] = in[r] . w[o] for signed inputs (a point cloud's few coordinates): each input
// value times a row of wt, w transposed to [I][O] (I * O bytes), the output channels as SIMD
// lanes -- fc_input_grad's product with wt in place of the error's weights
inline void rows_forward_signed(int32_t* acc, const int8_t* in, int8_t* wt, const int8_t* w, long R, int I, int O) {
    transpose(wt, w, O, I);
    fc_input_grad(acc, in, wt, int(R), O, I);
}

// acc[r][o] = in[r] . w[o] for the R rows of a pointwise layer (uint8 activations). On a
// dot-product path, a GEMM whose output channels are the lanes: per group of four inputs, each
// row's four bytes are broadcast against wq, the weights packed [C/4][O][4] (zero past C), and
// Vec::dp adds the four products into each of PW_NR output channels (PW_NV vectors) of PW_MR
// rows held in registers: 6 x 2 zmm (AVX-512's 32 registers), 4 x 2 ymm or xmm (AVX2's and
// SSE's 16), 6 x 4 q (NEON's 32); elsewhere (and for O not a multiple of PW_NR) fc_dots.
// wq: pointwise_packed_size.
inline size_t pointwise_packed_size(int C, int O) { return size_t(C + 3) / 4 * 4 * O; }

#if ZOBENCH_I8_WIDEST
constexpr int PW_MR = VREGS >= 32 ? 6 : 4, PW_NV = VREGS >= 32 && WIDEST == 4 ? 4 : 2, PW_NR = PW_NV * WIDEST;
using PwVec = Vec<WIDEST>;
using PwAcc = PwVec::A[PW_MR][PW_NV];

inline bool pointwise_tiled(int O) { return O % PW_NR == 0; }

// a[i][..] = sum_q sum_k x[i][q * step + k] * wq[(q * O + o0 + j) * 4 + k] for the PW_NR
// lanes j: the register tile of the pointwise forward (rows x output channels, step 4) and of
// its weight gradient (input channels x output channels, four rows a group; step 4 * C)
__attribute__((always_inline)) inline void pw_tile(PwAcc& a, const uint8_t* const x[PW_MR], size_t step,
                                                   const int8_t* wq, int O, int o0, int CQ) {
    using S = PwVec;
    for (int i = 0; i < PW_MR; ++i)
        for (int v = 0; v < PW_NV; ++v) a[i][v] = S::zero();
    for (int q = 0; q < CQ; ++q) {
        const int8_t* wv = wq + (size_t(q) * O + o0) * 4;
        S::B w[PW_NV];
        for (int v = 0; v < PW_NV; ++v) w[v] = S::load(wv + v * S::BYTES);
        for (int i = 0; i < PW_MR; ++i) {
            const S::U x4 = S::bcast4(x[i] + q * step);
            for (int v = 0; v < PW_NV; ++v) a[i][v] = S::dp(a[i][v], x4, w[v]);
        }
    }
}

// row i of a tile as int32 [PW_NR]
inline void pw_store(int32_t* out, const PwAcc& a, int i) {
    for (int v = 0; v < PW_NV; ++v) PwVec::store(out + v * WIDEST, a[i][v]);
}

// w [O][C] -> wq [C/4][O][4] (each [O][4] in dp's byte order), zero past C
inline void pack_quads(int8_t* wq, const int8_t* w, int C, int O) {
    for (int q = 0; q < (C + 3) / 4; ++q)
        for (int o = 0; o < O; ++o)
            for (int k = 0; k < 4; ++k) wq[size_t(q) * O * 4 + quad_byte(o, k)] = 4 * q + k < C ? w[size_t(o) * C + 4 * q + k] : 0;
}
#else
inline bool pointwise_tiled(int) { return false; }
#endif

inline void pointwise_forward(int32_t* acc, const uint8_t* in, int8_t* wq, const int8_t* w, long R, int C, int O) {
#if ZOBENCH_I8_WIDEST
    if (pointwise_tiled(O)) {
        pack_quads(wq, w, C, O);
        const long RB = (R + PW_MR - 1) / PW_MR, OB = O / PW_NR;
        team::each(RB * OB, [&](long item) {
            const long rb = item / OB;
            const int o0 = int(item % OB) * PW_NR;
            {
                const long r0 = rb * PW_MR;
                const int mr = int(std::min<long>(PW_MR, R - r0));
                const uint8_t* x[PW_MR];
                for (int i = 0; i < PW_MR; ++i) x[i] = in + size_t(r0 + std::min(i, mr - 1)) * C;  // a short block repeats its last row
                PwAcc a;  // bytes past C (the next row, or the buffer's slack) meet zero weights
                pw_tile(a, x, 4, wq, O, o0, (C + 3) / 4);
                for (int i = 0; i < mr; ++i) pw_store(acc + size_t(r0 + i) * O + o0, a, i);
            }
        });
        return;
    }
#endif
    fc_dots(acc, in, w, int(R), C, O);
}

// acc[b][o] = in[b] . w[o], an FC layer's forward. On a dot-product path, pointwise_forward's
// GEMM with the batch as its rows: as dot products (fc_dots), each image and output ends in a
// horizontal sum of a vector, and at LeNet-5's FC shapes those sums cost more than the
// multiply-adds (batch 32 on Zen 4's VNNI: 400 -> 120 took 34 us, not 10; 120 -> 84 12.7, not
// 2.7). Each thread takes the outputs whose weights its ZO pass perturbed
// (owned_segments) and packs them PW_NR at a time into its panel, which pw_tile reads for every
// PW_MR images. panels: fc_panel_bytes(I) per thread of the team.
#if ZOBENCH_I8_WIDEST
inline size_t fc_panel_bytes(int I) { return size_t(I + 3) / 4 * PW_NR * 4; }

// the byte of four rows' words, each row's word k a lane of a 16-byte vector, that lands at byte
// p of the panel's four lanes (quad_byte): p itself where a lane's bytes are in order
constexpr int panel_source(int p) {
    for (int l = 0; l < 4; ++l)
        for (int k = 0; k < 4; ++k)
            if (quad_byte(l, k) == p) return 4 * l + k;
    return p;
}

// rows w[0..n) of I bytes as a panel [I/4][PW_NR][4] in dp's byte order, zero past I and row n:
// the rows' words transposed, four rows by four words at a time in 16-byte vectors, then each
// vector's bytes in dp's order (a word, or a byte, at a time the packing took a third of
// LeNet-5's first FC layer)
inline void pack_panel(int8_t* panel, const int8_t* w, int I, int n) {
    const int Q = (I + 3) / 4, QW = I / 4, Q4 = QW / 4 * 4, N4 = n / 4 * 4;
    constexpr bool words = quad_byte(1, 0) == 4 && quad_byte(0, 1) == 1;  // a lane's bytes in order
    if (n < PW_NR || I % 4) std::memset(panel, 0, fc_panel_bytes(I));  // else every byte is written below
    using V = int32_t __attribute__((vector_size(16)));
    using V8 = int8_t __attribute__((vector_size(16)));
    constexpr V8 order = {panel_source(0),  panel_source(1),  panel_source(2),  panel_source(3),
                          panel_source(4),  panel_source(5),  panel_source(6),  panel_source(7),
                          panel_source(8),  panel_source(9),  panel_source(10), panel_source(11),
                          panel_source(12), panel_source(13), panel_source(14), panel_source(15)};
    const auto at = [&](int q, int j) { return panel + (size_t(q) * PW_NR + j) * 4; };
    for (int j = 0; j < N4; j += 4)
        for (int q = 0; q < Q4; q += 4) {
            V r[4];
            for (int k = 0; k < 4; ++k) std::memcpy(&r[k], w + size_t(j + k) * I + 4 * q, 16);
            const V lo01 = __builtin_shuffle(r[0], r[1], V{0, 4, 1, 5}), hi01 = __builtin_shuffle(r[0], r[1], V{2, 6, 3, 7});
            const V lo23 = __builtin_shuffle(r[2], r[3], V{0, 4, 1, 5}), hi23 = __builtin_shuffle(r[2], r[3], V{2, 6, 3, 7});
            const V c[4] = {__builtin_shuffle(lo01, lo23, V{0, 1, 4, 5}), __builtin_shuffle(lo01, lo23, V{2, 3, 6, 7}),
                            __builtin_shuffle(hi01, hi23, V{0, 1, 4, 5}), __builtin_shuffle(hi01, hi23, V{2, 3, 6, 7})};
            for (int k = 0; k < 4; ++k) {
                const V8 bytes = words ? V8(c[k]) : __builtin_shuffle(V8(c[k]), order);
                std::memcpy(at(q + k, j), &bytes, 16);
            }
        }
    for (int j = 0; j < n; ++j)
        for (int q = j < N4 ? Q4 : 0; q < Q; ++q) {
            const int8_t* from = w + size_t(j) * I + 4 * q;
            if (words && q < QW)
                std::memcpy(at(q, j), from, 4);
            else
                for (int k = 0; k < 4 && 4 * q + k < I; ++k) panel[size_t(q) * PW_NR * 4 + quad_byte(j, k)] = from[k];
        }
}

inline void fc_forward(int32_t* acc, const uint8_t* in, const int8_t* w, int B, int I, int O, int8_t* panels) {
    auto part = [&](int t, int T) {
        const auto [lo, hi] = team::share(O, t, T);
        int8_t* panel = panels + size_t(t) * fc_panel_bytes(I);
        for (long o0 = lo; o0 < hi; o0 += PW_NR) {
            const int n = int(std::min<long>(PW_NR, hi - o0));
            pack_panel(panel, w + size_t(o0) * I, I, n);
            for (int r0 = 0; r0 < B; r0 += PW_MR) {
                const int mr = std::min(PW_MR, B - r0);
                const uint8_t* x[PW_MR];
                for (int i = 0; i < PW_MR; ++i) x[i] = in + size_t(r0 + std::min(i, mr - 1)) * I;  // a short block repeats its last image
                PwAcc a;  // bytes past I (the next image, or the buffer's slack) meet zero weights
                pw_tile(a, x, 4, panel, PW_NR, 0, (I + 3) / 4);
                alignas(64) int32_t rows[PW_MR][PW_NR];  // stored whole: a store of part of the tile
                for (int i = 0; i < PW_MR; ++i) pw_store(rows[i], a, i);  // had GCC spill it every step
                for (int i = 0; i < mr; ++i) std::memcpy(acc + size_t(r0 + i) * O + o0, rows[i], sizeof(int32_t) * size_t(n));
            }
        }
    };
    if (size_t(B) * I * O > (1u << 18) && team::size() > 1)
        team::run(part);
    else
        part(0, 1);
}
#else
inline size_t fc_panel_bytes(int) { return 0; }

inline void fc_forward(int32_t* acc, const uint8_t* in, const int8_t* w, int B, int I, int O, int8_t*) {
    fc_dots(acc, in, w, B, I, O);
}
#endif

// dw[o][c] += sum_r d[r][o] in[r][c] over the R = B*N rows of a pointwise layer. On a
// dot-product path, pointwise_forward's GEMM with the rows as its inner dimension: the threads split the rows,
// PW_RB at a time, packed four rows a group (the inputs to xq [PW_RB/4][C][4], the errors to
// dq [PW_RB/4][O][4], zero past the last row), and pw_tile sums each tile of PW_MR input x
// PW_NR output channels over them in int32, exact as PW_RB * 127^2 < 2^31, into the thread's
// int64 sums [C][O], added up at the end. Scratch per thread of the team: pointwise_grad_pack
// bytes and C * O int64. Elsewhere fc_weight_grad.
constexpr int PW_RB = 256;
inline size_t pointwise_grad_pack(int C, int O) { return size_t(PW_RB) * (C + O); }

inline void pointwise_weight_grad(int64_t* dw, const int8_t* d, const uint8_t* in, uint8_t* pack_scratch,
                                  size_t pack_stride, int64_t* sums_scratch, size_t sums_stride, long R, int C, int O) {
#if ZOBENCH_I8_WIDEST
    if (pointwise_tiled(O)) {
        const long NB = (R + PW_RB - 1) / PW_RB;
        int team_size = 1;
        team::run([&](int thread, int threads) {
            if (thread == 0) team_size = threads;
            uint8_t* xq = pack_scratch + size_t(thread) * pack_stride;
            int8_t* dq = reinterpret_cast<int8_t*>(xq + size_t(PW_RB) * C);
            int64_t* local = sums_scratch + size_t(thread) * sums_stride;
            std::fill(local, local + size_t(C) * O, int64_t(0));
            const auto [first, last] = team::share(NB, thread, threads);
            for (long nb = first; nb < last; ++nb) {
                const long r0 = nb * PW_RB;
                const int rn = int(std::min<long>(PW_RB, R - r0)), QN = (rn + 3) / 4;
                for (int r = 0; r < 4 * QN; ++r) {
                    const int q = r / 4, k = r % 4;
                    for (int c = 0; c < C; ++c) xq[(size_t(q) * C + c) * 4 + k] = r < rn ? in[size_t(r0 + r) * C + c] : 0;
                    for (int o = 0; o < O; ++o) dq[size_t(q) * O * 4 + quad_byte(o, k)] = r < rn ? d[size_t(r0 + r) * O + o] : 0;
                }
                for (int c0 = 0; c0 < C; c0 += PW_MR) {
                    const int mc = std::min(PW_MR, C - c0);
                    const uint8_t* x[PW_MR];
                    for (int i = 0; i < PW_MR; ++i) x[i] = xq + size_t(c0 + std::min(i, mc - 1)) * 4;  // a short block repeats its last channel
                    for (int o0 = 0; o0 < O; o0 += PW_NR) {
                        PwAcc a;
                        pw_tile(a, x, size_t(4) * C, dq, O, o0, QN);
                        for (int i = 0; i < mc; ++i) {
                            alignas(64) int32_t t[PW_NR];
                            pw_store(t, a, i);
                            int64_t* row = local + size_t(c0 + i) * O + o0;
#pragma omp simd
                            for (int j = 0; j < PW_NR; ++j) row[j] += t[j];
                        }
                    }
                }
            }
        });
        // the sums of the threads that ran (a team on one thread leaves the other slots stale)
        team::each(O, [&](long o) {
            for (int t = 0; t < team_size; ++t)
                for (int c = 0; c < C; ++c) dw[size_t(o) * C + c] += sums_scratch[size_t(t) * sums_stride + size_t(c) * O + o];
        });
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
constexpr int PW_GB = 48;
#if ZOBENCH_I8_WIDEST
static_assert(PW_GB % PW_MR == 0, "a block is whole tiles");
#endif
inline int gmax_blocks(int N) { return (N + PW_GB - 1) / PW_GB; }

inline int pointwise_gmax_forward(uint8_t* pooled, int* argmax, int32_t* mx, int32_t* blocks, const uint8_t* in,
                                  int8_t* wq, const int8_t* w, int B, int N, int C, int O) {
    const int NG = gmax_blocks(N);
    using Range = std::pair<int32_t, int32_t>;  // (lo, hi): the accumulators' range
    const auto widest = [](Range a, Range b) { return Range{std::min(a.first, b.first), std::max(a.second, b.second)}; };
    Range range{INT32_MAX, INT32_MIN};
#if ZOBENCH_I8_WIDEST
    if (pointwise_tiled(O)) {
        using S = PwVec;
        pack_quads(wq, w, C, O);
        const int OB = O / PW_NR;
        range = team::reduce(long(B) * OB, range, [&](long first, long last, Range& r) {
          auto& [lo, hi] = r;
          for (long item = first; item < last; ++item) {
            const int b = int(item / OB), o0 = int(item % OB) * PW_NR;
            {
                S::A top[PW_NV], bot[PW_NV];
                for (int v = 0; v < PW_NV; ++v) top[v] = S::set1(INT32_MIN), bot[v] = S::set1(INT32_MAX);
                for (int g = 0; g < NG; ++g) {
                    S::A blk[PW_NV];
                    for (int v = 0; v < PW_NV; ++v) blk[v] = S::set1(INT32_MIN);
                    for (int n0 = g * PW_GB; n0 < std::min(N, (g + 1) * PW_GB); n0 += PW_MR) {
                        const int mr = std::min(PW_MR, N - n0);
                        const uint8_t* x[PW_MR];  // a short block repeats its last row: max and min are unchanged
                        for (int i = 0; i < PW_MR; ++i) x[i] = in + (size_t(b) * N + n0 + std::min(i, mr - 1)) * C;
                        PwAcc a;
                        pw_tile(a, x, 4, wq, O, o0, (C + 3) / 4);
                        for (int i = 0; i < PW_MR; ++i)
                            for (int v = 0; v < PW_NV; ++v) {
                                blk[v] = S::max(blk[v], a[i][v]);
                                bot[v] = S::min(bot[v], a[i][v]);
                            }
                    }
                    for (int v = 0; v < PW_NV; ++v) top[v] = S::max(top[v], blk[v]);
                    if (blocks) {
                        alignas(64) int32_t t[PW_NR];
                        for (int v = 0; v < PW_NV; ++v) S::store(t + v * WIDEST, blk[v]);
                        for (int j = 0; j < PW_NR; ++j) blocks[(size_t(b) * O + o0 + j) * NG + g] = t[j];
                    }
                }
                alignas(64) int32_t t[PW_NR], u[PW_NR];
                for (int v = 0; v < PW_NV; ++v) S::store(t + v * WIDEST, bot[v]), S::store(u + v * WIDEST, top[v]);
                std::copy(u, u + PW_NR, mx + size_t(b) * O + o0);
                hi = std::max(hi, *std::max_element(u, u + PW_NR));
                lo = std::min(lo, *std::min_element(t, t + PW_NR));
            }
          }
        }, widest);
    } else
#endif
    {
        range = team::reduce(long(B) * O, range, [&](long first, long last, Range& r) {
          auto& [lo, hi] = r;
          for (long item = first; item < last; ++item) {
            const int b = int(item / O), o = int(item % O);
            {
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
        }, widest);
    }
    const int s = shift_of_max(uint32_t(std::max<int64_t>(range.second, -int64_t(range.first))));
    auto act = [s](int32_t a) { return requant_relu(a, s); };
    team::each(long(B) * O, [&](long item) {
        const size_t i = size_t(item);
        const uint8_t m = pooled[i] = act(mx[i]);
        if (!argmax) return;
        const int32_t* blk = blocks + i * NG;
        const int g = int(std::find_if(blk, blk + NG, [&](int32_t v) { return act(v) == m; }) - blk);
        const size_t b = i / O, o = i % O;
        int p = g * PW_GB;
        while (act(dot(in + (b * N + p) * C, w + o * C, C)) != m) ++p;
        argmax[i] = p;
    });
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
    const int OB = (O + CB - 1) / CB;
    team::each(long(B) * OB, [&](long item) {
        const int b = int(item / OB), c0 = int(item % OB) * CB;
        {
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
    });
    return std::max(s, 0);
}

// LeNet-5's convolutions (5x5, padding 2) that run the shape-specialised kernels above, each as
// (C, OC, output H, W); every other shape runs the runtime-sized ones. A listed shape's input
// gradient runs as the forward of its transpose (OC, C, H, W).
#define ZOBENCH_INT8_CONV_SHAPES(X) X(1, 6, 28, 28) X(6, 16, 14, 14)

template <int C_, int OC_, int H_, int W_>
struct ConvShape {
    static constexpr int C = C_, OC = OC_, H = H_, W = W_;
};

// f(ConvShape<...>{}) for the listed shape (C, OC, H, W), and true; false where none is listed
template <class F>
bool with_conv_shape(int C, int OC, int H, int W, F&& f) {
#define ZOBENCH_INT8_SHAPE(c, oc, h, w)                      \
    if (C == c && OC == oc && H == h && W == w) {            \
        f(ConvShape<c, oc, h, w>{});                         \
        return true;                                         \
    }
    ZOBENCH_INT8_CONV_SHAPES(ZOBENCH_INT8_SHAPE)
#undef ZOBENCH_INT8_SHAPE
    return false;
}

}  // namespace int8
