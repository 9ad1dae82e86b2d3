// LeNet-5 in the llm.c style: one contiguous parameter buffer, one gradient buffer for
// the BP part only, explicit activation buffers sized from the batch, and one forward
// and one backward function per layer. Every buffer is allocated once, up front, so the
// memory the binary uses is exactly what the ElasticZO paper's Eqs. 2-4 count.
//
// Layout (workloads/models.py): conv1.w [6,1,5,5], conv1.b, conv2.w [16,6,5,5], conv2.b,
// fc1.w [120,784], fc1.b, fc2.w [84,120], fc2.b, fc3.w [10,84], fc3.b -- 107,786 floats.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#if defined(__aarch64__)
#include <arm_neon.h>  // armv8-a Advanced SIMD only: FMA and vaddvq, no dot-product instructions
#endif

namespace lenet5 {

// acc[0..n) += wv * in[0..n): the inner loop of every convolution tap
__attribute__((always_inline)) inline void axpy(float* __restrict acc, float wv, const float* __restrict in, int n) {
    int x = 0;
#if defined(__aarch64__)
    const float32x4_t w4 = vdupq_n_f32(wv);
    for (; x + 4 <= n; x += 4) vst1q_f32(acc + x, vfmaq_f32(vld1q_f32(acc + x), w4, vld1q_f32(in + x)));
#endif
#pragma omp simd
    for (int i = x; i < n; ++i) acc[i] += wv * in[i];
}

// sum a[i] * b[i]: the FC layers' inner product, four independent NEON accumulators on Arm
__attribute__((always_inline)) inline float dot(const float* __restrict a, const float* __restrict b, int n) {
    int i = 0;
    float s = 0.f;
#if defined(__aarch64__)
    float32x4_t s0 = vdupq_n_f32(0.f), s1 = s0, s2 = s0, s3 = s0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
#endif
#pragma omp simd reduction(+ : s)
    for (int k = i; k < n; ++k) s += a[k] * b[k];
    return s;
}

constexpr int NLAYERS = 5;
// per trainable layer: offset of its weight in the flat vector, its weight and bias sizes
constexpr int W_SIZE[NLAYERS] = {6 * 1 * 25, 16 * 6 * 25, 120 * 784, 84 * 120, 10 * 84};
constexpr int B_SIZE[NLAYERS] = {6, 16, 120, 84, 10};
constexpr int layer_offset(int l) { return l == 0 ? 0 : layer_offset(l - 1) + W_SIZE[l - 1] + B_SIZE[l - 1]; }
constexpr int NPARAMS = layer_offset(NLAYERS);
static_assert(NPARAMS == 107786, "the paper's LeNet-5 has 107,786 parameters");
constexpr int NCLASSES = 10;

// ---- convolution 5x5, stride 1, padding 2 (input given pre-padded), ReLU fused ----
// out[b][oc][h][w] = relu(bias[oc] + sum_{ic,kh,kw} w[oc][ic][kh][kw] * inpad[b][ic][h+kh][w+kw])
// One output row of OB output channels is accumulated in registers across all 25*C taps and
// stored once: each input row loaded feeds OB accumulator rows. The sizes are template
// constants so the loops unroll into whole SIMD registers.
template <int C, int OC, int H, int W>
inline void conv_forward(float* out, const float* inpad, const float* w, const float* bias, int B) {
    constexpr int HP = H + 4, WP = W + 4;
    constexpr int OB = OC % 4 == 0 ? 4 : OC % 2 == 0 ? 2 : 1;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
        for (int og = 0; og < OC / OB; ++og) {
            for (int h = 0; h < H; ++h) {
                float acc[OB][W];
                for (int j = 0; j < OB; ++j)
                    for (int x = 0; x < W; ++x) acc[j][x] = bias[og * OB + j];
                for (int ic = 0; ic < C; ++ic)
                    for (int kh = 0; kh < 5; ++kh) {
                        const float* irow = inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP;
                        for (int kw = 0; kw < 5; ++kw)
                            for (int j = 0; j < OB; ++j)
                                axpy(acc[j], w[(((og * OB + j) * C + ic) * 5 + kh) * 5 + kw], irow + kw, W);
                    }
                for (int j = 0; j < OB; ++j) {
                    float* o = out + ((size_t(b) * OC + og * OB + j) * H + h) * W;
                    for (int x = 0; x < W; ++x) o[x] = acc[j][x] > 0.f ? acc[j][x] : 0.f;
                }
            }
        }
}

// dinpad (may be null) accumulates the input gradient; dw, db accumulate; dout is post-ReLU-mask
inline void conv_backward(float* dinpad, float* dw, float* db, const float* dout, const float* inpad,
                          const float* w, int B, int C, int OC, int H, int W) {
    const int HP = H + 4, WP = W + 4;
#pragma omp parallel for schedule(static)
    for (int oc = 0; oc < OC; ++oc)
        for (int b = 0; b < B; ++b) {
            const float* d = dout + (size_t(b) * OC + oc) * H * W;
            float s = 0.f;
            for (int i = 0; i < H * W; ++i) s += d[i];
            db[oc] += s;
            for (int ic = 0; ic < C; ++ic)
                for (int kh = 0; kh < 5; ++kh)
                    for (int kw = 0; kw < 5; ++kw) {
                        const float* ip = inpad + ((size_t(b) * C + ic) * HP + kh) * WP + kw;
                        float acc = 0.f;
                        for (int h = 0; h < H; ++h) {
#pragma omp simd reduction(+ : acc)
                            for (int x = 0; x < W; ++x) acc += d[h * W + x] * ip[h * WP + x];
                        }
                        dw[((oc * C + ic) * 5 + kh) * 5 + kw] += acc;
                    }
        }
    if (!dinpad) return;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b)
        for (int oc = 0; oc < OC; ++oc) {
            const float* d = dout + (size_t(b) * OC + oc) * H * W;
            for (int ic = 0; ic < C; ++ic)
                for (int kh = 0; kh < 5; ++kh)
                    for (int kw = 0; kw < 5; ++kw) {
                        const float wv = w[((oc * C + ic) * 5 + kh) * 5 + kw];
                        float* ip = dinpad + ((size_t(b) * C + ic) * HP + kh) * WP + kw;
                        for (int h = 0; h < H; ++h) {
#pragma omp simd
                            for (int x = 0; x < W; ++x) ip[h * WP + x] += wv * d[h * W + x];
                        }
                    }
        }
}

