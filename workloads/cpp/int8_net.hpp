// The INT8 network of zobench-train: LeNet-5 without biases, trained NITI-style with
// int8 weights, activations and errors and one power-of-two exponent per tensor
// (docs/int8.md; workloads/int8.py is the reference it agrees with bit for bit).
//
// Buffers are what the paper's Eqs. 13-15 count: int8 parameters; per layer an int8
// activation and the int32 accumulator it is requantized from; for the BP part an int32
// gradient accumulator per weight (int64 for the convolutions, summed over B*H*W), and int8
// errors with their int32 accumulators. The kernels add padded inputs and errors, repacked
// weights and, for BP through the convolutions, per-thread scratch of their weight gradient.
// All are allocated once, in the constructor, and buffer_bytes counts them all. Each
// activation is uint8: it is a ReLU output or pixel >> 1, so in [0, 127].
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"
#include "int8.hpp"
#include "pool.hpp"
#include "sha256.hpp"
#include "zrng.hpp"

namespace int8 {

constexpr int FAN_IN[NLAYERS] = {25, 150, 784, 120, 84}, FAN_OUT[NLAYERS] = {150, 400, 120, 84, 10};
constexpr int offset(int l) { return l == 0 ? 0 : offset(l - 1) + W_SIZE[l - 1]; }
constexpr int NWEIGHTS = offset(NLAYERS);
static_assert(NWEIGHTS == 107550, "LeNet-5 without biases");

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
inline void flip_weights(int8_t* wf, const int8_t* w, int C, int OC) {
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
    auto act = [s](int32_t a) { const int v = requant_value(a, s); return uint8_t(v > 0 ? v : 0); };
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

// dw[o][i] += sum_b err[b][o] * in[b][i]
inline void fc_weight_grad(int32_t* dw, const int8_t* err, const uint8_t* in, int B, int I, int O) {
#pragma omp parallel for schedule(static)
    for (int o = 0; o < O; ++o)
        for (int b = 0; b < B; ++b) {
            const int32_t e = err[size_t(b) * O + o];
            if (e == 0) continue;
            const uint8_t* x = in + size_t(b) * I;
            int32_t* row = dw + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) row[i] += e * int32_t(x[i]);
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

// The FC head's activations of one forward pass (alloc_heads: twice for ElasticZO).
struct Head : HeadBuffers<uint8_t, int8_t> {
    int exp = 0;  // the logits' exponent
};

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
    int B, first_bp, scale;
    size_t n_zo, n_bp;
    std::string zo_loss;
    std::vector<int8_t> q;  // NWEIGHTS
    int exps[NLAYERS];
    // activations and their int32 accumulators
    std::vector<uint8_t> xpad, c1, p1pad, c2;
    std::vector<int32_t> acc1, acc2, acc3, acc4, acc5;
    std::vector<int8_t> wp0, wp1, w1f;  // conv weights padded to 16 / flipped (full-bp)
    Head head[2];
    std::vector<int> labels;
    // the BP part: gradient accumulators, errors and theirs
    std::vector<int32_t> g_fc[NLAYERS];
    std::vector<int64_t> g_conv[2];
    std::vector<int8_t> err5, err4, err3, dc2, dc2pad, dc1;
    std::vector<int32_t> eacc4, eacc3, eacc2, eacc1;
    // conv_weight_grad's per-thread scratch (BP through conv2), for grad_threads threads
    int grad_threads = 0;
    size_t planes_stride = 0, sums_stride = 0;
    std::vector<uint8_t> grad_planes;
    std::vector<int64_t> grad_sums;

    Net(int batch, const Spec& s) : B(batch), scale(s.h.zo_scale), zo_loss(s.zo_loss), q(NWEIGHTS) {
        first_bp = first_bp_layer(s);
        n_zo = size_t(offset(first_bp));
        n_bp = NWEIGHTS - n_zo;
        const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_INIT, 1);
        for (int i = 0; i < NWEIGHTS; ++i)
            q[i] = int8_t(int((((zrng::bits(key, uint64_t(i)) & 0xFFFFFFFFull) * 255ull) >> 32)) - 127);
        for (int l = 0; l < NLAYERS; ++l) exps[l] = init_exponent(FAN_IN[l], FAN_OUT[l]);
        xpad.assign(size_t(B) * 32 * 32 + 64, 0);   // + slack: the VNNI kernel reads 3 bytes past a row
        c1.assign(size_t(B) * 6 * 28 * 28, 0);
        p1pad.assign(size_t(B) * 6 * 18 * 18 + 64, 0);
        c2.assign(size_t(B) * 16 * 14 * 14, 0);
        acc1.assign(c1.size(), 0);
        acc2.assign(c2.size(), 0);
        acc3.assign(size_t(B) * 120, 0);
        acc4.assign(size_t(B) * 84, 0);
        acc5.assign(size_t(B) * 10, 0);
        wp0.assign(conv_packed_size(1, 6), 0);
        wp1.assign(conv_packed_size(6, 16), 0);
        alloc_heads(head, s, first_bp, B);
        labels.assign(B, 0);
        for (int l = std::max(first_bp, 2); l < NLAYERS; ++l) g_fc[l].assign(W_SIZE[l], 0);
        for (int l = first_bp; l < 2; ++l) g_conv[l].assign(W_SIZE[l], 0);
        if (n_bp) err5.assign(size_t(B) * 10, 0);
        if (first_bp <= 3) eacc4.assign(size_t(B) * 84, 0), err4.assign(size_t(B) * 84, 0);
        if (first_bp <= 2) eacc3.assign(size_t(B) * 120, 0), err3.assign(size_t(B) * 120, 0);
        if (first_bp <= 1) eacc2.assign(size_t(B) * 784, 0), dc2.assign(c2.size(), 0);
        if (first_bp == 0) {
            dc2pad.assign(size_t(B) * 16 * 18 * 18, 0);
            eacc1.assign(size_t(B) * 6 * 14 * 14, 0);
            dc1.assign(c1.size(), 0);
            w1f.assign(6 * padded(16 * 25), 0);
        }
        if (first_bp <= 1) {
            grad_threads = omp_get_max_threads();
            planes_stride = conv_grad_planes(6, 14, 14);
            sums_stride = conv_grad_sums(6, 16);
            if (first_bp == 0) {
                planes_stride = std::max(planes_stride, conv_grad_planes(1, 28, 28));
                sums_stride = std::max(sums_stride, conv_grad_sums(1, 6));
            }
            grad_planes.assign(grad_threads * planes_stride, 0);
            grad_sums.assign(grad_threads * sums_stride, 0);
        }
    }

    int8_t* W(int l) { return q.data() + offset(l); }
    // conv layer l's weight gradient, accumulated into g_conv[l] (with the Net's scratch)
    template <int C, int OC, int H, int W>
    void conv_grad(int l, const int8_t* err, const uint8_t* inpad) {
        conv_weight_grad<C, OC, H, W>(g_conv[l].data(), err, inpad, B, grad_planes.data(), planes_stride,
                                      grad_sums.data(), sums_stride, grad_threads);
    }

    void forward(int b, int k) {
        Head& hd = head[k];
        conv_forward_packed<1, 6, 28, 28>(acc1.data(), xpad.data(), wp0.data(), W(0), b);
        int e = INPUT_EXP + exps[0];
        const bool conv_bp = first_bp <= 1;   // only BP through conv2 reads c1 and c2
        e += requant_relu_pool(conv_bp ? c1.data() : nullptr, p1pad.data(), 2, acc1.data(), b * 6, 28, 28);
        conv_forward_packed<6, 16, 14, 14>(acc2.data(), p1pad.data(), wp1.data(), W(1), b);
        e += exps[1] + requant_relu_pool(conv_bp ? c2.data() : nullptr, p2_of(head, k), 0, acc2.data(), b * 16, 14, 14);
        fc_forward(acc3.data(), p2_of(head, k), W(2), b, 784, 120);
        e += exps[2] + requant_to(hd.h1.data(), acc3.data(), size_t(b) * 120, true);
        fc_forward(acc4.data(), hd.h1.data(), W(3), b, 120, 84);
        e += exps[3] + requant_to(hd.h2.data(), acc4.data(), size_t(b) * 84, true);
        fc_forward(acc5.data(), hd.h2.data(), W(4), b, 84, 10);
        hd.exp = e + exps[4] + requant_to(hd.logits.data(), acc5.data(), size_t(b) * 10, false);
    }

    // accumulate the BP layers' gradients for pass k (NITI's backward; int8.py Int8Engine.backward)
    void backward(int k) {
        Head& hd = head[k];
        ce_error(err5.data(), hd.logits.data(), hd.exp, labels.data(), B, 10);
        fc_weight_grad(g_fc[4].data(), err5.data(), hd.h2.data(), B, 84, 10);
        if (first_bp > 3) return;
        fc_input_grad(eacc4.data(), err5.data(), W(4), B, 84, 10);
        error_through_relu(err4.data(), eacc4.data(), hd.h2.data(), eacc4.size());
        fc_weight_grad(g_fc[3].data(), err4.data(), hd.h1.data(), B, 120, 84);
        if (first_bp > 2) return;
        fc_input_grad(eacc3.data(), err4.data(), W(3), B, 120, 84);
        error_through_relu(err3.data(), eacc3.data(), hd.h1.data(), eacc3.size());
        fc_weight_grad(g_fc[2].data(), err3.data(), p2_of(head, k), B, 784, 120);
        if (first_bp > 1) return;
        fc_input_grad(eacc2.data(), err3.data(), W(2), B, 784, 120);
        error_through_pool(dc2.data(), eacc2.data(), c2.data(), B * 16, 14, 14);
        conv_grad<6, 16, 14, 14>(1, dc2.data(), p1pad.data());
        if (first_bp > 0) return;
        pad2(dc2pad.data(), dc2.data(), B * 16, 14, 14);
        flip_weights(w1f.data(), W(1), 6, 16);
        conv_forward<16, 6, 14, 14>(eacc1.data(), dc2pad.data(), w1f.data(), B);
        error_through_pool(dc1.data(), eacc1.data(), c1.data(), B * 6, 28, 28);
        conv_grad<1, 6, 28, 28>(0, dc1.data(), xpad.data());
    }

    void bp_update(int epoch) {
        const int bits = grad_bits(epoch);
        for (int l = first_bp; l < NLAYERS; ++l) {
            if (l < 2) apply_gradient(W(l), g_conv[l].data(), W_SIZE[l], bits);
            else apply_gradient(W(l), g_fc[l].data(), W_SIZE[l], bits);
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
        load_batch(xpad.data(), labels.data(), split, idx, b, [](uint8_t v) { return uint8_t(v >> 1); });
    }

    static int sign(double v) { return (v > 0) - (v < 0); }

    // one step (workloads/methods.py int8_bp_step / int8_zo_step)
    StepResult step(const Spec&, uint64_t key, int epoch, double, double, PhaseClock& clock) {
        if (n_zo == 0) {
            forward(B, 0);
            clock.lap(FORWARD);
            const double loss = float_loss(head[0].logits.data(), head[0].exp, labels.data(), B, 10);
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
            lf[j] = float_loss(head[k].logits.data(), head[k].exp, labels.data(), B, 10);
            li[j] = integer_loss(head[k].logits.data(), head[k].exp, labels.data(), B, 10);
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
        loss_sum += float_loss(head[0].logits.data(), head[0].exp, labels.data(), b, 10) * b;
        correct += count_correct(head[0].logits.data(), labels.data(), b);
    }

    size_t params_total() const { return NWEIGHTS; }
    size_t buffer_bytes() const {
        size_t n = bytes_of(q, xpad, c1, p1pad, c2, acc1, acc2, acc3, acc4, acc5, wp0, wp1, w1f, labels, err5, err4,
                            err3, dc2, dc2pad, dc1, eacc4, eacc3, eacc2, eacc1, g_conv[0], g_conv[1], grad_planes,
                            grad_sums);
        for (const auto& g : g_fc) n += bytes_of(g);
        for (const Head& h : head) n += bytes_of(h.p2, h.h1, h.h2, h.logits);
        return n;
    }
    std::string weights_sha256() const {  // int8 weights, then each layer's exponent as int32 LE
        std::vector<uint8_t> bytes(q.begin(), q.end());
        for (int e : exps)
            for (int k = 0; k < 4; ++k) bytes.push_back(uint8_t(uint32_t(e) >> (8 * k)));
        return sha256_hex(bytes.data(), bytes.size());
    }
};

}  // namespace int8
