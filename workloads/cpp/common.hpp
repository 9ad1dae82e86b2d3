// What the C++ runner's parts share: the spec, the data split and the phase clock.
#pragma once
#include <chrono>
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
