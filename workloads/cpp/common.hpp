// What the C++ runner's parts share: the spec, the data split, the phase clock, and what the
// FP32 and INT8 networks have in common (LeNet-5's shape, the BP/ZO split, the FC head's
// buffers, batch loading and scoring).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

static const char* PHASES[] = {"data", "zo_perturb", "forward", "loss", "backward", "zo_update", "bp_update", "eval"};
enum Phase { DATA, ZO_PERTURB, FORWARD, LOSS, BACKWARD, ZO_UPDATE, BP_UPDATE, EVAL, NPHASES };

struct SpecError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Hyper {
    int epochs = 5, batch_size = 32, lr_decay_every = 10, train_samples = 0, test_samples = 0, trace_steps = 0;
    int zo_scale = 8;
    double inject_slowdown = 0;  // test-only: busy-wait this fraction of every step
    double lr_bp = 0.05, lr_zo = 1e-3, lr_decay = 0.8, eps = 1e-3, zo_grad_clip = 5.0;
    std::string fault;
};

struct Spec {
    json raw;
    std::string job_id, method, dataset = "fashion-mnist", data_dir, init_weights, precision = "fp32", zo_loss = "float";
    int bp_layers = 0, threads = 0;
    uint64_t seed = 0;
    Hyper h;
};

struct Split {
    std::vector<uint8_t> images;  // [N, 784]
    std::vector<int> labels;
    int n = 0;
};

struct PhaseClock {
    double seconds[NPHASES] = {};
    long calls[NPHASES] = {};
    Clock::time_point last;
    void start() { last = Clock::now(); }
    void lap(Phase p) {
        auto now = Clock::now();
        seconds[p] += std::chrono::duration<double>(now - last).count();
        calls[p] += 1;
        last = now;
    }
    json as_json(const PhaseClock* since = nullptr) const {
        json out = json::object();
        for (int p = 0; p < NPHASES; ++p)
            out[PHASES[p]] = {{"seconds", seconds[p] - (since ? since->seconds[p] : 0.0)},
                              {"calls", calls[p] - (since ? since->calls[p] : 0)}};
        return out;
    }
};


// bytes held by vectors: what a network reports as memory.buffers_bytes, its exact allocation
template <class... V>
inline size_t bytes_of(const V&... v) {
    return (size_t(0) + ... + (v.size() * sizeof(typename V::value_type)));
}

// ---- the networks' common parts ----
constexpr int NLAYERS = 5, NCLASSES = 10;
// per trainable layer, the size of its weight (conv1, conv2, fc1, fc2, fc3)
constexpr int W_SIZE[NLAYERS] = {6 * 1 * 25, 16 * 6 * 25, 120 * 784, 84 * 120, 10 * 84};

// index of the first layer trained by BP (NLAYERS: none)
inline int first_bp_layer(const Spec& s) {
    return s.method == "full-bp" ? 0 : s.method == "full-zo" ? NLAYERS : NLAYERS - s.bp_layers;
}

// What one step measured: the trace's record of it (without the step number). Grad is the
// projected gradient: a float for FP32, the update's sign for INT8.
template <class Grad>
struct StepRecord {
    double loss;
    bool zo = false;  // the ZO passes ran: loss_plus, loss_minus and grad are set
    double loss_plus = 0, loss_minus = 0;
    Grad grad = 0;
    void add_to(json& rec) const {
        rec["loss"] = loss;
        if (!zo) return;
        rec["loss_plus"] = loss_plus;
        rec["loss_minus"] = loss_minus;
        rec["grad"] = grad;
    }
};

// One forward pass's FC-head activations: pool2's output and fc1..fc3's outputs.
template <class Act, class Logit>
struct HeadBuffers {
    std::vector<Act> p2, h1, h2;  // [B,784], [B,120], [B,84]
    std::vector<Logit> logits;    // [B,10]
};

// ElasticZO keeps two heads, one per perturbed pass, for its BP update; the second has its own
// p2 only if fc1 is trained by BP (the only reader of p2 after the pass). Returns how many.
template <class Head>
inline int alloc_heads(Head (&head)[2], const Spec& s, int first_bp, int B) {
    const int n = s.method == "elastic-zo" ? 2 : 1;
    for (int k = 0; k < n; ++k) {
        if (k == 0 || first_bp <= 2) head[k].p2.assign(size_t(B) * 784, 0);
        head[k].h1.assign(size_t(B) * 120, 0);
        head[k].h2.assign(size_t(B) * 84, 0);
        head[k].logits.assign(size_t(B) * NCLASSES, 0);
    }
    return n;
}

// pass k's p2: its own, or pass 0's where it has none
template <class Head>
inline auto* p2_of(Head (&head)[2], int k) { return (head[k].p2.empty() ? head[0] : head[k]).p2.data(); }

// images idx[0..b) into the interior of a [B][32][32] input whose 2-pixel border stays zero,
// each pixel through `pixel`; their labels into labels[0..b)
template <class T, class Pixel>
inline void load_batch(T* xpad, int* labels, const Split& split, const int* idx, int b, Pixel pixel) {
    for (int i = 0; i < b; ++i) {
        const uint8_t* img = split.images.data() + size_t(idx[i]) * 784;
        T* dst = xpad + size_t(i) * 32 * 32;
        for (int h = 0; h < 28; ++h)
            for (int x = 0; x < 28; ++x) dst[(h + 2) * 32 + x + 2] = pixel(img[h * 28 + x]);
        labels[i] = split.labels[idx[i]];
    }
}

// how many of the first b samples' logits have their first maximum at the label
template <class L>
inline long count_correct(const L* logits, const int* labels, int b) {
    long correct = 0;
    for (int i = 0; i < b; ++i) {
        const L* l = logits + size_t(i) * NCLASSES;
        correct += int(std::max_element(l, l + NCLASSES) - l) == labels[i];
    }
    return correct;
}
