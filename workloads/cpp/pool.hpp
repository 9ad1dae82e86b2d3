// 2x2 max pooling's backward pass and zero-padding by 2, shared by the FP32 and INT8 networks.
#pragma once
#include <cstddef>
#include <cstring>

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

// [BC,H,W] -> the interior of [BC,H+4,W+4]. Only the interior is written: the border of dst
// must be zero already (it is, in buffers allocated zeroed and only ever written here).
template <class T>
inline void pad2(T* dst, const T* src, int BC, int H, int W) {
    const int HP = H + 4, WP = W + 4;
    for (int bc = 0; bc < BC; ++bc)
        for (int h = 0; h < H; ++h)
            std::memcpy(dst + (size_t(bc) * HP + h + 2) * WP + 2, src + (size_t(bc) * H + h) * W, sizeof(T) * W);
}
