// What the C++ runner's parts share: the spec, the model's layer list (parsed once, with its
// shapes), the data split, the phase clock, and what the FP32 and INT8 networks have in common
// (the BP/ZO split, the per-layer buffer plan, batch loading and scoring).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "team.hpp"

// Under Valgrind's callgrind every phase's end dumps its counters (PhaseClock::lap), so the harness
// reads instructions per step and phase (harness/execution/instructions.py). Where the header is
// missing (the harness says so: ZOBENCH_CALLGRIND) the binary has no such hook and simply runs; a
// cross build that finds the build machine's header gets valgrind.h's client-request sequence for
// its arch (valgrind.h has arm64's too), a no-op off Valgrind.
#if defined(ZOBENCH_CALLGRIND) && __has_include(<valgrind/callgrind.h>)
#include <cstdio>
#include <valgrind/callgrind.h>
// read once: outside Valgrind a lap then pays one predictable branch, not the magic sequence
inline const bool UNDER_VALGRIND = [] { return RUNNING_ON_VALGRIND != 0; }();
// out of line: the name's formatting is the count's business, never inlined into a timed lap
[[gnu::noinline, gnu::cold]] inline void callgrind_dump(long step, const char* phase) {
    char name[64];
    std::snprintf(name, sizeof name, "zobench step=%ld phase=%s", step, phase);
    CALLGRIND_DUMP_STATS_AT(name);
}
#else
constexpr bool UNDER_VALGRIND = false;
inline void callgrind_dump(long, const char*) {}
#endif

using json = nlohmann::json;

// the vector registers the kernels' register tiles are sized for (FP32's and INT8's): AVX-512's and
// AArch64's 32, else 16
#if defined(__AVX512F__) || defined(__aarch64__)
constexpr int VREGS = 32;
#else
constexpr int VREGS = 16;
#endif

using Clock = std::chrono::steady_clock;

static const char* PHASES[] = {"data", "zo_perturb", "forward", "loss", "backward", "zo_update", "bp_update", "eval"};
enum Phase { DATA, ZO_PERTURB, FORWARD, LOSS, BACKWARD, ZO_UPDATE, BP_UPDATE, EVAL, NPHASES };

struct SpecError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The weights as a file: the bytes model.weights_sha256 hashes (FP32: float32 LE in the
// description's layout; INT8: the int8 weights, then each layer's exponent as int32 LE), the
// layout init_weights is read in and save_weights writes (docs/runners.md)
constexpr const char* WEIGHTS_FILE = "weights.bin";

inline std::vector<uint8_t> read_weights_file(const std::string& path, size_t bytes, const std::string& layout) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f || f.tellg() != std::streamoff(bytes))
        throw SpecError("init_weights: " + path + " must hold " + std::to_string(bytes) + " bytes (" + layout + ")");
    std::vector<uint8_t> out(bytes);
    f.seekg(0);
    f.read(reinterpret_cast<char*>(out.data()), std::streamsize(bytes));
    return out;
}

// workloads/spec.py Hyper's fields that this binary takes, each once: (type, name, default). The
// struct, the spec reader (train.cpp) and `zobench-train --hyper` (which prints them as JSON) all
// expand this list, and tests/test_cpp.py holds it equal to Hyper's fields and defaults, so a field
// added in Python and not here fails a test rather than being silently ignored. Hyper.CPP_LEAVES
// names the fields it leaves out, and why.
#define ZOBENCH_HYPER(X)                                                                     \
    X(int, epochs, 5) X(int, batch_size, 32)                                                 \
    X(double, lr_bp, 0.05) X(double, lr_zo, 1e-3)                                            \
    X(double, lr_decay, 0.8) X(int, lr_decay_every, 10)                                      \
    X(double, eps, 1e-3)                                                                     \
    X(std::string, optimizer, "sgd") /* the BP part's: sgd, or adam (FP32 only) */           \
    X(double, adam_beta1, 0.9) X(double, adam_beta2, 0.999) X(double, adam_eps, 1e-8)       \
    X(double, zo_grad_clip, 5.0)                                                             \
    X(std::string, zo_estimator, "two-point") X(int, zo_queries, 1)                          \
    X(std::string, zo_update, "sgd") X(double, zo_momentum, 0.9)                             \
    X(std::string, zo_sparsity, "all") X(int, zo_layers, 1)                                  \
    X(double, zo_mask_fraction, 0.25) X(int, zo_mask_every, 50) /* docs/zo-optimizers.md */  \
    X(std::string, zo_mask_draw, "zo-bench") X(std::string, zo_distribution, "irwin-hall")   \
    X(double, weight_decay, 0.0) /* the ZO part's weights' (fp32_net.hpp decay) */           \
    X(int, train_samples, 0) X(int, test_samples, 0)                                         \
    X(int, zo_scale, 8)                                                                      \
    X(int, trace_steps, 0)                                                                   \
    X(int, points, 0) /* points per cloud taken from each sample (0 = input_shape[0]) */     \
    X(double, max_train_seconds, 0.0) /* stop at the first step boundary past this */        \
    X(int, warmup_steps, 0) /* untimed steps; Hyper's -1 (the device's) is resolved by the host */ \
    X(std::string, fault, "")                                                                \
    X(double, inject_slowdown, 0.0) /* test-only: busy-wait this fraction of every step */ \
    X(double, inject_work, 0.0) /* test-only: take this fraction more steps, on a restored state */

