// The FP32 network of zobench-train, in the llm.c style: one contiguous parameter buffer, one
// gradient buffer for the BP part only (and with Adam one buffer per moment, the same size),
// and per layer explicit activation and error buffers
// sized from the batch, all allocated once, up front, from one named table (Buffers) that also
// counts them under the memory model's parts (the activations and errors the ElasticZO paper's
// Eqs. 2-4 count, with ReLU fused into the layer it follows, plus the padded inputs and
// repacked weights the kernels read). The layers are the spec's (common.hpp parse_arch); each
// kind has one forward and one backward step here, on fp32_kernels.hpp's kernels.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "fp32_kernels.hpp"
#include "pool.hpp"
#include "sha256.hpp"
#include "zrng.hpp"

namespace fp32 {
using namespace fp32k;

using StepResult = StepRecord<double>;

// Adam on one parameter p with gradient g and moments m, v, as llm.c updates (AdamW without the
// weight decay): each scalar rounded to float32 once an update and the operations in the order of
// workloads/methods.py adam_update, so the runtimes agree step for step. t: this update's count.
struct AdamRule {
    float rate, b1, b2, ob1, ob2, eps, c1, c2;
    AdamRule(double lr, const Hyper& h, long t)
        : rate(float(lr)), b1(float(h.adam_beta1)), b2(float(h.adam_beta2)), ob1(float(1.0 - h.adam_beta1)),
          ob2(float(1.0 - h.adam_beta2)), eps(float(h.adam_eps)), c1(float(1.0 - std::pow(h.adam_beta1, double(t)))),
          c2(float(1.0 - std::pow(h.adam_beta2, double(t)))) {}
    void operator()(float& p, float g, float& m, float& v) const {
        m = m * b1 + ob1 * g;
        v = v * b2 + ob2 * (g * g);
        p -= rate * (m / c1) / (std::sqrt(v / c2) + eps);
    }
};

// ZO-SGD-MMT on one parameter p with direction d and momentum m: torch.optim's SGD momentum, in
// the order of workloads/methods.py _stateful
struct MomentumRule {
    float rate, beta;
    MomentumRule(double lr, const Hyper& h) : rate(float(lr)), beta(float(h.zo_momentum)) {}
    void operator()(float& p, float d, float& m) const {
        m = m * beta;
        m += d;
        p -= rate * m;
    }
};

struct Net {
    const Arch& a;
    int B, n, first_bp;
    size_t n_zo, n_bp;
    std::vector<size_t> off;     // per layer, its weight's offset (its bias follows the weight)
    std::vector<float> params;   // the flat vector of workloads/models.py
    std::vector<float> grads;    // n_bp: the BP part only
    // optimizer adam: the BP part's first and second moments (n_bp each; empty with sgd or
    // without a BP part) and the BP updates made so far, which bias-correct them
    std::vector<float> adam_m, adam_v;
    long adam_t = 0;
    // the ZO parts (docs/zo-optimizers.md, workloads/methods.py zo_step): momentum's m or Adam's
    // m and v over the ZO part (n_zo each) with Adam's count; the step's direction d (n_zo, with
    // a rule that keeps state); Sparse MeZO's mask (a byte per ZO parameter); and the step's
    // parameter ranges (LeZO's units; all of the ZO part otherwise)
    std::vector<float> zo_m, zo_v, zo_d;
    long zo_t = 0;
    std::vector<uint8_t> zo_mask;
    std::vector<float> zo_gauss;     // Gaussian z's table (zo_distribution = "gaussian"), else empty
    bool mask_set = false;
    std::vector<std::pair<size_t, size_t>> ranges;
    // weight decay (hyper.weight_decay > 0): the ZO layers' weights, not their biases (models.decayed)
    std::vector<std::pair<size_t, size_t>> decayed;
    ActivationPlan<float, float> act;
    std::vector<float> probs[2];
    std::vector<float> wk;       // repacked weights (transposed, flipped): the largest a layer needs
    std::vector<int> labels;
    // errors for the BP part: per BP layer, of its activation out(l) (of its global max, where
    // one follows: pointwise_gmax_backward); of a 2x2-pooled output; and a conv2d's error padded
    // for its input gradient (the largest one)
    std::vector<std::vector<float>> err, dpooled;
    std::vector<float> errpad;
    // per BP layer with a global max, per pass, each cloud's and channel's maximum point [B][O]
    std::vector<std::vector<int>> argmax;
    // pointwise_weight_grad's per-thread sums, one set per thread of the team
    std::vector<float> grad_scratch;
    std::vector<float> lut;      // pixel -> normalised value (datasets.py's table)

