// The FP32 network's kernels: one forward and one backward function per layer kind, each with
// runtime sizes, and fast paths for the shapes LeNet-5 runs (templates on C/OC/H/W, so the loops
// unroll into whole SIMD registers), chosen at run time where a layer's shape is one of them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "common.hpp"
#include "conv_grad.hpp"
#include "team.hpp"

namespace fp32k {

// The vector ISA these kernels are compiled to (env.kernels.conv and .fc), for the binary's -march or
// -mcpu: GCC's vector types (the convolutions' rows, the FC tiles) and `omp simd` loops
#if defined(__aarch64__)
constexpr const char* SIMD = "neon";
#elif defined(__AVX512F__)
constexpr const char* SIMD = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* SIMD = "avx2-fma";
#elif defined(__AVX2__)
constexpr const char* SIMD = "avx2";    // x86-64-v3-nofma: the instruction count's build (counting.py)
#elif defined(__SSE4_2__)
constexpr const char* SIMD = "sse4.2";
#elif defined(__SSE2__)
constexpr const char* SIMD = "sse2";
#else
constexpr const char* SIMD = "scalar";
#endif

// ---- GCC's vector types, one register each on every path: VF floats (VREGS of them: common.hpp) ----
#if defined(__AVX512F__)
constexpr int VF = 16;
#elif defined(__AVX__)
constexpr int VF = 8;
#else
constexpr int VF = 4;
#endif
// N floats as a register, and as N floats at any float's address: loads and stores through the
// latter are one instruction each (a memcpy into an array of vectors went through the stack in
// 16-byte pieces under -march=x86-64-v3, and each FMA then waited on a store-forwarding stall).
// A vector of floats aliases floats (GCC gives it its element type's alias set).
template <int N>
struct Lanes {
    typedef float type __attribute__((vector_size(N * sizeof(float))));
    typedef float loose __attribute__((vector_size(N * sizeof(float)), aligned(alignof(float))));
};
typedef Lanes<VF>::type vfloat;

template <int N = VF>
__attribute__((always_inline)) inline typename Lanes<N>::type vload(const float* p) {
    return *reinterpret_cast<const typename Lanes<N>::loose*>(p);
}

template <int N = VF>
__attribute__((always_inline)) inline void vstore(float* p, typename Lanes<N>::type v) {
    *reinterpret_cast<typename Lanes<N>::loose*>(p) = v;
}

// n < VF floats from p, the other lanes zero (a sum's tail: adding zeros leaves it as it is)
__attribute__((always_inline)) inline vfloat vload_part(const float* p, int n) {
    float t[VF] = {};
    for (int l = 0; l < n; ++l) t[l] = p[l];
    return vload(t);
}

// the sum of v's lanes, halves first, in registers (a lane loop over a stored copy cost AVX-512 a
// store-forwarding stall a lane: 16 of them took a third of a 784-long tile's time)
template <int N>
__attribute__((always_inline)) inline float hsum(typename Lanes<N>::type v) {
    if constexpr (N == 1) {
        return v[0];
    } else {
        typename Lanes<N / 2>::type lo, hi;
        __builtin_memcpy(&lo, &v, sizeof lo);
        __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof lo, sizeof hi);
        return hsum<N / 2>(lo + hi);
    }
}

// ---- convolution 5x5, stride 1, padding 2 (input given pre-padded), ReLU fused ----
// out[b][oc][h][w] = relu(bias[oc] + sum_{ic,kh,kw} w[oc][ic][kh][kw] * inpad[b][ic][h+kh][w+kw])
// A row of the output is NV vectors of N lanes (the widest N <= W), the last one ending at the
// row's end, over the one before where N does not divide W: no lane reads or writes past its
// row, and the lanes computed twice are the same bits. A tile of OB output channels by CV of a
// row's vectors is accumulated in registers across all 25*C taps and stored once: per tap, CV
// input vectors loaded and OB weights broadcast feed OB * CV FMAs. (OB, CV) is the shape that
// feeds the most FMAs a vector loaded whose accumulators, one tap's inputs and a broadcast fit
// the registers (conv_tile): conv1 (6 channels, W = 28) takes 6 x 2 vectors on AVX-512 (N = 16),
// AVX2 (8) and SSE (4), and 6 x 4 on NEON (4). Each output sums its taps in the order it did when
// the rows were `omp simd` loops (ic, kh, kw), so the values are the same bits.
constexpr int row_lanes(int W) {
    int n = VF;
    while (n > W && n > 1) n /= 2;
    return n;
}