struct Hyper {
#define ZOBENCH_HYPER_FIELD(type, name, value) type name = value;
    ZOBENCH_HYPER(ZOBENCH_HYPER_FIELD)
#undef ZOBENCH_HYPER_FIELD
};

// ---- the model: workloads/models.py's description, as the spec carries it ----
enum Kind { CONV2D, FC, POINTWISE };
enum Pool { NO_POOL, MAX2X2, GLOBAL_MAX };

// One trainable layer and its per-sample shapes. conv2d: input [C][H][W] (stored padded by
// `pad` on every side) -> [O][OH][OW]; pointwise: [N][C] -> [N][O] (N = rows); fc: I = C
// values -> O. Pooling leaves `pooled` values per sample: the next layer's input.
struct Layer {
    std::string name;
    Kind kind = FC;
    Pool pool = NO_POOL;
    bool relu = false;
    int O = 0, C = 0, KH = 1, KW = 1, pad = 0;
    int H = 1, W = 1, OH = 1, OW = 1;  // conv2d's input and output planes
    int rows = 1;                      // pointwise: the points N
    size_t w_size() const { return size_t(O) * C * KH * KW; }
    int fan_in() const { return C * KH * KW; }
    size_t in_size() const { return size_t(rows) * C * H * W; }
    size_t in_padded() const { return size_t(rows) * C * (H + 2 * pad) * (W + 2 * pad); }
    size_t out_size() const { return size_t(rows) * O * OH * OW; }
    size_t pooled_size() const { return pool == MAX2X2 ? size_t(O) * (OH / 2) * (OW / 2) : pool == GLOBAL_MAX ? O : out_size(); }
};

struct Arch {
    std::string name;
    std::vector<int> input_shape;
    int classes = 0;
    bool he_init = false;  // init "he": weights U(-sqrt(6/fan_in), +); else (and biases) PyTorch's 1/sqrt(fan_in)
    std::vector<Layer> layers;
    bool points() const { return layers[0].kind == POINTWISE; }
    int n() const { return int(layers.size()); }
    // how many layers at the end are fc: the most ElasticZO trains by BP
    int head_layers() const {
        int k = 0;
        while (k < n() && layers[n() - 1 - k].kind == FC) ++k;
        return k;
    }
};

struct Spec {
    json raw;
    Arch arch;
    std::string job_id, method, dataset = "fashion-mnist", data_dir, init_weights, precision = "fp32", zo_loss = "float";
    bool save_weights = false;   // write the final weights as WEIGHTS_FILE beside the result
    bool eval_start = false;     // evaluate the starting weights before training (train.cpp evaluate)
    double rotate = 0;           // workload.rotate: the data folder must hold images turned by this (check_rotation)
    long validation = 0;         // workload.validation: the data folder must be a split holding out this many (check_counted)
    long subset = 0;             // workload.subset: the data folder must hold this many drawn from each split (check_counted)
    int bp_layers = 0, threads = 0;
    uint64_t seed = 0;
    Hyper h;
};

