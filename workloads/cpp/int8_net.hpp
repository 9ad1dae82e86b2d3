// The INT8 network of zobench-train: any network of the description's layer kinds (models.py),
// without biases, trained NITI-style with
// int8 weights, activations and errors and one power-of-two exponent per tensor
// (docs/int8.md; workloads/int8.py is the reference it agrees with bit for bit).
//
// Buffers are what the paper's Eqs. 13-15 count, but for one accumulator: int8 parameters; per layer an int8
// activation, and the int32 accumulator it is requantized from, shared by the layers (each is
// requantized before the next runs, so the largest is all they need); for the BP part an int32
// gradient accumulator per weight (int64 for the convolutions, summed over B*H*W), and int8
// errors with their int32 accumulators. The kernels add padded inputs and errors, repacked
// weights and, for BP through the convolutions (and pointwise layers), per-thread scratch of
// their weight gradient. A pointwise layer's global max is fused into the layer: its
// accumulators are never stored, only each cloud's and channel's maximum (and, for BP, that
// of every block of points).
// All are allocated once, in the constructor, from one table (Buffers) that counts them all. Each
// activation is uint8: a ReLU output or pixel >> 1, so in [0, 127]; only a point cloud's input
// coordinates are signed int8 held in that buffer (the first layer reads them as such).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"
#include "int8_kernels.hpp"

namespace int8 {

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
    const Arch& a;
    int B, n, first_bp, scale;
    size_t n_zo, n_bp;
    std::string zo_loss;
    std::vector<size_t> off;      // per layer, its weight's offset in q
    std::vector<int8_t> q;        // every layer's weights, no biases
    std::vector<int> exps;        // per layer, its weights' exponent
    int logit_exp[2] = {};        // each pass's logits' exponent
    ActivationPlan<uint8_t, int8_t> act;
    // the int32 accumulators a layer's activation is requantized from (only their pooled maxima
    // where fused_gmax): one buffer for every layer, as each is requantized before the next runs
    std::vector<int32_t> acc;
    std::vector<int8_t> wk, wflip;          // a convolution's or pointwise layer's repacked weights, a convolution's flipped (the largest)
    std::vector<int> labels;
    // the BP part: gradient accumulators (int64 where a weight sums over points or pixels),
    // errors of each BP layer's activation, their int32 accumulators at its input, and a
    // conv2d's error padded for its input gradient
    std::vector<std::vector<int32_t>> g32, eacc;
    std::vector<std::vector<int64_t>> g64;
    std::vector<std::vector<int8_t>> err;   // of a global max's output where one follows (pointwise_gmax_backward)
    std::vector<std::vector<int>> argmax;   // per BP layer with a global max, per pass, each cloud's and channel's maximum point [B][O]
    std::vector<int8_t> errpad;
    std::vector<int32_t> gmax_max;          // a fused global max's block maxima, where BP reads its argmax
    // conv_weight_grad's and pointwise_weight_grad's per-thread scratch (fast-path convolutions
    // and, on a dot-product path, pointwise layers without a pool trained by BP): planes or packed rows, and sums
    int grad_threads = 0;
    size_t planes_stride = 0, sums_stride = 0;
    std::vector<uint8_t> grad_planes;
    std::vector<int64_t> grad_sums;

    Buffers buffers;  // every buffer above: what the constructor allocates, and their bytes

    // LeNet-5's convolutions run shape-specialised kernels (above); every other shape the
    // runtime-sized ones
    static bool fast(const Layer& L) {
        return L.kind == CONV2D && L.KH == 5 && L.KW == 5 && L.pad == 2 &&
               with_conv_shape(L.C, L.O, L.OH, L.OW, [](auto) {});
    }

    // whether out(l), where it needs a buffer of its own, has one: a pooled activation is kept
    // only where BP reads it (requant_relu_pool pools the accumulators), and never before a
    // global max (BP reads its argmax)
    bool keeps_out(int l) const {
        const Layer& L = a.layers[l];
        return !((l < first_bp && L.pool != NO_POOL) || L.pool == GLOBAL_MAX);
    }