constexpr int row_vectors(int W) { return (W + row_lanes(W) - 1) / row_lanes(W); }

struct ConvTile {
    int ob, cv;
};

constexpr ConvTile conv_tile(int OC, int NV) {
    ConvTile best{1, 1};
    for (int ob = 1; ob <= OC; ++ob) {
        if (OC % ob != 0) continue;     // a tile's channels divide OC
        for (int cv = 1; cv <= NV && ob * cv + cv + 1 <= VREGS; ++cv) {
            const long more = long(ob) * cv * (best.ob + best.cv), now = long(best.ob) * best.cv * (ob + cv);
            if (more > now || (more == now && ob * cv > best.ob * best.cv)) best = {ob, cv};
        }
    }
    return best;
}

// one image's OB output channels (out [OB][H][W], w [OB][C][5][5]), a function of its own: inlined
// into a team's region, GCC may keep the accumulators on the stack (dot_tile)
template <int C, int H, int W, int OB, int CV, bool RELU>
__attribute__((noinline)) void conv_rows_forward(float* __restrict out, const float* __restrict in,
                                                 const float* __restrict w, const float* bias) {
    constexpr int HP = H + 4, WP = W + 4, N = row_lanes(W), NV = row_vectors(W);
    typedef typename Lanes<N>::type vec;
    auto at = [](int v) { return v < NV - 1 ? v * N : W - N; };    // a vector's first pixel
    for (int h = 0; h < H; ++h) {
        auto tile = [&](auto count, int v0) __attribute__((always_inline)) {
            constexpr int K = decltype(count)::value;
            vec acc[OB][K];
            for (int j = 0; j < OB; ++j)
                for (int v = 0; v < K; ++v) acc[j][v] = vec{} + (bias ? bias[j] : 0.f);
            for (int ic = 0; ic < C; ++ic)
                for (int kh = 0; kh < 5; ++kh) {
                    const float* irow = in + (ic * HP + h + kh) * WP;
                    for (int kw = 0; kw < 5; ++kw) {
                        vec x[K];
                        for (int v = 0; v < K; ++v) x[v] = vload<N>(irow + kw + at(v0 + v));
                        for (int j = 0; j < OB; ++j) {
                            const float wv = w[((j * C + ic) * 5 + kh) * 5 + kw];
                            for (int v = 0; v < K; ++v) acc[j][v] += wv * x[v];
                        }
                    }
                }
            for (int j = 0; j < OB; ++j)
                for (int v = 0; v < K; ++v) {
                    vec a = acc[j][v];
                    if constexpr (RELU) a = a > 0.f ? a : vec{};
                    vstore<N>(out + (j * H + h) * W + at(v0 + v), a);
                }
        };
        int v0 = 0;
        for (; v0 + CV <= NV; v0 += CV) tile(std::integral_constant<int, CV>{}, v0);
        if constexpr (NV % CV != 0) tile(std::integral_constant<int, NV % CV>{}, v0);
    }
}

template <int C, int OC, int H, int W, bool RELU = true>
inline void conv_forward(float* out, const float* inpad, const float* w, const float* bias, int B) {
    constexpr ConvTile T = conv_tile(OC, row_vectors(W));
    constexpr int OB = T.ob;
    team::each(long(B) * (OC / OB), [&](long i) {
        const int b = int(i / (OC / OB)), og = int(i % (OC / OB));
        conv_rows_forward<C, H, W, OB, T.cv, RELU>(out + (size_t(b) * OC + og * OB) * H * W,
                                                   inpad + size_t(b) * C * (H + 4) * (W + 4),
                                                   w + size_t(og) * OB * C * 25, bias ? bias + og * OB : nullptr);
    });
}