struct PhaseClock {
    double seconds[NPHASES] = {};
    long calls[NPHASES] = {};
    Clock::time_point last;
    long step = -1;  // the timed step the laps belong to (train sets it), -1 outside the timed loops
    void start() { last = Clock::now(); }
    void lap(Phase p) {
        auto now = Clock::now();
        seconds[p] += std::chrono::duration<double>(now - last).count();
        calls[p] += 1;
        last = now;
        // callgrind zeroes its counters at each dump: each dump holds the instructions since the last lap
        if (UNDER_VALGRIND) callgrind_dump(step, PHASES[p]);
    }
    json as_json(const PhaseClock* since = nullptr) const {
        json out = json::object();
        for (int p = 0; p < NPHASES; ++p)
            out[PHASES[p]] = {{"seconds", seconds[p] - (since ? since->seconds[p] : 0.0)},
                              {"calls", calls[p] - (since ? since->calls[p] : 0)}};
        return out;
    }
};


// The parts a buffer is counted under: harness/search/memory_model.py's names (tests/test_cpp.py
// holds them to its PARTS and TRANSFORMER_PARTS). "working" is what the paper's equations leave
// out and the kernels add: padded errors, repacked weights, per-thread sums, the batch's labels.
#define ZOBENCH_PARTS(X)                                                                               \
    X(PARAMETERS, "parameters") X(ACTIVATIONS, "activations") X(GRADIENTS, "gradients") X(ERRORS, "errors") \
    X(OPTIMIZER, "optimizer") X(SCRATCH, "scratch") X(WORKING, "working") X(ZO, "zo")
#define ZOBENCH_PART_ENUM(id, name) id,
#define ZOBENCH_PART_NAME(id, name) name,
enum Part { ZOBENCH_PARTS(ZOBENCH_PART_ENUM) NPARTS };
static const char* PART_NAMES[] = {ZOBENCH_PARTS(ZOBENCH_PART_NAME)};
#undef ZOBENCH_PART_ENUM
#undef ZOBENCH_PART_NAME

// A network's buffers as one named table, as llm.c's param_sizes and act_sizes both allocate and
// count: each layer states what it needs of a buffer (a buffer the layers share takes the
// largest need), allocate() then sizes every buffer once, zeroed, and the table reports each
// one's bytes and each part's: memory.buffers, memory.buffer_parts and their sum,
// memory.buffers_bytes, the network's exact allocation.
class Buffers {
  public:
    template <class T>
    void need(std::vector<T>& v, const std::string& name, Part part, size_t count) {
        Entry& e = entry(&v, name, part, sizeof(T), [&v](size_t n) { v.assign(n, T(0)); });
        e.count = std::max(e.count, count);
    }
    // a buffer already filled (the parameters): counted as it is
    template <class T>
    void hold(const std::vector<T>& v, const std::string& name, Part part) {
        entry(&v, name, part, sizeof(T), [](size_t) {}).count = v.size();
    }
    void allocate() {
        for (Entry& e : entries) e.alloc(e.count);
    }
    size_t bytes() const {
        size_t n = 0;
        for (const Entry& e : entries) n += e.bytes();
        return n;
    }
    json each() const {  // buffer -> bytes, the empty ones left out
        json j = json::object();
        for (const Entry& e : entries)
            if (e.count) j[e.name] = e.bytes();
        return j;
    }
    json parts() const {  // part -> bytes, every part
        size_t n[NPARTS] = {};
        for (const Entry& e : entries) n[e.part] += e.bytes();
        json j = json::object();
        for (int p = 0; p < NPARTS; ++p) j[PART_NAMES[p]] = n[p];
        return j;
    }
    void add_to(json& memory) const {
        memory["buffers_bytes"] = bytes();
        memory["buffers"] = each();
        memory["buffer_parts"] = parts();
    }

  private:
    struct Entry {
        const void* at;
        std::string name;
        Part part;
        size_t elem, count;
        std::function<void(size_t)> alloc;
        size_t bytes() const { return elem * count; }
    };
    std::vector<Entry> entries;

    Entry& entry(const void* at, const std::string& name, Part part, size_t elem, std::function<void(size_t)> alloc) {
        for (Entry& e : entries)
            if (e.at == at) return e;
        entries.push_back({at, name, part, elem, 0, std::move(alloc)});
        return entries.back();
    }
};

// a per-layer buffer's name in the table: "err[3]"
inline std::string of_layer(const char* name, int l) { return std::string(name) + "[" + std::to_string(l) + "]"; }

// ---- the networks' common parts ----
constexpr int MAX_CLASSES = 1024;  // the losses keep a row of per-class terms on the stack

