// The pools' backward passes, shared by the FP32 and INT8 networks.
#pragma once
#include <cstddef>
#include <algorithm>

#include "team.hpp"

// Each pooled output's error goes to the first maximum of its window (as PyTorch routes it)
// and every other input of the window gets 0. The windows tile the input, so every din
// element is written once: no memset. err_of(output index, the maximum's value) gives the
// error to route, which lets INT8 requantize it and both networks apply the ReLU mask in the
// same pass.
template <class T, class In, class ErrOf>
inline void maxpool_backward(T* din, const In* in, int BC, int H, int W, ErrOf err_of) {
    const int OH = H / 2, OW = W / 2;
    team::each(BC, [&](long bc) {
        for (int h = 0; h < OH; ++h)
            for (int x = 0; x < OW; ++x) {
                const size_t base = (size_t(bc) * H + 2 * h) * W + 2 * x;
                const size_t cand[4] = {base, base + 1, base + W, base + W + 1};
                int best = 0;
                for (int k = 1; k < 4; ++k)
                    if (in[cand[k]] > in[cand[best]]) best = k;
                const T d = err_of((size_t(bc) * OH + h) * OW + x, in[cand[best]]);
                for (int k = 0; k < 4; ++k) din[cand[k]] = k == best ? d : T(0);
            }
    });
}

// BP through a pointwise layer whose global max over the N points feeds the next layer. The
// layer's error is the pooled one, e[b][o], and reaches only the maximum's point argmax[b][o]
// of each cloud and channel (the first maximum, as PyTorch routes it; every other point's
// error is zero): the weight gradient dw[o] (db may be null: no bias) sums B rows per output
// channel, and the input gradient din (may be null) is zero but for one row of w per nonzero
// error, scattered into the rows of its own cloud, so the clouds run in parallel.
template <class D, class G, class E, class A, class Wt>
inline void pointwise_gmax_backward(D* din, G* dw, G* db, const E* e, const int* argmax, const A* in, const Wt* w,
                                    int B, int N, int C, int O) {
    team::each(O, [&](long o) {
        for (int b = 0; b < B; ++b) {
            const auto v = e[size_t(b) * O + o];
            if (v == E(0)) continue;
            if (db) db[o] += G(v);
            const A* x = in + (size_t(b) * N + argmax[size_t(b) * O + o]) * C;
            G* row = dw + size_t(o) * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) row[c] += G(v * x[c]);
        }
    });
    if (!din) return;
    team::each(B, [&](long b) {
        std::fill(din + size_t(b) * N * C, din + size_t(b + 1) * N * C, D(0));
        for (int o = 0; o < O; ++o) {
            const auto v = e[size_t(b) * O + o];
            if (v == E(0)) continue;
            D* row = din + (size_t(b) * N + argmax[size_t(b) * O + o]) * C;
            const Wt* wr = w + size_t(o) * C;
#pragma omp simd
            for (int c = 0; c < C; ++c) row[c] += D(v * wr[c]);
        }
    });
}