// The same convolution for layers with many output channels (conv2: 16): the output
// channels are the SIMD lanes, so every tap is one broadcast input value times one weight
// vector, for P neighbouring pixels at once (P*OC accumulators stay in registers). wt holds
// the weights transposed to [C][5][5][OC] (transpose), made once per forward.
template <int C, int OC, int H, int W, int P>
__attribute__((always_inline)) inline void conv_tile(float* out, const float* inpad, const float* __restrict wt,
                                                     const float* bias, int h, int x0) {
    constexpr int WP = W + 4, HP = H + 4;
    float acc[P][OC];
    for (int p = 0; p < P; ++p)
        for (int o = 0; o < OC; ++o) acc[p][o] = bias[o];
    for (int ic = 0; ic < C; ++ic)
        for (int kh = 0; kh < 5; ++kh) {
            const float* irow = inpad + (ic * HP + h + kh) * WP + x0;
            for (int kw = 0; kw < 5; ++kw) {
                const float* wv = wt + ((ic * 5 + kh) * 5 + kw) * OC;
                for (int p = 0; p < P; ++p) {
                    const float v = irow[p + kw];
#pragma omp simd
                    for (int o = 0; o < OC; ++o) acc[p][o] += v * wv[o];
                }
            }
        }
    for (int o = 0; o < OC; ++o)
        for (int p = 0; p < P; ++p) out[(o * H + h) * W + x0 + p] = acc[p][o] > 0.f ? acc[p][o] : 0.f;
}

// Pixels a tile: enough accumulators to hide the FMA's latency. AVX-512 holds 16 channels in one
// vector, so its tile takes 7 pixels (conv2: 300 against 391 us a batch on one thread); AVX2's
// two vectors a pixel and NEON's four fill their registers at 4.
#if defined(__AVX512F__)
constexpr int OC_TILE = 7;
#else
constexpr int OC_TILE = 4;
#endif

template <int C, int OC, int H, int W>
inline void conv_forward_oc(float* out, const float* inpad, const float* wt, const float* bias, int B) {
    constexpr int P = OC_TILE, TAIL = W % P;
    team::each(long(B) * H, [&](long i) {
        const int b = int(i / H), h = int(i % H);
        float* o = out + size_t(b) * OC * H * W;
        const float* in = inpad + size_t(b) * C * (H + 4) * (W + 4);
        int x = 0;
        for (; x + P <= W; x += P) conv_tile<C, OC, H, W, P>(o, in, wt, bias, h, x);
        if constexpr (TAIL > 0) conv_tile<C, OC, H, W, TAIL>(o, in, wt, bias, h, x);
    });
}

// db[oc] += the sum of dout[b][oc] over the batch and its HW pixels
inline void conv_bias_grad(float* db, const float* dout, int B, int OC, int HW) {
    team::each(OC, [&](long oc) {
        float s = 0.f;
        for (int b = 0; b < B; ++b) {
            const float* d = dout + (size_t(b) * OC + oc) * HW;
#pragma omp simd reduction(+ : s)
            for (int i = 0; i < HW; ++i) s += d[i];
        }
        db[oc] += s;
    });
}

// Backward of conv_forward, in two kernels:
// - the weight gradient, dw[oc][ic][kh][kw] += sum_{b,h,x} dout[b][oc][h][x] * inpad[b][ic][h+kh][x+kw],
//   keeps the five kw taps of one (oc, ic, kh) as five accumulator rows over the batch, so each
//   row of dout is loaded once for five taps (the register-row scheme of conv_forward);
// - the input gradient is itself a convolution: of dout padded by 2 with the weights flipped
//   and transposed (flip_weights), run by conv().
template <int C, int OC, int H, int W>
inline void conv_weight_grad(float* dw, float* db, const float* dout, const float* inpad, int B) {
    constexpr int HP = H + 4, WP = W + 4;
    team::each(long(OC) * C * 5, [&](long i) {
        const int oc = int(i / (C * 5)), ic = int(i / 5 % C), kh = int(i % 5);
            {
                float acc[5][W] = {};
                for (int b = 0; b < B; ++b)
                    for (int h = 0; h < H; ++h) {
                        const float* d = dout + ((size_t(b) * OC + oc) * H + h) * W;
                        const float* ip = inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP;
                        for (int kw = 0; kw < 5; ++kw)
#pragma omp simd
                            for (int x = 0; x < W; ++x) acc[kw][x] += d[x] * ip[x + kw];
                    }
                for (int kw = 0; kw < 5; ++kw) {
                    float s = 0.f;
                    for (int x = 0; x < W; ++x) s += acc[kw][x];
                    dw[((oc * C + ic) * 5 + kh) * 5 + kw] += s;
                }
            }
    });
    conv_bias_grad(db, dout, B, OC, H * W);
}