// The spec's workload.architecture -> the layer list with every layer's shapes, checked as
// workloads/models.py checks it plus what this binary cannot run (a conv2d padding wider than
// kernel - 1: its input gradient is a convolution of the error padded by kernel - 1 - padding).
// The input is [C, H, W] images or [N, 3] clouds; `points` (> 0) takes that many per cloud.
inline Arch parse_arch(const json& j, int points) {
    auto bad = [](const std::string& what) { return SpecError("workload.architecture: " + what); };
    Arch a;
    try {
        a.name = j.at("name").get<std::string>();
        a.input_shape = j.at("input_shape").get<std::vector<int>>();
        a.classes = j.at("classes").get<int>();
        const std::string init = j.value("init", std::string("pytorch"));
        if (init != "pytorch" && init != "he") throw bad("init '" + init + "' is not one this binary draws (pytorch, he)");
        a.he_init = init == "he";
        for (const json& l : j.at("layers")) {
            Layer L;
            L.name = l.at("name").get<std::string>();
            const std::string kind = l.at("kind").get<std::string>(), pool = l.value("pool", std::string());
            const auto w = l.at("weight_shape").get<std::vector<int>>();
            L.kind = kind == "conv2d" ? CONV2D : kind == "fc" ? FC : kind == "pointwise" ? POINTWISE : throw bad(
                "layer " + L.name + ": kind '" + kind + "' is not one this binary runs (conv2d, fc, pointwise)");
            L.pool = pool.empty() ? NO_POOL : pool == "max2x2" ? MAX2X2 : pool == "global-max" ? GLOBAL_MAX : throw bad(
                "layer " + L.name + ": pool '" + pool + "' is not one this binary runs ('', max2x2, global-max)");
            L.relu = l.value("relu", false);
            L.pad = l.value("padding", 0);
            if (w.size() != (L.kind == CONV2D ? 4u : 2u) || *std::min_element(w.begin(), w.end()) < 1)
                throw bad("layer " + L.name + ": weight_shape does not fit its kind");
            L.O = w[0], L.C = w[1];
            if (L.kind == CONV2D) L.KH = w[2], L.KW = w[3];
            a.layers.push_back(L);
        }
    } catch (const json::exception& e) {
        throw bad(std::string("not a model description (") + e.what() + ")");
    }
    if (a.layers.empty()) throw bad("no layers");
    if (a.classes < 2 || a.classes > MAX_CLASSES) throw bad("classes: expected 2.." + std::to_string(MAX_CLASSES));
    std::vector<int> shape = a.input_shape;
    if (a.points()) {
        if (shape.size() != 2) throw bad("a point-cloud model's input_shape is [N, C]");
        if (points > 0) shape[0] = points;
    } else if (points > 0) {
        throw bad("hyper.points: " + a.name + " does not take point clouds");
    }
    for (Layer& L : a.layers) {
        const std::string where = "layer " + L.name + ": ";
        if (L.kind == CONV2D) {
            if (shape.size() != 3 || shape[0] != L.C) throw bad(where + "a conv2d needs an input [C, H, W] of its C");
            if (L.pad < 0 || L.pad > L.KH - 1 || L.pad > L.KW - 1)
                throw bad(where + "this binary runs a conv2d padding of 0 to kernel - 1");
            L.H = shape[1], L.W = shape[2];
            L.OH = L.H + 2 * L.pad - L.KH + 1, L.OW = L.W + 2 * L.pad - L.KW + 1;
            if (L.OH < 1 || L.OW < 1) throw bad(where + "the kernel does not fit the input");
            shape = {L.O, L.OH, L.OW};
        } else if (L.pad) {
            throw bad(where + "only a conv2d takes padding");
        } else if (L.kind == POINTWISE) {
            if (shape.size() != 2 || shape[1] != L.C) throw bad(where + "a pointwise layer needs an input [N, C] of its C");
            L.rows = shape[0];
            shape = {L.rows, L.O};
        } else {
            size_t n = 1;
            for (int d : shape) n *= size_t(d);
            if (n != size_t(L.C)) throw bad(where + "an fc weight [O, I] needs I = the flattened input's size");
            shape = {L.O};
        }
        if (L.pool == MAX2X2 && (L.kind != CONV2D || L.OH < 2 || L.OW < 2))
            throw bad(where + "max2x2 pools a conv2d output of at least 2x2");
        if (L.pool == GLOBAL_MAX && L.kind != POINTWISE) throw bad(where + "global-max pools a pointwise output");
        if (L.pool == MAX2X2) shape = {L.O, L.OH / 2, L.OW / 2};
        if (L.pool == GLOBAL_MAX) shape = {L.O};
    }
    const Layer& last = a.layers.back();
    if (last.kind != FC || last.relu || shape != std::vector<int>{a.classes})
        throw bad("the last layer must be an fc layer without ReLU giving the class logits");
    for (size_t i = 1; i < a.layers.size(); ++i)
        if (a.layers[i].kind == POINTWISE && a.layers[i - 1].kind != POINTWISE)
            throw bad("layer " + a.layers[i].name + ": a pointwise layer follows the input or another pointwise layer");
    if (a.points() && a.layers[0].C != 3) throw bad("a point cloud's points have 3 coordinates");
    return a;
}

