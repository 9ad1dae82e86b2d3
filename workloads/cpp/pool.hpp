// The pools' backward passes (and the global max's forward), shared by the FP32 and INT8 networks.
#pragma once
#include <cstddef>
#include <algorithm>

// Each pooled output's error goes to the first maximum of its window (as PyTorch routes it)
// and every other input of the window gets 0. The windows tile the input, so every din
// element is written once: no memset. err_of(output index, the maximum's value) gives the
// error to route, which lets INT8 requantize it and both networks apply the ReLU mask in the
// same pass.
template <class T, class In, class ErrOf>
inline void maxpool_backward(T* din, const In* in, int BC, int H, int W, ErrOf err_of) {
    const int OH = H / 2, OW = W / 2;
#pragma omp parallel for schedule(static)
    for (int bc = 0; bc < BC; ++bc)
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
}

// ---- global max over the N points: [B][N][O] -> [B][O]; backward routes each error to the
// first maximum, as PyTorch does, where that (ReLU) value passes `keep` ----
template <class T>
inline void global_max_forward(T* out, const T* in, int B, int N, int O) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b) {
        T* o = out + size_t(b) * O;
        std::copy(in + size_t(b) * N * O, in + (size_t(b) * N + 1) * O, o);
        for (int n = 1; n < N; ++n) {
            const T* row = in + (size_t(b) * N + n) * O;
            for (int c = 0; c < O; ++c) o[c] = row[c] > o[c] ? row[c] : o[c];
        }
    }
}

template <class D, class T, class ErrOf>
inline void global_max_backward(D* din, const T* in, int B, int N, int O, ErrOf err_of) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; ++b)
        for (int c = 0; c < O; ++c) {
            int best = 0;
            for (int n = 1; n < N; ++n)
                if (in[(size_t(b) * N + n) * O + c] > in[(size_t(b) * N + best) * O + c]) best = n;
            const D d = err_of(size_t(b) * O + c, in[(size_t(b) * N + best) * O + c]);
            for (int n = 0; n < N; ++n) din[(size_t(b) * N + n) * O + c] = n == best ? d : D(0);
        }
}