// zero-pad by 2 on each side: [B,C,H,W] -> [B,C,H+4,W+4]
inline void pad2(float* dst, const float* src, int B, int C, int H, int W) {
    const int HP = H + 4, WP = W + 4;
    std::memset(dst, 0, sizeof(float) * size_t(B) * C * HP * WP);
    for (int bc = 0; bc < B * C; ++bc)
        for (int h = 0; h < H; ++h)
            std::memcpy(dst + (size_t(bc) * HP + h + 2) * WP + 2, src + (size_t(bc) * H + h) * W, sizeof(float) * W);
}

inline void unpad2(float* dst, const float* src, int B, int C, int H, int W) {
    const int HP = H + 4, WP = W + 4;
    for (int bc = 0; bc < B * C; ++bc)
        for (int h = 0; h < H; ++h)
            std::memcpy(dst + (size_t(bc) * H + h) * W, src + (size_t(bc) * HP + h + 2) * WP + 2, sizeof(float) * W);
}

// ---- 2x2 max pooling; backward routes to the first maximum, as PyTorch does ----
inline void maxpool_forward(float* out, const float* in, int BC, int H, int W) {
    const int OH = H / 2, OW = W / 2;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < BC; ++bc)
        for (int h = 0; h < OH; ++h)
            for (int x = 0; x < OW; ++x) {
                const float* p = in + (size_t(bc) * H + 2 * h) * W + 2 * x;
                out[(size_t(bc) * OH + h) * OW + x] = std::max(std::max(p[0], p[1]), std::max(p[W], p[W + 1]));
            }
}

inline void maxpool_backward(float* din, const float* dout, const float* in, int BC, int H, int W) {
    const int OH = H / 2, OW = W / 2;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < BC; ++bc) {
        std::memset(din + size_t(bc) * H * W, 0, sizeof(float) * H * W);
        for (int h = 0; h < OH; ++h)
            for (int x = 0; x < OW; ++x) {
                const size_t base = (size_t(bc) * H + 2 * h) * W + 2 * x;
                const size_t cand[4] = {base, base + 1, base + W, base + W + 1};
                size_t best = cand[0];
                for (int k = 1; k < 4; ++k)
                    if (in[cand[k]] > in[best]) best = cand[k];
                din[best] += dout[(size_t(bc) * OH + h) * OW + x];
            }
    }
}

// ---- fully connected: out[b][o] = bias[o] + w[o] . in[b], optional ReLU ----
inline void fc_forward(float* out, const float* in, const float* w, const float* bias, int B, int I, int O,
                       bool relu) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b)
        for (int o = 0; o < O; ++o) {
            const float s = dot(w + size_t(o) * I, in + size_t(b) * I, I) + bias[o];
            out[size_t(b) * O + o] = relu ? (s > 0.f ? s : 0.f) : s;
        }
}

// din (may be null) is overwritten; dw, db accumulate
inline void fc_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int B,
                        int I, int O) {
#pragma omp parallel for schedule(static)
    for (int o = 0; o < O; ++o) {
        float* dwr = dw + size_t(o) * I;
        for (int b = 0; b < B; ++b) {
            const float d = dout[size_t(b) * O + o];
            db[o] += d;
            const float* x = in + size_t(b) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) dwr[i] += d * x[i];
        }
    }
    if (!din) return;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) {
        float* dx = din + size_t(b) * I;
        for (int i = 0; i < I; ++i) dx[i] = 0.f;
        for (int o = 0; o < O; ++o) {
            const float d = dout[size_t(b) * O + o];
            const float* wr = w + size_t(o) * I;
#pragma omp simd
            for (int i = 0; i < I; ++i) dx[i] += d * wr[i];
        }
    }
}

inline void relu_backward(float* d, const float* act, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!(act[i] > 0.f)) d[i] = 0.f;
}

// ---- softmax cross-entropy: returns the mean loss, leaves probabilities in probs ----
inline double softmax_ce_forward(float* probs, const float* logits, const int* labels, int B) {
    double total = 0.0;
    for (int b = 0; b < B; ++b) {
        const float* l = logits + b * NCLASSES;
        float* p = probs + b * NCLASSES;
        float m = l[0];
        for (int k = 1; k < NCLASSES; ++k) m = std::max(m, l[k]);
        float s = 0.f;
        for (int k = 0; k < NCLASSES; ++k) s += (p[k] = std::exp(l[k] - m));
        for (int k = 0; k < NCLASSES; ++k) p[k] /= s;
        total += double(std::log(s) + m - l[labels[b]]);
    }
    return total / B;
}

// dlogits = scale * (probs - onehot) / B
inline void softmax_ce_backward(float* dlogits, const float* probs, const int* labels, int B, float scale) {
    for (int b = 0; b < B; ++b)
        for (int k = 0; k < NCLASSES; ++k)
            dlogits[b * NCLASSES + k] = scale * (probs[b * NCLASSES + k] - (k == labels[b] ? 1.f : 0.f)) / B;
}

}  // namespace lenet5