// index of the first layer trained by BP (n: none); ElasticZO trains the last bp_layers fc layers
inline int first_bp_layer(const Spec& s) {
    const int n = s.arch.n();
    if (s.method == "full-bp") return 0;
    if (s.method == "full-zo") return n;
    if (s.bp_layers < 1 || s.bp_layers > s.arch.head_layers())
        throw SpecError("bp_layers: expected 1.." + std::to_string(s.arch.head_layers()) + " for " + s.arch.name);
    return n - s.bp_layers;
}

// What one step measured: the trace's record of it (without the step number). Grad is the
// projected gradient: a float for FP32, the update's sign for INT8.
template <class Grad>
struct StepRecord {
    double loss;
    bool zo = false;  // the ZO passes ran: loss_plus, loss_minus and grad are set
    double loss_plus = 0, loss_minus = 0;
    Grad grad = 0;
    // the ZO parts' (workloads/methods.py zo_step's trace): a one-sided step has no loss_minus;
    // a q-query step each query's projected gradient; a conservative step the loss it kept
    bool minus = true;
    std::vector<Grad> grads;
    bool kept = false;
    double loss_kept = 0;
    void add_to(json& rec) const {
        rec["loss"] = loss;
        if (!zo) return;
        rec["loss_plus"] = loss_plus;
        if (minus) rec["loss_minus"] = loss_minus;
        rec["grad"] = grad;
        if (grads.size() > 1) rec["grads"] = grads;
        if (kept) rec["loss_kept"] = loss_kept;
    }
};

// One data split: images as uint8 pixels, or point clouds as float32 coordinates, `size`
// values a sample.
struct Split {
    std::vector<uint8_t> pixels;
    std::vector<float> points;
    std::vector<int> labels;
    int n = 0;
    size_t size = 0;
};

// The activation buffers of a network, one plan for FP32 and INT8. Layer l reads in(l) (its
// input, padded by its `pad` for a conv2d, with a zero border written once) and writes its
// activation out(l) (after the ReLU, before the pool); a pooling layer pools into in(l + 1).
// out(l) has a buffer of its own only where it is not in(l + 1) itself: before a pool, or
// before a padded conv2d (copied into its interior). ElasticZO keeps the BP head's inputs and
// the logits of both perturbed passes for its backward (pass k = 0, 1); the other buffers are
// shared. T: the activation type; L: the logits'.
template <class T>
struct Activations {
    std::vector<T> in[2];        // per layer l, both passes (pass 1 empty: shared with pass 0)
    std::vector<T> own_out;      // out(l) where it is not in(l + 1)
};

template <class T, class Logit>
struct ActivationPlan {
    std::vector<Activations<T>> layer;
    std::vector<Logit> logits[2];

    // states the buffers in `table`; slack: bytes a kernel may read past a buffer's end (INT8's
    // convolution tile); kept(l): whether out(l), where it needs a buffer of its own, has one
    // (the networks fuse some pools into the layer before them)
    template <class Kept>
    void plan(Buffers& table, const Arch& a, int B, int first_bp, bool two, size_t slack, Kept kept) {
        layer.assign(a.n(), {});
        for (int l = 0; l < a.n(); ++l) {
            const Layer& L = a.layers[l];
            const size_t in = size_t(B) * L.in_padded() + slack;
            table.need(layer[l].in[0], of_layer("in", l), ACTIVATIONS, in);
            if (two && l >= first_bp) table.need(layer[l].in[1], of_layer("in_pass1", l), ACTIVATIONS, in);
            const bool own = l + 1 < a.n() && (L.pool != NO_POOL || a.layers[l + 1].pad > 0);
            if (own && kept(l)) table.need(layer[l].own_out, of_layer("out", l), ACTIVATIONS, size_t(B) * L.out_size());
        }
        table.need(logits[0], "logits", ACTIVATIONS, size_t(B) * a.classes);
        if (two) table.need(logits[1], "logits_pass1", ACTIVATIONS, size_t(B) * a.classes);
    }
    T* in(int l, int k) { return (layer[l].in[k].empty() ? layer[l].in[0] : layer[l].in[k]).data(); }
};