    Buffers buffers;             // every buffer above: what the constructor allocates, and their bytes

    Net(int batch, const Spec& s, const std::vector<float>& init, std::vector<float> table)
        : a(s.arch), B(batch), n(s.arch.n()), params(init), lut(std::move(table)) {
        first_bp = first_bp_layer(s);
        size_t o = 0;
        for (const Layer& L : a.layers) off.push_back(o), o += L.w_size() + L.O;
        n_zo = first_bp < n ? off[first_bp] : params.size();
        n_bp = params.size() - n_zo;
        buffers.hold(params, "params", PARAMETERS);
        buffers.need(grads, "grads", GRADIENTS, n_bp);
        if (s.h.optimizer == "adam") buffers.need(adam_m, "adam_m", OPTIMIZER, n_bp), buffers.need(adam_v, "adam_v", OPTIMIZER, n_bp);
        if (n_zo > 0) {
            const std::string& u = s.h.zo_update;
            // d is formed apart only where restore_and_step cannot fuse it: several queries, LeZO's
            // ranges, or weight decay (momentum adds wd θ to d, Adam decays θ first)
            const bool apart = s.h.zo_queries > 1 || s.h.zo_sparsity == "layers" || s.h.weight_decay > 0;
            if (u == "momentum" || u == "adam") buffers.need(zo_m, "zo_m", OPTIMIZER, n_zo);
            if ((u == "momentum" || u == "adam") && apart) buffers.need(zo_d, "zo_d", ZO, n_zo);
            if (u == "adam") buffers.need(zo_v, "zo_v", OPTIMIZER, n_zo);
            if (s.h.zo_sparsity == "magnitude" || s.h.zo_sparsity == "random") buffers.need(zo_mask, "zo_mask", ZO, n_zo);
            if (s.h.zo_distribution == "gaussian") buffers.need(zo_gauss, "zo_gauss", ZO, std::size(zrng::GAUSS_BITS));
        }
        ranges = {{0, n_zo}};
        if (s.h.weight_decay > 0)
            for (int l = 0; l < first_bp; ++l) decayed.push_back({off[l], off[l] + a.layers[l].w_size()});
        const bool two = s.method == "elastic-zo";  // two perturbed passes feed BP
        // a global max is fused into its pointwise layer (pointwise_forward): BP reads its argmax
        act.plan(buffers, a, B, first_bp, two, 0, [&](int l) { return a.layers[l].pool != GLOBAL_MAX; });
        for (int k = 0; k < (two ? 2 : 1); ++k) buffers.need(probs[k], k ? "probs_pass1" : "probs", WORKING, size_t(B) * a.classes);
        buffers.need(labels, "labels", WORKING, B);
        err.resize(n), dpooled.resize(n), argmax.resize(n);
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            if ((L.kind == CONV2D && (L.O >= 16 || l > first_bp)) || L.kind == POINTWISE)
                buffers.need(wk, "wk", WORKING, L.w_size());
            if (l < first_bp) continue;
            buffers.need(err[l], of_layer("err", l), ERRORS, size_t(B) * (L.pool == GLOBAL_MAX ? L.O : L.out_size()));
            if (L.pool == GLOBAL_MAX) buffers.need(argmax[l], of_layer("argmax", l), WORKING, size_t(two ? 2 : 1) * B * L.O);
            else if (L.kind == POINTWISE) {
                buffers.need(grad_scratch, "grad_scratch", WORKING, size_t(team::size()) * (L.C + 1) * L.O);
            }
            if (l == first_bp) continue;
            if (a.layers[l - 1].pool == MAX2X2) buffers.need(dpooled[l], of_layer("dpooled", l), ERRORS, size_t(B) * L.in_size());
            if (L.kind == CONV2D)
                buffers.need(errpad, "errpad", WORKING, size_t(B) * L.O * (L.OH + 2 * (L.KH - 1 - L.pad)) * (L.OW + 2 * (L.KW - 1 - L.pad)));
        }
        buffers.allocate();
        if (!zo_gauss.empty()) std::memcpy(zo_gauss.data(), zrng::GAUSS_BITS, sizeof zrng::GAUSS_BITS);
    }

