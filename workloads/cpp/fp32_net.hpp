// The FP32 network of zobench-train: LeNet-5 in the llm.c style (lenet5.hpp's kernels).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "lenet5.hpp"
#include "pool.hpp"
#include "sha256.hpp"
#include "zrng.hpp"

namespace fp32 {
using namespace lenet5;

// The FC head's activations of one forward pass (alloc_heads: twice for ElasticZO), and the
// softmax of its logits.
struct Head : HeadBuffers<float, float> {
    std::vector<float> probs;  // [B,10]
};

using StepResult = StepRecord<double>;

struct Net {
    int B;
    int first_bp;         // index of the first layer trained by BP (NLAYERS: none)
    size_t n_zo, n_bp;
    std::vector<float> params;   // NPARAMS
    std::vector<float> grads;    // n_bp: the BP part only
    // activations (one pass); pool1 writes straight into p1pad's interior
    std::vector<float> xpad, c1, p1pad, c2;
    std::vector<float> w2t;  // conv2's weights as [6][5][5][16] for conv_forward_oc
    std::vector<float> w2f;  // conv2's weights flipped as [6][16][5][5] for its input gradient (full-bp)
    Head head[2];
    std::vector<int> labels;
    // errors for the BP part
    std::vector<float> dlogits, dh2, dh1, dp2, dc2, dc2pad, dp1, dc1;

    std::vector<float> lut;  // pixel -> normalised value (datasets.py's table)

    Net(int batch, const Spec& s, const std::vector<float>& init, std::vector<float> table)
        : B(batch), params(init), lut(std::move(table)) {
        first_bp = first_bp_layer(s);
        n_zo = size_t(layer_offset(first_bp));
        n_bp = NPARAMS - n_zo;
        grads.assign(n_bp, 0.f);
        xpad.assign(size_t(B) * 32 * 32, 0.f);
        c1.assign(size_t(B) * 6 * 28 * 28, 0.f);
        p1pad.assign(size_t(B) * 6 * 18 * 18, 0.f);
        c2.assign(size_t(B) * 16 * 14 * 14, 0.f);
        w2t.assign(W_SIZE[1], 0.f);
        for (int k = 0, n = alloc_heads(head, s, first_bp, B); k < n; ++k) head[k].probs.assign(size_t(B) * 10, 0.f);
        labels.assign(B, 0);
        if (n_bp) dlogits.assign(size_t(B) * 10, 0.f);
        if (first_bp <= 3) dh2.assign(size_t(B) * 84, 0.f);
        if (first_bp <= 2) dh1.assign(size_t(B) * 120, 0.f);
        if (first_bp <= 1) {
            dp2.assign(size_t(B) * 784, 0.f);
            dc2.assign(size_t(B) * 16 * 14 * 14, 0.f);
        }
        if (first_bp == 0) {
            dc2pad.assign(size_t(B) * 16 * 18 * 18, 0.f);
            w2f.assign(W_SIZE[1], 0.f);
            dp1.assign(size_t(B) * 6 * 14 * 14, 0.f);
            dc1.assign(size_t(B) * 6 * 28 * 28, 0.f);
        }
    }

    float* W(int l) { return params.data() + layer_offset(l); }
    float* Bias(int l) { return W(l) + W_SIZE[l]; }
    float* dW(int l) { return grads.data() + (layer_offset(l) - n_zo); }
    float* dBias(int l) { return dW(l) + W_SIZE[l]; }

    // x: [b, 784] normalised images (b <= B); writes head[k]
    void forward(int b, int k) {
        Head& hd = head[k];
        conv_forward<1, 6, 28, 28>(c1.data(), xpad.data(), W(0), Bias(0), b);
        maxpool_forward(p1pad.data(), 2, c1.data(), b * 6, 28, 28);
        transpose_conv_weights<6, 16>(w2t.data(), W(1));
        conv_forward_oc<6, 16, 14, 14>(c2.data(), p1pad.data(), w2t.data(), Bias(1), b);
        float* p2 = p2_of(head, k);
        maxpool_forward(p2, 0, c2.data(), b * 16, 14, 14);
        fc_forward(hd.h1.data(), p2, W(2), Bias(2), b, 784, 120, true);
        fc_forward(hd.h2.data(), hd.h1.data(), W(3), Bias(3), b, 120, 84, true);
        fc_forward(hd.logits.data(), hd.h2.data(), W(4), Bias(4), b, 84, 10, false);
    }

    double loss(int b, int k) { return softmax_ce_forward(head[k].probs.data(), head[k].logits.data(), labels.data(), b); }