// [BC][H][W] -> the interior of [BC][H + 2ph][W + 2pw], whose border stays as it is: zero, in
// buffers allocated zeroed whose interior only is ever written
template <class T>
inline void pad_rect(T* dst, const T* src, int BC, int H, int W, int ph, int pw) {
    const int HP = H + 2 * ph, WP = W + 2 * pw;
    for (int bc = 0; bc < BC; ++bc)
        for (int h = 0; h < H; ++h)
            std::copy(src + (size_t(bc) * H + h) * W, src + (size_t(bc) * H + h + 1) * W,
                      dst + (size_t(bc) * HP + h + ph) * WP + pw);
}

// The parameters of the first `layers` layers that thread t of T perturbs and updates in a ZO
// pass (the nets' each_z): of each layer, the rows (output channels) team::share(O, t, T) and,
// where a layer's biases follow its weights (FP32), theirs. They are the rows t's share of an FC
// layer's forward reads (fc_forward splits by output), so a ZO pass leaves each thread's weights
// in its own core's cache for the forward that follows instead of moving half of them across
// (LeNet-5 at batch 32 on two threads: the perturbation took 48 or 150 us a step by where the
// machine had put the two cores). f(first index, count) per segment, in order.
template <class F>
inline void owned_segments(const Arch& a, const std::vector<size_t>& off, int layers, bool bias, int t, int T, F&& f) {
    for (int l = 0; l < layers; ++l) {
        const Layer& L = a.layers[size_t(l)];
        const auto [lo, hi] = team::share(L.O, t, T);
        const size_t row = L.w_size() / size_t(L.O);
        if (hi <= lo) continue;
        f(off[size_t(l)] + size_t(lo) * row, size_t(hi - lo) * row);
        if (bias) f(off[size_t(l)] + L.w_size() + size_t(lo), size_t(hi - lo));
    }
}

// One sample's values, each through `value`: functions of their own, whose pointers alias nothing,
// so that the loops vectorize (inlined into a team's region, a byte store could alias the
// closure's fields, and GCC reloaded them for every pixel: an INT8 batch took 59 us, not 10)
template <class T, class Value>
__attribute__((noinline)) void load_values(T* __restrict dst, const float* __restrict src, size_t n, Value value) {
    for (size_t j = 0; j < n; ++j) dst[j] = value(src[j]);
}

// an image [C][H][W] into the interior of its padded planes [C][H + 2 pad][W + 2 pad]
template <class T, class Value>
__attribute__((noinline)) void load_image(T* __restrict dst, const uint8_t* __restrict img, int C, int H, int W, int pad,
                                          Value value) {
    const int HP = H + 2 * pad, WP = W + 2 * pad;
    for (int c = 0; c < C; ++c)
        for (int h = 0; h < H; ++h) {
            T* __restrict row = dst + (size_t(c) * HP + h + pad) * WP + pad;
            const uint8_t* __restrict from = img + (size_t(c) * H + h) * W;
#pragma omp simd
            for (int w = 0; w < W; ++w) row[w] = value(from[w]);
        }
}

// samples idx[0..b) into the first layer's input (images into the interior of its padded
// planes, each value through `value`), their labels into labels[0..b)
template <class T, class Pixel, class Coord>
inline void load_batch(T* x, int* labels, const Layer& first, const Split& split, const int* idx, int b, Pixel pixel,
                       Coord coord) {
    team::each(b, [&](long i) {  // each thread the images its share of the first layer reads
        const size_t at = size_t(idx[i]) * split.size;
        if (!split.points.empty())
            load_values(x + size_t(i) * split.size, split.points.data() + at, split.size, coord);
        else
            load_image(x + size_t(i) * first.in_padded(), split.pixels.data() + at, first.C, first.H, first.W, first.pad, pixel);
        labels[i] = split.labels[idx[i]];
    });
}

// how many of the first b samples' logits have their first maximum at the label
template <class L>
inline long count_correct(const L* logits, const int* labels, int b, int classes) {
    long correct = 0;
    for (int i = 0; i < b; ++i) {
        const L* l = logits + size_t(i) * classes;
        correct += int(std::max_element(l, l + classes) - l) == labels[i];
    }
    return correct;
}