// The shapes with fast paths: 5x5 kernels on LeNet-5's (C, OC, output H, W). The forward picks
// the output-channel-lane kernel for 16 or more output channels, the row kernel otherwise; wk:
// scratch for the repacked weights (C * OC * KH * KW floats).
#define ZOBENCH_FP32_CONV_SHAPES(X) X(1, 6, 28, 28) X(6, 16, 14, 14) X(16, 6, 14, 14)

inline void conv(float* out, const float* inpad, const float* w, const float* bias, float* wk, int B, int C, int OC,
                 int H, int W, int KH, int KW, bool relu) {
    if (KH == 5 && KW == 5) {
#define FAST(c, oc, h, w_)                                                                         \
    if (C == c && OC == oc && H == h && W == w_) {                                                 \
        if constexpr (oc >= 16) {                                                                  \
            if (relu && bias) {                                                                    \
                transpose(wk, w, oc, c * 25);                                                      \
                return conv_forward_oc<c, oc, h, w_>(out, inpad, wk, bias, B);                     \
            }                                                                                      \
        }                                                                                          \
        return relu ? conv_forward<c, oc, h, w_, true>(out, inpad, w, bias, B)                     \
                    : conv_forward<c, oc, h, w_, false>(out, inpad, w, bias, B);                   \
    }
        ZOBENCH_FP32_CONV_SHAPES(FAST)
#undef FAST
    }
    conv_forward_any(out, inpad, w, B, C, OC, H, W, KH, KW, [&](int oc) { return bias ? bias[oc] : 0.f; }, relu);
}

inline void conv_weight_grad(float* dw, float* db, const float* dout, const float* inpad, int B, int C, int OC, int H,
                             int W, int KH, int KW) {
    if (KH == 5 && KW == 5) {
#define FAST(c, oc, h, w_) \
    if (C == c && OC == oc && H == h && W == w_) return conv_weight_grad<c, oc, h, w_>(dw, db, dout, inpad, B);
        ZOBENCH_FP32_CONV_SHAPES(FAST)
#undef FAST
    }
    conv_weight_grad_any<float, float>(dw, dout, inpad, B, C, OC, H, W, KH, KW);
    conv_bias_grad(db, dout, B, OC, H * W);
}

// ---- pointwise: the shared FC over every point, out[r][o] = bias[o] + in[r] . w[o] for the
// N rows of each of B clouds, a GEMM [B*N, C] x [C, O]. Register-tiled: an MR x NR block of
// outputs stays in registers (two SIMD vectors of output channels per row) while the C
// products stream through it, one input value broadcast against NR output channels of wt = w
// transposed to [C][O]. With `pooled`, the block's rows are max-reduced into each cloud's
// global max [B][O] instead of being stored (out unused): the [B*N, O] activation is never
// written; BP through the max needs only each maximum's point, which `argmax` (may be null)
// receives, the first maximum as PyTorch routes it. bias may be null (no bias): the kernel is
// also the input gradient of a pointwise layer, din[r] = sum_o d[r][o] w[o], with wt = w as it is.

#if defined(__AVX512F__)
constexpr int PW_NR = 32;
#else
constexpr int PW_NR = 16;
#endif