    // BP through the layers >= first_bp for pass k, gradients scaled by `scale` and accumulated
    void backward(int k, float scale) {
        Head& hd = head[k];
        softmax_ce_backward(dlogits.data(), hd.probs.data(), labels.data(), B, scale);
        fc_backward(first_bp <= 3 ? dh2.data() : nullptr, dW(4), dBias(4), dlogits.data(), hd.h2.data(), W(4), B, 84, 10);
        if (first_bp > 3) return;
        relu_backward(dh2.data(), hd.h2.data(), dh2.size());
        fc_backward(first_bp <= 2 ? dh1.data() : nullptr, dW(3), dBias(3), dh2.data(), hd.h1.data(), W(3), B, 120, 84);
        if (first_bp > 2) return;
        relu_backward(dh1.data(), hd.h1.data(), dh1.size());
        fc_backward(first_bp <= 1 ? dp2.data() : nullptr, dW(2), dBias(2), dh1.data(), p2_of(head, k), W(2), B, 784, 120);
        if (first_bp > 1) return;
        // c2 is conv2's ReLU output: the error passes where the window's maximum is > 0
        maxpool_backward(dc2.data(), c2.data(), B * 16, 14, 14, [&](size_t o, float v) { return v > 0.f ? dp2[o] : 0.f; });
        conv_weight_grad<6, 16, 14, 14>(dW(1), dBias(1), dc2.data(), p1pad.data(), B);
        if (first_bp > 0) return;
        pad2(dc2pad.data(), dc2.data(), B * 16, 14, 14);
        flip_conv_weights<6, 16>(w2f.data(), W(1));
        conv_forward<16, 6, 14, 14, false>(dp1.data(), dc2pad.data(), w2f.data(), nullptr, B);
        maxpool_backward(dc1.data(), c1.data(), B * 6, 28, 28, [&](size_t o, float v) { return v > 0.f ? dp1[o] : 0.f; });
        conv_weight_grad<1, 6, 28, 28>(dW(0), dBias(0), dc1.data(), xpad.data(), B);
    }

    void bp_update(float lr) {
        float* p = params.data() + n_zo;
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n_bp; ++i) {
            p[i] -= lr * grads[i];
            grads[i] = 0.f;
        }
    }

    // theta[:n_zo] += alpha * z(key): z generated on the fly, never stored (the MeZO trick)
    void perturb(uint64_t key, float alpha) {
        const float scale = zrng::z_scale();
        float* p = params.data();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n_zo; ++i) p[i] += alpha * zrng::normal(key, i, scale);
    }

    // ---- the interface train() drives (int8_net.hpp has the same) ----
    void load(const Split& split, const int* idx, int b) {
        load_batch(xpad.data(), labels.data(), split, idx, b, [this](uint8_t v) { return lut[v]; });
    }

    // one optimizer step on the loaded batch (workloads/methods.py bp_step / zo_step)
    StepResult step(const Spec& s, uint64_t key, int /*epoch*/, double lr_zo, double lr_bp, PhaseClock& clock) {
        if (n_zo == 0) {  // full-bp
            forward(B, 0);
            clock.lap(FORWARD);
            const double loss = this->loss(B, 0);
            clock.lap(LOSS);
            backward(0, 1.f);
            clock.lap(BACKWARD);
            bp_update(float(lr_bp));
            clock.lap(BP_UPDATE);
            return {loss};
        }
        const bool head = n_bp > 0;
        perturb(key, float(s.h.eps));
        clock.lap(ZO_PERTURB);
        forward(B, 0);
        clock.lap(FORWARD);
        const double lp = loss(B, 0);
        clock.lap(LOSS);
        perturb(key, float(-2.0 * s.h.eps));
        clock.lap(ZO_PERTURB);
        forward(B, head ? 1 : 0);
        clock.lap(FORWARD);
        const double lm = loss(B, head ? 1 : 0);
        clock.lap(LOSS);
        double g = (lp - lm) / (2.0 * s.h.eps);
        g = std::min(std::max(g, -s.h.zo_grad_clip), s.h.zo_grad_clip);
        perturb(key, float(s.h.eps - lr_zo * g));
        clock.lap(ZO_UPDATE);
        if (head) {  // BP through the mean loss of the two perturbed passes
            backward(0, 0.5f);
            backward(1, 0.5f);
            clock.lap(BACKWARD);
            bp_update(float(lr_bp));
            clock.lap(BP_UPDATE);
        }
        return {0.5 * (lp + lm), true, lp, lm, g};
    }

    // the first b samples loaded: sum of their losses, and how many are classified right
    void eval(int b, double& loss_sum, long& correct) {
        forward(b, 0);
        loss_sum += loss(b, 0) * b;
        correct += count_correct(head[0].logits.data(), labels.data(), b);
    }

    size_t params_total() const { return NPARAMS; }
    size_t buffer_bytes() const {
        size_t n = bytes_of(params, grads, xpad, c1, p1pad, c2, w2t, w2f, labels, dlogits, dh2, dh1, dp2, dc2,
                            dc2pad, dp1, dc1);
        for (const Head& h : head) n += bytes_of(h.p2, h.h1, h.h2, h.logits, h.probs);
        return n;
    }
    std::string weights_sha256() const {
        return sha256_hex(reinterpret_cast<const uint8_t*>(params.data()), sizeof(float) * NPARAMS);
    }
};


}  // namespace fp32
