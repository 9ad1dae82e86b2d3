// What the FP32 and INT8 networks share for a convolution of any kernel size (their fast paths
// are the 5x5 templates of LeNet-5's shapes): its forward pass, its weight gradient, and the
// repacking of its weights for the input gradient and for kernels that want output channels
// innermost.
#pragma once
#include <algorithm>
#include <cstddef>

#include "team.hpp"

// out[b][oc][h][x] = init(oc) + sum_{ic,kh,kw} w[oc][ic][kh][kw] * inpad[b][ic][h+kh][x+kw], stride
// 1, the input padded (planes of (H + KH - 1) x (W + KW - 1)); relu: then max(0, .). One output
// row accumulated in place over every tap, the products in Acc: float for FP32; int32 for INT8
// (uint8 activations or int8 errors times int8 weights: a row of them fits).
template <class Acc, class A, class Wt, class Init>
inline void conv_forward_any(Acc* out, const A* inpad, const Wt* w, int B, int C, int OC, int H, int W, int KH, int KW,
                             Init init, bool relu = false) {
    const int HP = H + KH - 1, WP = W + KW - 1;
    team::each(long(B) * OC, [&](long i) {
        const int b = int(i / OC), oc = int(i % OC);
            for (int h = 0; h < H; ++h) {
                Acc* o = out + ((size_t(b) * OC + oc) * H + h) * W;
                std::fill(o, o + W, init(oc));
                for (int ic = 0; ic < C; ++ic)
                    for (int kh = 0; kh < KH; ++kh) {
                        const A* row = inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP;
                        for (int kw = 0; kw < KW; ++kw) {
                            const Acc wv = Acc(w[((size_t(oc) * C + ic) * KH + kh) * KW + kw]);
#pragma omp simd
                            for (int x = 0; x < W; ++x) o[x] += wv * Acc(row[x + kw]);
                        }
                    }
                if (relu)
                    for (int x = 0; x < W; ++x) o[x] = o[x] > Acc(0) ? o[x] : Acc(0);
            }
    });
}

// dw[oc][ic][kh][kw] += sum_{b,h,x} err[b][oc][h][x] * inpad[b][ic][h+kh][x+kw], the input
// already padded so that HP = H + KH - 1 and WP = W + KW - 1. Each row's products are summed in
// Row, then added in Sum: float and float for FP32; int32 (a row of 127^2 * W fits) and int64
// (over the batch) for INT8.
template <class Row, class Sum, class G, class E, class A>
inline void conv_weight_grad_any(G* dw, const E* err, const A* inpad, int B, int C, int OC, int H, int W, int KH,
                                 int KW) {
    const int HP = H + KH - 1, WP = W + KW - 1;
    team::each(long(OC) * C, [&](long i) {
        const int oc = int(i / C), ic = int(i % C);
            for (int kh = 0; kh < KH; ++kh)
                for (int kw = 0; kw < KW; ++kw) {
                    Sum s = 0;
                    for (int b = 0; b < B; ++b)
                        for (int h = 0; h < H; ++h) {
                            const E* e = err + ((size_t(b) * OC + oc) * H + h) * W;
                            const A* ip = inpad + ((size_t(b) * C + ic) * HP + h + kh) * WP + kw;
                            Row r = 0;
#pragma omp simd reduction(+ : r)
                            for (int x = 0; x < W; ++x) r += Row(e[x]) * Row(ip[x]);
                            s += r;
                        }
                    dw[((size_t(oc) * C + ic) * KH + kh) * KW + kw] += s;
                }
    });
}

// wt[c][o] = w[o][c]: a weight [O][C] with its output channels innermost
template <class T>
inline void transpose(T* wt, const T* w, int O, int C) {
    for (int o = 0; o < O; ++o)
        for (int c = 0; c < C; ++c) wt[size_t(c) * O + o] = w[size_t(o) * C + c];
}

// wf[ic][oc][KH-1-kh][KW-1-kw] = w[oc][ic][kh][kw]: the weights of the input-gradient convolution
template <class T>
inline void flip_weights(T* wf, const T* w, int C, int OC, int KH, int KW) {
    const int T_ = KH * KW;
    for (int oc = 0; oc < OC; ++oc)
        for (int ic = 0; ic < C; ++ic)
            for (int t = 0; t < T_; ++t) wf[(size_t(ic) * OC + oc) * T_ + T_ - 1 - t] = w[(size_t(oc) * C + ic) * T_ + t];
}