inline void pointwise_forward(float* out, float* pooled, int* argmax, const float* in, const float* wt,
                              const float* bias, int B, int N, int C, int O, bool relu) {
    constexpr int MR = 6, NR = PW_NR;
    const int OB = (O + NR - 1) / NR;
    team::each(long(B) * OB, [&](long item) {
        const int b = int(item / OB), ob = int(item % OB);
        {
            const int o0 = ob * NR, nr = std::min(NR, O - o0);
            float best[NR];
            int at[NR] = {};
            std::fill(best, best + NR, -INFINITY);
            for (int n0 = 0; n0 < N; n0 += MR) {
                const size_t r0 = size_t(b) * N + n0;
                const int mr = std::min(MR, N - n0);
                const float* x[MR];
                for (int i = 0; i < MR; ++i) x[i] = in + (r0 + std::min(i, mr - 1)) * C;  // a short block repeats its last row
                float acc[MR][NR];
                for (int i = 0; i < MR; ++i)
                    for (int j = 0; j < NR; ++j) acc[i][j] = bias && j < nr ? bias[o0 + j] : 0.f;
                if (nr == NR) {
                    for (int c = 0; c < C; ++c) {
                        const float* wv = wt + size_t(c) * O + o0;
                        for (int i = 0; i < MR; ++i) {
                            const float v = x[i][c];
#pragma omp simd
                            for (int j = 0; j < NR; ++j) acc[i][j] += v * wv[j];
                        }
                    }
                } else {
                    for (int c = 0; c < C; ++c)
                        for (int i = 0; i < MR; ++i)
                            for (int j = 0; j < nr; ++j) acc[i][j] += x[i][c] * wt[size_t(c) * O + o0 + j];
                }
                if (pooled && argmax) {
                    for (int i = 0; i < mr; ++i)
#pragma omp simd
                        for (int j = 0; j < NR; ++j) {
                            const bool gt = acc[i][j] > best[j];  // strictly: the first maximum stays
                            best[j] = gt ? acc[i][j] : best[j];
                            at[j] = gt ? n0 + i : at[j];
                        }
                } else if (pooled) {
                    for (int i = 0; i < mr; ++i)
#pragma omp simd
                        for (int j = 0; j < NR; ++j) best[j] = std::max(best[j], acc[i][j]);
                } else {
                    for (int i = 0; i < mr; ++i)
                        for (int j = 0; j < nr; ++j) {
                            const float v = acc[i][j];
                            out[(r0 + i) * O + o0 + j] = relu && !(v > 0.f) ? 0.f : v;
                        }
                }
            }
            if (pooled)  // the ReLU commutes with the max
                for (int j = 0; j < nr; ++j) {
                    pooled[size_t(b) * O + o0 + j] = relu && !(best[j] > 0.f) ? 0.f : best[j];
                    if (argmax) argmax[size_t(b) * O + o0 + j] = at[j];
                }
        }
    });
}

// The weight gradient of a pointwise layer, dw[o][c] += sum_r d[r][o] in[r][c] and
// db[o] += sum_r d[r][o], over R = B*N rows: a GEMM whose inner dimension is the rows. The
// threads split the rows, each summing into its own [C + 1][O] (dw transposed, then db) in
// `scratch` (team::size() * (C + 1) * O floats), added up at the end. A thread takes RB rows at a
// time, which stay in cache while every MR x NR tile of dw^T (NR output channels as SIMD
// lanes, MR input channels broadcast) sums over them in registers, as pointwise_forward's.
inline void pointwise_weight_grad(float* dw, float* db, const float* d, const float* in, float* scratch, long R, int C,
                                  int O) {
    constexpr int MR = 6, NR = PW_NR, RB = 256;
    const size_t stride = size_t(C + 1) * O;
    const long RBS = (R + RB - 1) / RB;
    int team_size = 1;
    team::run([&](int t, int T) {
        if (t == 0) team_size = T;
        float* local = scratch + size_t(t) * stride;
        std::fill(local, local + stride, 0.f);
        const auto [lo, hi] = team::share(RBS, t, T);
        for (long rb = lo; rb < hi; ++rb) {
            const long r0 = rb * RB;
            const int rn = int(std::min<long>(RB, R - r0));
            for (int c0 = 0; c0 < C; c0 += MR) {
                const int mc = std::min(MR, C - c0);
                int ci[MR];
                for (int i = 0; i < MR; ++i) ci[i] = c0 + std::min(i, mc - 1);  // a short block repeats its last channel
                for (int o0 = 0; o0 < O; o0 += NR) {
                    const int nr = std::min(NR, O - o0);
                    float acc[MR][NR] = {};
                    for (int r = 0; r < rn; ++r) {
                        const float* x = in + size_t(r0 + r) * C;
                        const float* dv = d + size_t(r0 + r) * O + o0;
                        if (nr == NR) {
                            for (int i = 0; i < MR; ++i) {
                                const float v = x[ci[i]];
#pragma omp simd
                                for (int j = 0; j < NR; ++j) acc[i][j] += v * dv[j];
                            }
                        } else {
                            for (int i = 0; i < MR; ++i)
                                for (int j = 0; j < nr; ++j) acc[i][j] += x[ci[i]] * dv[j];
                        }
                    }
                    for (int i = 0; i < mc; ++i)
                        for (int j = 0; j < nr; ++j) local[size_t(c0 + i) * O + o0 + j] += acc[i][j];
                }
            }
            float* lb = local + size_t(C) * O;
            for (int r = 0; r < rn; ++r) {
                const float* dv = d + size_t(r0 + r) * O;
#pragma omp simd
                for (int o = 0; o < O; ++o) lb[o] += dv[o];
            }
        }
    });
    team::each(O, [&](long o) {
        for (int t = 0; t < team_size; ++t) {
            const float* local = scratch + size_t(t) * stride;
            for (int c = 0; c < C; ++c) dw[size_t(o) * C + c] += local[size_t(c) * O + o];
            db[o] += local[size_t(C) * O + o];
        }
    });
}