    // a fast convolution whose pre-pool activation is not kept (every ZO pass's): conv_pool_packed
    // pools its accumulators straight into the next layer's padded input
    bool fused_pool(int l) const {
        const Layer& L = a.layers[l];
        return fast(L) && L.pool == MAX2X2 && l + 1 < n && !keeps_out(l);
    }

    // a pointwise layer with a global max, on uint8 inputs: pointwise_gmax_forward
    bool fused_gmax(int l) const {
        const Layer& L = a.layers[l];
        return L.kind == POINTWISE && L.pool == GLOBAL_MAX && l > 0;
    }

    Net(int batch, const Spec& s) : a(s.arch), B(batch), n(s.arch.n()), scale(s.h.zo_scale), zo_loss(s.zo_loss) {
        first_bp = first_bp_layer(s);
        size_t total = 0;
        for (const Layer& L : a.layers) off.push_back(total), total += L.w_size();
        n_zo = first_bp < n ? off[first_bp] : total;
        n_bp = total - n_zo;
        q.resize(total);
        if (!s.init_weights.empty()) {  // weights_bytes' layout: a trained network's, to fine-tune
            const std::vector<uint8_t> w = read_weights_file(s.init_weights, total + 4 * size_t(n),
                                                             "int8 weights, then an int32 exponent per layer");
            for (size_t i = 0; i < total; ++i) {
                q[i] = int8_t(w[i]);
                if (q[i] == -128) throw SpecError("init_weights: " + s.init_weights + " holds -128 (int8 weights are in [-127, 127])");
            }
            for (int l = 0; l < n; ++l) {
                uint32_t e = 0;
                for (int k = 0; k < 4; ++k) e |= uint32_t(w[total + 4 * l + k]) << (8 * k);
                exps.push_back(int(int32_t(e)));
            }
        } else {
            const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_INIT, 1);
            for (size_t i = 0; i < total; ++i)
                q[i] = int8_t(int((((zrng::bits(key, uint64_t(i)) & 0xFFFFFFFFull) * 255ull) >> 32)) - 127);
            for (const Layer& L : a.layers) exps.push_back(init_exponent(L.fan_in(), L.O * L.KH * L.KW));
        }
        const bool two = s.method == "elastic-zo";
        buffers.hold(q, "q", PARAMETERS);
        act.plan(buffers, a, B, first_bp, two, READ_SLACK, [&](int l) { return keeps_out(l); });
        buffers.need(labels, "labels", WORKING, B);
        g32.resize(n), g64.resize(n), eacc.resize(n), err.resize(n), argmax.resize(n);
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            buffers.need(acc, "acc", SCRATCH, size_t(B) * (fused_gmax(l) ? L.O : L.out_size()));
            if (fused_pool(l))  // conv_pool_packed's, padded
                buffers.need(acc, "acc", SCRATCH, size_t(B) * L.O * (L.OH / 2 + 2 * a.layers[l + 1].pad) * (L.OW / 2 + 2 * a.layers[l + 1].pad));
            if (L.kind == FC) buffers.need(acc, "acc", SCRATCH, panels_at(B, L) + (team::size() * fc_panel_bytes(L.C) + 3) / 4);
            if (fast(L)) buffers.need(wk, "wk", WORKING, conv_packed_size(L.C, L.O));
            if (L.kind == POINTWISE) buffers.need(wk, "wk", WORKING, l > 0 ? pointwise_packed_size(L.C, L.O) : L.w_size());
            if (l < first_bp) continue;
            if (L.kind == FC) buffers.need(g32[l], of_layer("g32", l), SCRATCH, L.w_size());
            else buffers.need(g64[l], of_layer("g64", l), SCRATCH, L.w_size());
            buffers.need(err[l], of_layer("err", l), ERRORS, size_t(B) * (L.pool == GLOBAL_MAX ? L.O : L.out_size()));
            if (L.pool == GLOBAL_MAX) buffers.need(argmax[l], of_layer("argmax", l), WORKING, size_t(two ? 2 : 1) * B * L.O);
            if (fused_gmax(l)) buffers.need(gmax_max, "gmax_max", WORKING, size_t(B) * L.O * gmax_blocks(L.rows));
            const bool pointwise_scratch = L.kind == POINTWISE && l > 0 && L.pool == NO_POOL && pointwise_tiled(L.O);
            const bool conv_scratch = fast(L) && l <= 1 + first_bp;
            if (pointwise_scratch || conv_scratch) {
                grad_threads = team::size();
                buffers.need(grad_planes, "grad_planes", WORKING,
                             size_t(grad_threads) * (conv_scratch ? conv_grad_planes(L.C, L.OH, L.OW) : pointwise_grad_pack(L.C, L.O)));
                buffers.need(grad_sums, "grad_sums", WORKING,
                             size_t(grad_threads) * (conv_scratch ? conv_grad_sums(L.C, L.O) : size_t(L.C) * L.O));
            }
            if (l == first_bp) continue;
            buffers.need(eacc[l], of_layer("eacc", l), SCRATCH, size_t(B) * L.in_size());
            if (L.kind == CONV2D) {
                buffers.need(wflip, "wflip", WORKING, L.w_size());
                if (fast(L)) buffers.need(wk, "wk", WORKING, conv_packed_size(L.O, L.C));
                buffers.need(errpad, "errpad", WORKING,
                             size_t(B) * L.O * (L.OH + 2 * (L.KH - 1 - L.pad)) * (L.OW + 2 * (L.KW - 1 - L.pad)) + READ_SLACK);
            }
        }
        buffers.allocate();
        // each thread's share of the weight gradients' scratch: the largest a layer needs
        if (grad_threads) planes_stride = grad_planes.size() / grad_threads, sums_stride = grad_sums.size() / grad_threads;
    }

    int8_t* Wt(int l) { return q.data() + off[l]; }
    uint8_t* in(int l, int k) { return act.in(l, l > 0 && l >= first_bp ? k : 0); }
    uint8_t* own_out(int l) { return act.layer[l].own_out.empty() ? nullptr : act.layer[l].own_out.data(); }
    int8_t* logits(int k) { return act.logits[k].data(); }
    int* Argmax(int l, int k) { return argmax[l].empty() ? nullptr : argmax[l].data() + size_t(k) * B * a.layers[l].O; }

    // where an FC layer's weight panels (fc_forward) lie in acc: past its b x O outputs, rounded up to 64 bytes
    static size_t panels_at(int b, const Layer& L) { return (size_t(b) * L.O + 15) / 16 * 16; }

    void forward(int b, int k) {
        int e = INPUT_EXP;
        for (int l = 0; l < n; ++l) {
            const Layer& L = a.layers[l];
            const bool last = l + 1 == n;
            int32_t* ac = acc.data();
            uint8_t* x = in(l, k);
            if (fused_pool(l)) {
                const int pad = a.layers[l + 1].pad;
                uint32_t top = 0;
                with_conv_shape(L.C, L.O, L.OH, L.OW, [&](auto S) {
                    using Sh = decltype(S);
                    top = conv_pool_packed<Sh::C, Sh::OC, Sh::H, Sh::W>(ac, pad, x, wk.data(), Wt(l), b);
                });
                const int s = shift_of_max(top);
                requant_relu_all(in(l + 1, k), ac, size_t(b) * L.O * (L.OH / 2 + 2 * pad) * (L.OW / 2 + 2 * pad), s);
                e += exps[l] + std::max(s, 0);
                continue;
            }
            if (L.kind == CONV2D) {
                const bool ran = fast(L) && with_conv_shape(L.C, L.O, L.OH, L.OW, [&](auto S) {
                    using Sh = decltype(S);
                    conv_forward_packed<Sh::C, Sh::OC, Sh::H, Sh::W>(ac, x, wk.data(), Wt(l), b);
                });
                if (!ran) conv_forward_any(ac, x, Wt(l), b, L.C, L.O, L.OH, L.OW, L.KH, L.KW, [](int) { return int32_t(0); });
            } else if (L.kind == POINTWISE && l == 0) {  // a cloud's coordinates are signed
                rows_forward_signed(ac, reinterpret_cast<const int8_t*>(x), wk.data(), Wt(l), long(b) * L.rows, L.C, L.O);
            } else if (fused_gmax(l)) {
                int32_t* blocks = gmax_max.empty() ? nullptr : gmax_max.data();
                e += exps[l] + pointwise_gmax_forward(in(l + 1, k), Argmax(l, k), ac, blocks, x, wk.data(), Wt(l), b, L.rows,
                                                      L.C, L.O);
                continue;
            } else if (L.kind == POINTWISE) {
                pointwise_forward(ac, x, wk.data(), Wt(l), long(b) * L.rows, L.C, L.O);
            } else {
                fc_forward(ac, x, Wt(l), b, L.C, L.O, reinterpret_cast<int8_t*>(ac + panels_at(b, L)));
            }
            e += exps[l];
            const size_t count = size_t(b) * L.out_size();
            if (last) {
                logit_exp[k] = e + requant_to(logits(k), ac, count, false);
                break;
            }
            const Layer& N = a.layers[l + 1];
            uint8_t* next = in(l + 1, k);
            if (L.pool == MAX2X2) e += requant_relu_pool(own_out(l), next, N.pad, ac, b * L.O, L.OH, L.OW);
            else if (L.pool == GLOBAL_MAX) e += requant_relu_gmax(next, Argmax(l, k), ac, b, L.rows, L.O);
            else if (N.pad > 0) {
                e += requant_to(own_out(l), ac, count, L.relu);
                pad_rect(next, own_out(l), b * L.O, L.OH, L.OW, N.pad, N.pad);
            } else {
                e += requant_to(next, ac, count, L.relu);
            }
        }
    }

    // accumulate the BP layers' gradients for pass k (NITI's backward; int8.py Int8Engine.backward)
    void backward(int k) {
        ce_error(err[n - 1].data(), logits(k), logit_exp[k], labels.data(), B, a.classes);
        for (int l = n - 1; l >= first_bp; --l) {
            const Layer& L = a.layers[l];
            const int8_t* d = err[l].data();
            const uint8_t* x = in(l, k);
            if (L.kind == CONV2D && fast(L)) {
                with_conv_shape(L.C, L.O, L.OH, L.OW, [&](auto S) {
                    using Sh = decltype(S);
                    conv_weight_grad<Sh::C, Sh::OC, Sh::H, Sh::W>(g64[l].data(), d, x, B, grad_planes.data(), planes_stride,
                                                                  grad_sums.data(), sums_stride);
                });
            } else if (L.kind == CONV2D) {
                conv_weight_grad_any<int32_t, int64_t>(g64[l].data(), d, x, B, L.C, L.O, L.OH, L.OW, L.KH, L.KW);
            } else if (L.kind == POINTWISE && L.pool == GLOBAL_MAX) {
                int32_t* din = l == first_bp ? nullptr : eacc[l].data();
                if (l == 0)
                    pointwise_gmax_backward(din, g64[l].data(), static_cast<int64_t*>(nullptr), d, Argmax(l, k),
                                            reinterpret_cast<const int8_t*>(x), Wt(l), B, L.rows, L.C, L.O);
                else
                    pointwise_gmax_backward(din, g64[l].data(), static_cast<int64_t*>(nullptr), d, Argmax(l, k), x, Wt(l), B, L.rows, L.C, L.O);
            } else if (L.kind == POINTWISE && l == 0) {
                fc_weight_grad(g64[l].data(), d, reinterpret_cast<const int8_t*>(x), B * L.rows, L.C, L.O);
            } else if (L.kind == POINTWISE) {
                pointwise_weight_grad(g64[l].data(), d, x, grad_planes.data(), planes_stride, grad_sums.data(), sums_stride,
                                      long(B) * L.rows, L.C, L.O);
            } else {
                fc_weight_grad(g32[l].data(), d, x, B, L.C, L.O);
            }
            if (l == first_bp) break;
            int32_t* ea = eacc[l].data();
            if (L.kind == CONV2D) {  // a convolution of the error padded by kernel - 1 - padding, weights flipped
                pad_rect(errpad.data(), d, B * L.O, L.OH, L.OW, L.KH - 1 - L.pad, L.KW - 1 - L.pad);
                flip_weights(wflip.data(), Wt(l), L.C, L.O, L.KH, L.KW);
                const bool ran = fast(L) && with_conv_shape(L.C, L.O, L.OH, L.OW, [&](auto S) {
                    using Sh = decltype(S);
                    if constexpr (Sh::C > 1)  // the first layer's input needs no gradient
                        conv_forward_packed<Sh::OC, Sh::C, Sh::H, Sh::W>(ea, errpad.data(), wk.data(), wflip.data(), B);
                });
                if (!ran) conv_forward_any(ea, errpad.data(), wflip.data(), B, L.O, L.C, L.H, L.W, L.KH, L.KW,
                                     [](int) { return int32_t(0); });
            } else if (L.pool != GLOBAL_MAX) {  // pointwise_gmax_backward made a global max's
                fc_input_grad(ea, d, Wt(l), B * L.rows, L.C, L.O);
            }
            const Layer& P = a.layers[l - 1];
            int8_t* dp = err[l - 1].data();
            const uint8_t* out = own_out(l - 1) ? own_out(l - 1) : x;
            const size_t count = size_t(B) * L.in_size();
            const int s = requant_shift(ea, count);
            auto pass = [&](size_t o, uint8_t v) { return !P.relu || v > 0 ? int8_t(requant_value(ea[o], s)) : int8_t(0); };
            if (P.pool == MAX2X2) maxpool_backward(dp, out, B * P.O, P.OH, P.OW, pass);
            else  // a global max's: of its output, x
                for (size_t i = 0; i < count; ++i) dp[i] = pass(i, out[i]);
        }
    }

    // The trainable state, as train.cpp's warm_up saves and restores it: the int8 weights are
    // all of it. The exponents never change after init; the gradient accumulators g32/g64 are
    // zeroed by every apply_gradient (bp_update ends every step that fills them); logit_exp,
    // the activations, errors, argmax and scratch are written by a step before it reads them.
    std::vector<int8_t> save() const { return q; }
    void restore(const std::vector<int8_t>& saved) { std::copy(saved.begin(), saved.end(), q.begin()); }  // in place

    void bp_update(int epoch) {
        const int bits = grad_bits(epoch);
        for (int l = first_bp; l < n; ++l) {
            if (!g64[l].empty()) apply_gradient(Wt(l), g64[l].data(), g64[l].size(), bits);
            else apply_gradient(Wt(l), g32[l].data(), g32[l].size(), bits);
        }
    }

    // w = clamp(w + e, -127, 127) on the ZO part's weights, g(e, u) giving their changes e from
    // their z's 16 bits (zo_pass), at most `most` in size: one team region, each thread on its own
    // rows (owned_segments). zo_pass takes |e| <= 127; larger changes (a perturbation by -2 z where
    // scale > 63, the update's z + 1 where scale = 127) go in two passes of half each: both halves
    // are in e's direction, so clamping after each clamps their sum.
    template <class G>
    void apply_changes(uint64_t key, int most, G g) {
        int8_t* w = q.data();
        const int parts = most <= 127 ? 1 : 2;
        for (int part = 0; part < parts; ++part)
            team::run([&](int t, int T) {
                owned_segments(a, off, first_bp, false, t, T, [&](size_t lo, size_t n) {
                    zo_pass(w, key, lo, n, [=](auto& e, const auto& u) {
                        g(e, u);
                        if (parts == 2)
                            for (auto& v : e) v = part == 0 ? v >> 1 : v - (v >> 1);
                    });
                });
            });
    }

    // w + k z
    void perturb(uint64_t key, int k, int epoch) {
        const uint16_t thr = uint16_t(sparsity_threshold(epoch));
        const int16_t r = int16_t(scale), k16 = int16_t(k);
        apply_changes(key, std::abs(k) * scale, [=](auto& e, const auto& u) {
            zo_noise(e, u, r, thr);
            if (k16 != 1)
                for (auto& v : e) v *= k16;
        });
    }

    // restore (+z) and update (-round(g z) to one bit) in one pass: e = z - that, looked up where the
    // ISA can (int8_z.hpp ChangeTable: the table made by the same lane code, on every z)
    void zo_update(uint64_t key, int g, int epoch) {
        const uint16_t thr = uint16_t(sparsity_threshold(epoch));
        const int16_t r = int16_t(scale), g16 = int16_t(g);
        const int s = std::max(zo_update_shift(scale), 0);
        const auto change = [=](auto& e) {      // z to z - psto_sign(g z), in place
            constexpr size_t S = count_of<decltype(e)>;
            zi16 d[S];
            for (size_t k = 0; k < S; ++k) d[k] = g16 * e[k];
            psto_sign(d, s);
            for (size_t k = 0; k < S; ++k) e[k] -= d[k];
        };
#if defined(ZOBENCH_INT8_LOOKUP)
        if (scale <= LOOKUP_SCALE) {
            zi16 z[64 / zrng::LANES16];         // every z, at z + r (the index's rest: r)
            for (int i = 0; i < 64; ++i) z[i / zrng::LANES16][i % zrng::LANES16] = int16_t(std::min(i, 2 * scale) - scale);
            change(z);
            const ChangeTable table(z, scale);
            apply_changes(key, scale + 1, [=](auto& e, const auto& u) {
                zo_noise(e, u, r, thr);
                table.apply(e);
            });
            return;
        }
#endif
        apply_changes(key, scale + 1, [=](auto& e, const auto& u) {
            zo_noise(e, u, r, thr);
            change(e);
        });
    }

    // ---- the interface train() drives (fp32_net.hpp has the same) ----
    void load(const Split& split, const int* idx, int b) {
        // pixels >> 1 (in [0, 127]); coordinates to int8 at exponent -7 (int8.py quantize_points)
        load_batch(in(0, 0), labels.data(), a.layers[0], split, idx, b, [](uint8_t v) { return uint8_t(v >> 1); },
                   [](float v) { return uint8_t(int8_t(std::min(127.f, std::max(-127.f, std::floor(v * 128.f + 0.5f))))); });
    }

    static int sign(double v) { return (v > 0) - (v < 0); }

    // one step (workloads/methods.py int8_bp_step / int8_zo_step)
    StepResult step(const Spec& s, long t, int epoch, double, double, PhaseClock& clock) {
        const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_ZO, uint64_t(t));
        if (n_zo == 0) {
            forward(B, 0);
            clock.lap(FORWARD);
            const double loss = float_loss(logits(0), logit_exp[0], labels.data(), B, a.classes);
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
            lf[j] = float_loss(logits(k), logit_exp[k], labels.data(), B, a.classes);
            li[j] = integer_loss(logits(k), logit_exp[k], labels.data(), B, a.classes);
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
        loss_sum += float_loss(logits(0), logit_exp[0], labels.data(), b, a.classes) * b;
        correct += count_correct(logits(0), labels.data(), b, a.classes);
    }

    size_t params_total() const { return q.size(); }
    std::vector<uint8_t> weights_bytes() const {  // int8 weights, then each layer's exponent as int32 LE
        std::vector<uint8_t> bytes(q.begin(), q.end());
        for (int e : exps)
            for (int k = 0; k < 4; ++k) bytes.push_back(uint8_t(uint32_t(e) >> (8 * k)));
        return bytes;
    }
};

}  // namespace int8