    float* Wt(int l) { return params.data() + off[l]; }
    float* Bias(int l) { return Wt(l) + a.layers[l].w_size(); }
    float* dW(int l) { return grads.data() + (off[l] - n_zo); }
    float* dBias(int l) { return dW(l) + a.layers[l].w_size(); }
    // the BP layers read pass k's inputs; the ZO part's are shared
    float* in(int l, int k) { return act.in(l, l > 0 && l >= first_bp ? k : 0); }
    float* logits(int k) { return act.logits[k].data(); }
    int* Argmax(int l, int k) { return argmax[l].empty() ? nullptr : argmax[l].data() + size_t(k) * B * a.layers[l].O; }

    // the first b samples loaded; writes pass k's activations
    void forward(int b, int k) {
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            const bool last = l + 1 == n;
            float* next = last ? logits(k) : in(l + 1, k);
            float* out = act.layer[l].own_out.empty() ? next : act.layer[l].own_out.data();
            if (L.kind == CONV2D) {
                conv(out, in(l, k), Wt(l), Bias(l), wk.data(), b, L.C, L.O, L.OH, L.OW, L.KH, L.KW, L.relu);
            } else if (L.kind == POINTWISE) {
                transpose(wk.data(), Wt(l), L.O, L.C);
                const bool pooled = L.pool == GLOBAL_MAX;
                pointwise_forward(out, pooled ? next : nullptr, pooled ? Argmax(l, k) : nullptr, in(l, k), wk.data(),
                                  Bias(l), b, L.rows, L.C, L.O, L.relu);
            } else {
                fc_forward(out, in(l, k), Wt(l), Bias(l), b, L.C, L.O, L.relu);
            }
            if (last) break;
            const Layer& N = a.layers[l + 1];
            if (L.pool == MAX2X2) maxpool_forward(next, N.pad, out, b * L.O, L.OH, L.OW);
            else if (N.pad > 0) pad_rect(next, out, b * L.O, L.OH, L.OW, N.pad, N.pad);
        }
    }

    double loss(int b, int k) { return softmax_ce_forward(probs[k].data(), logits(k), labels.data(), b, a.classes); }

    // BP through the layers >= first_bp for pass k, gradients scaled by `scale` and accumulated
    void backward(int k, float scale) {
        softmax_ce_backward(err[n - 1].data(), probs[k].data(), labels.data(), B, a.classes, scale);
        for (int l = n - 1; l >= first_bp; --l) {
            const Layer& L = a.layers[l];
            float* d = err[l].data();
            const float* x = in(l, k);
            // din: the error of this layer's input (of the previous layer's pooled output)
            float* din = l == first_bp ? nullptr : dpooled[l].empty() ? err[l - 1].data() : dpooled[l].data();
            const int R = B * L.rows;
            if (L.kind == CONV2D) {
                conv_weight_grad(dW(l), dBias(l), d, x, B, L.C, L.O, L.OH, L.OW, L.KH, L.KW);
                if (din) {  // a convolution of the error padded by kernel - 1 - padding, weights flipped
                    const int ph = L.KH - 1 - L.pad, pw = L.KW - 1 - L.pad;
                    pad_rect(errpad.data(), d, B * L.O, L.OH, L.OW, ph, pw);
                    flip_weights(wk.data(), Wt(l), L.C, L.O, L.KH, L.KW);
                    conv(din, errpad.data(), wk.data(), nullptr, nullptr, B, L.O, L.C, L.H, L.W, L.KH, L.KW, false);
                }
            } else if (L.kind == POINTWISE && L.pool == GLOBAL_MAX) {
                pointwise_gmax_backward(din, dW(l), dBias(l), d, Argmax(l, k), x, Wt(l), B, L.rows, L.C, L.O);
            } else if (L.kind == POINTWISE) {  // din = d w: pointwise_forward with w as the transposed weights
                pointwise_weight_grad(dW(l), dBias(l), d, x, grad_scratch.data(), R, L.C, L.O);
                if (din) pointwise_forward(din, nullptr, nullptr, d, Wt(l), nullptr, B, L.rows, L.O, L.C, false);
            } else {
                fc_backward(din, dW(l), dBias(l), d, x, Wt(l), B, L.C * L.H * L.W, L.O);
            }
            if (!din) break;
            const Layer& P = a.layers[l - 1];
            float* dp = err[l - 1].data();
            const float* out = act.layer[l - 1].own_out.empty() ? x : act.layer[l - 1].own_out.data();
            auto pass = [&](size_t o, float v) { return !P.relu || v > 0.f ? din[o] : 0.f; };
            if (P.pool == MAX2X2) maxpool_backward(dp, out, B * P.O, P.OH, P.OW, pass);
            else if (P.relu) relu_backward(dp, out, size_t(B) * P.pooled_size());  // a global max's: of its output, x
        }
    }

    // The trainable state, as train.cpp's warm_up saves and restores it: the parameters, and
    // Adam's moments and update count. Nothing else outlives a step: grads is zeroed by every
    // bp_update (and empty without a BP part), and every other buffer is written by a step
    // before it is read.
    struct Saved {
        std::vector<float> params, m, v, zm, zv;
        long t, zt;
    };
    Saved save() const { return {params, adam_m, adam_v, zo_m, zo_v, adam_t, zo_t}; }
    void restore(const Saved& saved) {  // in place: the buffers stay where they are
        std::copy(saved.params.begin(), saved.params.end(), params.begin());
        std::copy(saved.m.begin(), saved.m.end(), adam_m.begin());
        std::copy(saved.v.begin(), saved.v.end(), adam_v.begin());
        std::copy(saved.zm.begin(), saved.zm.end(), zo_m.begin());
        std::copy(saved.zv.begin(), saved.zv.end(), zo_v.begin());
        adam_t = saved.t, zo_t = saved.zt;
    }

    // Adam (AdamRule) on p[0, n) with gradient g; t counts this update. zero: g is a gradient
    // buffer to clear as it is read.
    static void adam(float* p, float* g, float* m, float* v, size_t n, double lr, const Hyper& h, long t, bool zero) {
        const AdamRule rule(lr, h, t);
        team::ranges(long(n), [=](long lo, long hi) {
#pragma omp simd
            for (long i = lo; i < hi; ++i) {
                rule(p[i], g[i], m[i], v[i]);
                if (zero) g[i] = 0.f;
            }
        });
    }

    // SGD or Adam on the BP part
    void bp_update(double lr, const Hyper& h) {
        float* p = params.data() + n_zo;
        const float rate = float(lr);
        if (adam_m.empty()) {
            float* g = grads.data();
            team::ranges(long(n_bp), [=](long lo, long hi) {
#pragma omp simd
                for (long i = lo; i < hi; ++i) {
                    p[i] -= rate * g[i];
                    g[i] = 0.f;
                }
            });
            return;
        }
        adam(p, grads.data(), adam_m.data(), adam_v.data(), n_bp, lr, h, ++adam_t, true);
    }

    // g(from, n) over the ZO part's indices in the step's ranges: one team region, each thread on
    // its own rows (owned_segments)
    template <class G>
    void each_zo_range(G g) {
        team::run([&](int t, int T) {
            owned_segments(a, off, first_bp, true, t, T, [&](size_t lo, size_t n) {
                for (const auto& [r0, r1] : ranges) {
                    const size_t from = std::max(lo, r0), to = std::min(lo + n, r1);
                    if (from < to) g(from, to - from);
                }
            });
        });
    }

    // f(i, bits32(key, i)) for every i of the ZO part in the step's ranges
    template <class F>
    void each_z(uint64_t key, F f) {
        each_zo_range([&](size_t from, size_t n) { zrng::each_bits32(key, from, n, f); });
    }

    // target[i] += alpha * z(key)[i] over the step's ranges, where the mask (if any) is set: z
    // generated on the fly, never stored (the MeZO trick)
    void add_z(float* target, uint64_t key, float alpha) {
        if (zo_gauss.empty()) add_z<false>(target, key, alpha);
        else add_z<true>(target, key, alpha);
    }
    template <bool GAUSS>   // Irwin-Hall's z or the Gaussian's, a loop apiece
    void add_z(float* target, uint64_t key, float alpha) {
        const float scale = zrng::z_scale();
        const float* g = zo_gauss.data();
        const auto z = [=](uint32_t x) { return GAUSS ? zrng::gauss(x, g) : zrng::normal(x, scale); };
        const uint8_t* m = zo_mask.empty() ? nullptr : zo_mask.data();
        if (m) each_z(key, [=](size_t i, uint32_t x) { target[i] += alpha * (z(x) * float(m[i])); });
        else if constexpr (GAUSS) each_z(key, [=](size_t i, uint32_t x) { target[i] += alpha * z(x); });
        else each_zo_range([=](size_t from, size_t n) { zrng::add_normal(target, key, from, n, alpha); });   // the hot one
    }

    // theta[:n_zo] += alpha * z(key)
    void perturb(uint64_t key, float alpha) { add_z(params.data(), key, alpha); }

    // Before step t (workloads/methods.py sparsify): LeZO's units of the step as ranges, or
    // Sparse MeZO's mask, recomputed every zo_mask_every steps: in each ZO tensor the
    // ceil(fraction * size) smallest |weights|, ties to the lower index (numpy's stable argsort)
    void sparsify(const Spec& s, long t) {
        const Hyper& h = s.h;
        if (h.zo_sparsity == "layers") {
            ranges.clear();
            for (int l : zrng::choose(zrng::stream_key(s.seed, zrng::STREAM_ZO_UNITS, uint64_t(t)), first_bp, h.zo_layers)) {
                const size_t lo = off[l], hi = off[l] + a.layers[l].w_size() + a.layers[l].O;
                if (!ranges.empty() && ranges.back().second == lo) ranges.back().second = hi;
                else ranges.push_back({lo, hi});
            }
        } else if (h.zo_sparsity == "random" && (t % h.zo_mask_every == 0 || !mask_set)) {
            // ZO-Bench's random mask (methods.py Sparsity.random_mask): zeroed where the 53-bit
            // draw, as a fraction of 2^53, falls below the zeroed share (both doubles, as numpy's)
            const double sparsity = 1.0 - h.zo_mask_fraction;
            const double zeroed = h.zo_mask_draw == "exact" ? sparsity : 0.5 * std::erfc(-sparsity / std::sqrt(2.0));
            const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_ZO_MASK, uint64_t(t / h.zo_mask_every));
            for (size_t i = 0; i < zo_mask.size(); ++i)
                zo_mask[i] = double(zrng::bits(key, i) >> 11) >= zeroed * 9007199254740992.0;
            mask_set = true;
        } else if (h.zo_sparsity == "magnitude" && (t % h.zo_mask_every == 0 || !mask_set)) {
            std::fill(zo_mask.begin(), zo_mask.end(), uint8_t(0));
            std::vector<size_t> idx;
            for (int l = 0; l < first_bp; ++l)
                for (const auto [lo, n] : {std::pair{off[l], a.layers[l].w_size()}, std::pair{off[l] + a.layers[l].w_size(), size_t(a.layers[l].O)}}) {
                    idx.resize(n);
                    for (size_t i = 0; i < n; ++i) idx[i] = lo + i;
                    const float* p = params.data();
                    const size_t k = size_t(std::ceil(h.zo_mask_fraction * double(n)));
                    // the k first by (|weight|, index): a stable sort's first k, in linear time
                    std::nth_element(idx.begin(), idx.begin() + std::ptrdiff_t(k - 1), idx.end(), [p](size_t x, size_t y) {
                        const float ax = std::fabs(p[x]), ay = std::fabs(p[y]);
                        return ax < ay || (ax == ay && x < y);
                    });
                    for (size_t i = 0; i < k; ++i) zo_mask[idx[i]] = 1;
                }
            mask_set = true;
        }
    }

    // One query's restore (theta += back z) and momentum's or Adam's update on d = c z, in one pass
    // over the ZO part: per parameter the operations of the restore and of stateful_update, in
    // their order, so the result is theirs (and methods.py's) without a second draw of z or d
    void restore_and_step(uint64_t key, float back, float c, double lr, const Hyper& h) {
        const bool g = !zo_gauss.empty();
        if (zo_mask.empty()) g ? restore_and_step<false, true>(key, back, c, lr, h) : restore_and_step<false, false>(key, back, c, lr, h);
        else g ? restore_and_step<true, true>(key, back, c, lr, h) : restore_and_step<true, false>(key, back, c, lr, h);
    }
    template <bool MASKED, bool GAUSS>  // a loop apiece: a test of the mask in the unmasked loop costs it its vectors
    void restore_and_step(uint64_t key, float back, float c, double lr, const Hyper& h) {
        const float scale = zrng::z_scale();
        float *p = params.data(), *m = zo_m.data(), *v = zo_v.data();
        const uint8_t* mk = zo_mask.data();
        const float* gt = zo_gauss.data();
        const auto z_of = [=](uint32_t x) { return GAUSS ? zrng::gauss(x, gt) : zrng::normal(x, scale); };
        const auto z_at = [=](size_t i, uint32_t x) { return MASKED ? z_of(x) * float(mk[i]) : z_of(x); };
        if (h.zo_update == "momentum") {
            const MomentumRule rule(lr, h);
            each_z(key, [=](size_t i, uint32_t x) {
                const float z = z_at(i, x);
                p[i] += back * z;
                rule(p[i], c * z, m[i]);
            });
            return;
        }
        const AdamRule rule(lr, h, ++zo_t);
        each_z(key, [=](size_t i, uint32_t x) {
            const float z = z_at(i, x);
            p[i] += back * z;
            rule(p[i], c * z, m[i], v[i]);
        });
    }

    // f(lo, hi) over what weight decay reaches this step (workloads/methods.py decayed): the ZO
    // layers' weights within the step's ranges
    template <class F>
    void each_decayed(F f) const {
        for (const auto& [a0, a1] : decayed)
            for (const auto& [r0, r1] : ranges)
                if (std::max(a0, r0) < std::min(a1, r1)) f(std::max(a0, r0), std::min(a1, r1));
    }

    // theta *= factor over each_decayed (methods.py decay): 1 - lr wd, coupled (sgd, sign) or AdamW's
    void decay(float factor) {
        float* p = params.data();
        each_decayed([=](size_t lo, size_t hi) {
            team::ranges(long(hi - lo), [=](long i0, long i1) {
#pragma omp simd
                for (long i = long(lo) + i0; i < long(lo) + i1; ++i) p[i] *= factor;
            });
        });
    }

    // momentum or Adam on the step's direction d = sum_i c_i z_i (workloads/methods.py _stateful),
    // with weight decay coupled into d for momentum and decoupled (AdamW's) for Adam
    void stateful_update(const std::vector<uint64_t>& keys, const std::vector<double>& c, double lr, const Hyper& h) {
        std::fill(zo_d.begin(), zo_d.end(), 0.f);
        for (size_t i = 0; i < keys.size(); ++i) add_z(zo_d.data(), keys[i], float(c[i]));
        float *p = params.data(), *m = zo_m.data();
        const float* d = zo_d.data();
        if (h.weight_decay > 0 && h.zo_update == "momentum") {
            const float wd = float(h.weight_decay);
            float* dd = zo_d.data();
            each_decayed([=](size_t lo, size_t hi) {
                for (size_t i = lo; i < hi; ++i) dd[i] += wd * p[i];
            });
        } else if (h.weight_decay > 0) {
            decay(float(1.0 - lr * h.weight_decay));
        }
        if (h.zo_update == "momentum") {
            const MomentumRule rule(lr, h);
            team::ranges(long(n_zo), [=](long lo, long hi) {
#pragma omp simd
                for (long i = lo; i < hi; ++i) rule(p[i], d[i], m[i]);
            });
            return;
        }
        adam(p, zo_d.data(), m, zo_v.data(), n_zo, lr, h, ++zo_t, false);
    }

    // ---- the interface train() drives (int8_net.hpp has the same) ----
    void load(const Split& split, const int* idx, int b) {
        load_batch(in(0, 0), labels.data(), a.layers[0], split, idx, b, [this](uint8_t v) { return lut[v]; },
                   [](float v) { return v; });
    }

    // one optimizer step on the loaded batch (workloads/methods.py bp_step / zo_step)
    StepResult step(const Spec& s, long t, int /*epoch*/, double lr_zo, double lr_bp, PhaseClock& clock) {
        if (n_zo == 0) {  // full-bp
            forward(B, 0);
            clock.lap(FORWARD);
            const double loss = this->loss(B, 0);
            clock.lap(LOSS);
            backward(0, 1.f);
            clock.lap(BACKWARD);
            bp_update(lr_bp, s.h);
            clock.lap(BP_UPDATE);
            return {loss};
        }
        return zo_step(s, t, lr_zo, lr_bp, clock);
    }

    // workloads/methods.py zo_step, the same passes in the same order but one: ElasticZO's head
    // is back-propagated once the estimate's passes are done, before the update's (a
    // conservative step's forwards reuse pass 0's buffers); the head's weights and gradients are
    // not touched by the ZO update, so its gradient is the same. With a head a step keeps two
    // passes: (L+, L-) two-point, (L(θ), L+) one-sided; so elastic-zo runs one query here.
    StepResult zo_step(const Spec& s, long t, double lr_zo, double lr_bp, PhaseClock& clock) {
        const Hyper& h = s.h;
        sparsify(s, t);
        const bool head = n_bp > 0, one_sided = h.zo_estimator == "one-sided";
        const std::vector<uint64_t> keys = zrng::zo_keys(s.seed, uint64_t(t), h.zo_queries);
        const size_t q = keys.size();
        const bool sign = h.zo_update == "sign", merged = q == 1 && (h.zo_update == "sgd" || sign) && h.weight_decay == 0;
        // one query, every ZO parameter in range: momentum's and Adam's restore and update are one
        // pass too (restore_and_step), z drawn three times a step as MeZO's
        const bool fused = q == 1 && !zo_m.empty() && h.zo_sparsity != "layers" && h.weight_decay == 0;
        const double eps = h.eps;
        auto clip = [&](double g) { return std::min(std::max(g, -h.zo_grad_clip), h.zo_grad_clip); };
        auto dir = [&](double g) { return sign ? double((g > 0) - (g < 0)) : g; };
        StepResult r{0, true};
        r.minus = !one_sided;
        double l0 = 0, sum_plus = 0, sum_minus = 0;
        bool known = false;
        if (one_sided) {
            forward(B, 0);
            clock.lap(FORWARD);
            l0 = loss(B, 0), known = true;
            clock.lap(LOSS);
        }
        for (uint64_t k : keys) {
            perturb(k, float(eps));
            clock.lap(ZO_PERTURB);
            const int pass = head && one_sided ? 1 : 0;
            forward(B, pass);
            clock.lap(FORWARD);
            const double lp = loss(B, pass);
            clock.lap(LOSS);
            sum_plus += lp;
            double g, back;
            if (one_sided) {
                g = clip((lp - l0) / eps), back = -eps;
            } else {
                perturb(k, float(-2.0 * eps));
                clock.lap(ZO_PERTURB);
                forward(B, head ? 1 : 0);
                clock.lap(FORWARD);
                const double lm = loss(B, head ? 1 : 0);
                clock.lap(LOSS);
                sum_minus += lm;
                g = clip((lp - lm) / (2.0 * eps)), back = eps;
            }
            r.grads.push_back(g);
            if (merged) {
                perturb(k, float(back - lr_zo * dir(g)));
                clock.lap(ZO_UPDATE);
            } else if (fused) {
                restore_and_step(k, float(back), float(g), lr_zo, h);
                clock.lap(ZO_UPDATE);
            } else {
                perturb(k, float(back));
                clock.lap(ZO_PERTURB);
            }
        }
        if (head) {  // BP through the mean loss of the two kept passes
            backward(0, 0.5f);
            backward(1, 0.5f);
            clock.lap(BACKWARD);
        }
        std::vector<double> c;
        for (double g : r.grads) c.push_back(q > 1 ? dir(g) / double(q) : dir(g));
        if (h.zo_update == "conservative") {
            if (!known) {
                forward(B, 0);
                l0 = loss(B, 0), known = true;
                clock.lap(FORWARD);
            }
            auto move = [&](double scale) {
                for (size_t i = 0; i < q; ++i) perturb(keys[i], float(scale * lr_zo * c[i]));
                clock.lap(ZO_UPDATE);
            };
            double l[2];
            for (int j = 0; j < 2; ++j) {  // θ - lr d, then θ + lr d
                move(j == 0 ? -1.0 : 2.0);
                forward(B, 0);
                l[j] = loss(B, 0);
                clock.lap(FORWARD);
            }
            const double back = l0 <= std::min(l[0], l[1]) ? -1.0 : l[0] <= l[1] ? -2.0 : 0.0;
            if (back != 0.0) move(back);
            r.kept = true, r.loss_kept = std::min({l0, l[0], l[1]});
        } else if (fused) {  // done with the restore
        } else if (h.zo_update == "momentum" || h.zo_update == "adam") {
            stateful_update(keys, c, lr_zo, h);
            clock.lap(ZO_UPDATE);
        } else if (!merged) {
            if (h.weight_decay > 0) decay(float(1.0 - lr_zo * h.weight_decay));   // coupled, MeZO's
            for (size_t i = 0; i < q; ++i) perturb(keys[i], float(-lr_zo * c[i]));
            clock.lap(ZO_UPDATE);
        }
        if (head) {
            bp_update(lr_bp, h);
            clock.lap(BP_UPDATE);
        }
        r.loss_plus = sum_plus / double(q), r.loss_minus = sum_minus / double(q);
        r.loss = known ? l0 : 0.5 * (r.loss_plus + r.loss_minus);
        double gs = 0;
        for (double g : r.grads) gs += g;
        r.grad = gs / double(q);
        return r;
    }

    // the first b samples loaded: sum of their losses, and how many are classified right
    void eval(int b, double& loss_sum, long& correct) {
        forward(b, 0);
        loss_sum += loss(b, 0) * b;
        correct += count_correct(logits(0), labels.data(), b, a.classes);
    }

    size_t params_total() const { return params.size(); }
    std::vector<uint8_t> weights_bytes() const {  // float32 LE (both targets are little-endian)
        const uint8_t* p = reinterpret_cast<const uint8_t*>(params.data());
        return {p, p + sizeof(float) * params.size()};
    }
};

}  // namespace fp32