// ---- 2x2 max pooling into `out` with a border of `pad` (left as it is: zero from allocation),
// so it can feed the next convolution directly; backward (pool.hpp) routes to the first
// maximum, as PyTorch does ----
// one plane, a function of its own so that its rows vectorize: inlined into the team's region,
// its stores could alias its loads, and GCC kept it scalar (a tenth of a LeNet-5 Full ZO step)
__attribute__((noinline)) inline void maxpool_plane(float* __restrict out, const float* __restrict in, int OH, int OW,
                                                    int W, int PW) {
    for (int h = 0; h < OH; ++h) {
        const float* __restrict a = in + size_t(2 * h) * W;
        const float* __restrict b = a + W;
        float* __restrict o = out + size_t(h) * PW;
#pragma omp simd
        for (int x = 0; x < OW; ++x) o[x] = std::max(std::max(a[2 * x], a[2 * x + 1]), std::max(b[2 * x], b[2 * x + 1]));
    }
}

inline void maxpool_forward(float* out, int pad, const float* in, int BC, int H, int W) {
    const int OH = H / 2, OW = W / 2, PH = OH + 2 * pad, PW = OW + 2 * pad;
    team::each(BC, [&](long bc) {
        maxpool_plane(out + (size_t(bc) * PH + pad) * PW + pad, in + size_t(bc) * H * W, OH, OW, W, PW);
    });
}

// ---- fully connected: out[b][o] = bias[o] + w[o] . in[b], optional ReLU ----
// Register-tiled in dot-product form (w read as stored, [O][I], no transposed copy): FC_RO rows of
// w against four images, 4 * FC_RO vector accumulators summed along I and reduced in registers
// once at the end. FC_RO fills the registers: 16 accumulators of AVX-512's and NEON's 32, 8 of
// AVX2's and SSE's 16. One thread of this machine's Zen 4 (benchmarks/fc_tile.cpp): LeNet-5's fc1
// (784 -> 120, batch 32) 163 -> 115 us, 37 -> 52 GFLOP/s of a 116 peak; a tile alone in L1 runs at
// 82, so the rest is the stream of x from L2. Its AVX2 build (2 x 4 tiles of 8 lanes) runs fc1 in
// 91 us: Zen 4's 512-bit FMAs are two 256-bit halves, and the wider tile gains it nothing.
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int FC_RO = 4;
#else
constexpr int FC_RO = 2;
#endif
// s[r][j] = w[r] . x[j] over n, a function of its own whatever the caller: inlined into fc_forward's
// team region, or cloned for a constant n and unrolled, GCC kept the accumulators on the stack
// (fc1 at batch 32: 209 us, against 115 us so)
__attribute__((noipa)) inline void dot_tile(float s[FC_RO][4], const float* const w[FC_RO],
                                                    const float* const x[4], int n) {
    vfloat acc[FC_RO][4] = {};
    auto step = [&](auto load) __attribute__((always_inline)) {
        vfloat xv[4];
        for (int j = 0; j < 4; ++j) xv[j] = load(x[j]);
        for (int r = 0; r < FC_RO; ++r) {
            const vfloat wv = load(w[r]);
            for (int j = 0; j < 4; ++j) acc[r][j] += wv * xv[j];
        }
    };
    int k = 0;
    for (; k + VF <= n; k += VF) step([k](const float* p) __attribute__((always_inline)) { return vload(p + k); });
    if (k < n) step([k, m = n - k](const float* p) __attribute__((always_inline)) { return vload_part(p + k, m); });
    for (int r = 0; r < FC_RO; ++r)
        for (int j = 0; j < 4; ++j) s[r][j] = hsum<VF>(acc[r][j]);
}

// Each thread takes the rows of w its share of the outputs names (owned_segments: the rows its ZO
// perturbation wrote), in tiles of FC_RO rows by four images; a short tile repeats its last row or image.
inline void fc_forward(float* out, const float* in, const float* w, const float* bias, int B, int I, int O,
                       bool relu) {
    team::run([&](int t, int T) {
        const auto [lo, hi] = team::share(O, t, T);
        for (long o0 = lo; o0 < hi; o0 += FC_RO) {
            const float* wr[FC_RO];
            for (int r = 0; r < FC_RO; ++r) wr[r] = w + size_t(std::min<long>(o0 + r, hi - 1)) * I;
            for (int b0 = 0; b0 < B; b0 += 4) {
                const float* x[4];
                for (int j = 0; j < 4; ++j) x[j] = in + size_t(std::min(b0 + j, B - 1)) * I;
                float s[FC_RO][4];
                dot_tile(s, wr, x, I);
                for (int r = 0; r < FC_RO && o0 + r < hi; ++r)
                    for (int j = 0; j < 4 && b0 + j < B; ++j) {
                        const float v = s[r][j] + bias[o0 + r];
                        out[size_t(b0 + j) * O + o0 + r] = relu ? (v > 0.f ? v : 0.f) : v;
                    }
            }
        }
    });
}

// din (may be null) is overwritten; dw, db accumulate
inline void fc_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int B,
                        int I, int O) {
    team::each(O, [&](long o) {
        float* dwr = dw + size_t(o) * I;
        for (int b = 0; b < B; ++b) {
            const float d = dout[size_t(b) * O + o];
            db[o] += d;
            const float* x = in + size_t(b) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) dwr[i] += d * x[i];
        }
    });
    if (!din) return;
    team::each(B, [&](long b) {
        float* dx = din + size_t(b) * I;
        for (int i = 0; i < I; ++i) dx[i] = 0.f;
        for (int o = 0; o < O; ++o) {
            const float d = dout[size_t(b) * O + o];
            const float* wr = w + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) dx[i] += d * wr[i];
        }
    });
}

inline void relu_backward(float* d, const float* act, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!(act[i] > 0.f)) d[i] = 0.f;
}

// ---- softmax cross-entropy: returns the mean loss, leaves probabilities in probs ----
inline double softmax_ce_forward(float* probs, const float* logits, const int* labels, int B, int classes) {
    double total = 0.0;
    for (int b = 0; b < B; ++b) {
        const float* l = logits + b * classes;
        float* p = probs + b * classes;
        float m = l[0];
        for (int k = 1; k < classes; ++k) m = std::max(m, l[k]);
        float s = 0.f;
        for (int k = 0; k < classes; ++k) s += (p[k] = std::exp(l[k] - m));
        for (int k = 0; k < classes; ++k) p[k] /= s;
        total += double(std::log(s) + m - l[labels[b]]);
    }
    return total / B;
}

// dlogits = scale * (probs - onehot) / B
inline void softmax_ce_backward(float* dlogits, const float* probs, const int* labels, int B, int classes,
                                float scale) {
    for (int b = 0; b < B; ++b)
        for (int k = 0; k < classes; ++k)
            dlogits[b * classes + k] = scale * (probs[b * classes + k] - (k == labels[b] ? 1.f : 0.f)) / B;
}

}  // namespace fp32k
