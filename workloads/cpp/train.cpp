// zobench-train: the C++ runner. `zobench-train --spec spec.json --out result.json`
//
// Same contract as the Python runners (DESIGN.md): JSON-lines progress on stdout, a
// schema-1 result written atomically at the end (also on failure), the same phase names,
// the same data order, initial weights and ZO perturbations (zobench-z, docs/zrng.md), so
// its losses and projected gradients can be checked against the torch runner step by step.
// The algorithms follow workloads/methods.py line for line.
#include <omp.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lenet5.hpp"
#include "sha256.hpp"
#include "zrng.hpp"

using json = nlohmann::json;
using namespace lenet5;
using Clock = std::chrono::steady_clock;

static const char* PHASES[] = {"data", "zo_perturb", "forward", "loss", "backward", "zo_update", "bp_update", "eval"};
enum Phase { DATA, ZO_PERTURB, FORWARD, LOSS, BACKWARD, ZO_UPDATE, BP_UPDATE, EVAL, NPHASES };

struct SpecError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------- spec
struct Hyper {
    int epochs = 5, batch_size = 32, lr_decay_every = 10, train_samples = 0, test_samples = 0, trace_steps = 0;
    double lr_bp = 0.05, lr_zo = 1e-3, lr_decay = 0.8, eps = 1e-3, zo_grad_clip = 5.0;
    std::string fault;
};

struct Spec {
    json raw;
    std::string job_id, method, dataset = "fashion-mnist", data_dir, init_weights, precision = "fp32";
    int bp_layers = 0, threads = 0;
    uint64_t seed = 0;
    Hyper h;
};

template <class T>
static void take(const json& j, const char* key, T& into) {
    if (j.contains(key) && !j[key].is_null()) into = j[key].get<T>();
}

static Spec read_spec(const std::string& path) {
    std::ifstream f(path);
    if (!f) throw SpecError("cannot read spec " + path);
    Spec s;
    try {
        s.raw = json::parse(f);
    } catch (const json::exception& e) {
        throw SpecError(path + ": not valid JSON (" + e.what() + ")");
    }
    const json& j = s.raw;
    if (!j.contains("job_id") || !j.contains("method")) throw SpecError("spec needs job_id and method");
    take(j, "job_id", s.job_id);
    take(j, "method", s.method);
    take(j, "bp_layers", s.bp_layers);
    take(j, "precision", s.precision);
    take(j, "threads", s.threads);
    take(j, "seed", s.seed);
    take(j, "init_weights", s.init_weights);
    if (j.contains("workload")) {
        take(j["workload"], "dataset", s.dataset);
        take(j["workload"], "data_dir", s.data_dir);
    }
    if (j.contains("hyper")) {
        const json& h = j["hyper"];
#define TAKE(field) take(h, #field, s.h.field)
        TAKE(epochs); TAKE(batch_size); TAKE(lr_bp); TAKE(lr_zo); TAKE(lr_decay); TAKE(lr_decay_every);
        TAKE(eps); TAKE(zo_grad_clip); TAKE(train_samples); TAKE(test_samples); TAKE(trace_steps); TAKE(fault);
#undef TAKE
    }
    if (s.method != "full-bp" && s.method != "full-zo" && s.method != "elastic-zo")
        throw SpecError("method: expected full-bp, full-zo or elastic-zo, got " + s.method);
    if (s.method == "elastic-zo" && (s.bp_layers < 1 || s.bp_layers > 3))
        throw SpecError("bp_layers: expected 1..3 for elastic-zo");
    if (s.precision != "fp32") throw SpecError("precision: this build trains fp32 only, got " + s.precision);
    return s;
}

// ---------------------------------------------------------------- data
struct Split {
    std::vector<uint8_t> images;  // [N, 784]
    std::vector<int> labels;
    int n = 0;
};

static std::vector<uint8_t> read_idx(const std::string& path, std::vector<uint32_t>& dims) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return {};
    uint8_t head[4];
    f.read(reinterpret_cast<char*>(head), 4);
    if (!f || head[0] || head[1] || head[2] != 0x08) throw SpecError(path + ": not an unsigned-byte IDX file");
    dims.assign(head[3], 0);
    size_t total = 1;
    for (auto& d : dims) {
        uint8_t b[4];
        f.read(reinterpret_cast<char*>(b), 4);
        d = uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | b[3];
        total *= d;
    }
    std::vector<uint8_t> body(total);
    f.read(reinterpret_cast<char*>(body.data()), std::streamsize(total));
    if (size_t(f.gcount()) != total) throw SpecError(path + ": shorter than its header says");
    return body;
}

static Split load_split(const Spec& s, bool train, int limit) {
    std::vector<std::string> dirs;
    if (!s.data_dir.empty()) dirs.push_back(s.data_dir + "/" + s.dataset);
    if (const char* env = std::getenv("ZOBENCH_DATA")) dirs.push_back(std::string(env) + "/" + s.dataset);
    dirs.push_back("/usr/share/datasets/" + s.dataset);
    const std::string prefix = train ? "train" : "t10k";
    for (const auto& d : dirs) {
        std::vector<uint32_t> idims, ldims;
        auto img = read_idx(d + "/" + prefix + "-images-idx3-ubyte", idims);
        if (img.empty()) continue;
        auto lab = read_idx(d + "/" + prefix + "-labels-idx1-ubyte", ldims);
        if (lab.empty() || idims.size() != 3 || idims[1] * idims[2] != 784 || ldims[0] != idims[0])
            throw SpecError(d + ": images and labels do not match");
        Split out;
        out.n = limit ? std::min<int>(limit, int(idims[0])) : int(idims[0]);
        out.images.assign(img.begin(), img.begin() + size_t(out.n) * 784);
        out.labels.assign(lab.begin(), lab.begin() + out.n);
        return out;
    }
    std::string where;
    for (const auto& d : dirs) where += (where.empty() ? "" : ", ") + d;
    throw SpecError("dataset '" + s.dataset + "': uncompressed " + prefix + "-images-idx3-ubyte not found in " +
                    where + " (the harness deploys them; gunzip the IDX files to run by hand)");
}

// (v/255 - mean)/std in double, rounded once to float: the same table as workloads/datasets.py
static std::vector<float> lookup_table(const std::string& dataset) {
    static const std::map<std::string, std::pair<double, double>> norm = {
        {"mnist", {0.1307, 0.3081}}, {"fashion-mnist", {0.2860, 0.3530}}};
    auto it = norm.find(dataset);
    if (it == norm.end()) throw SpecError("dataset: the C++ runner reads mnist or fashion-mnist, got " + dataset);
    std::vector<float> lut(256);
    for (int v = 0; v < 256; ++v) lut[v] = float((v / 255.0 - it->second.first) / it->second.second);
    return lut;
}

static std::vector<int> permutation(uint64_t seed, int epoch, int n) {
    const uint64_t key = zrng::stream_key(seed, zrng::STREAM_DATA, uint64_t(epoch));
    std::vector<uint64_t> draw(n);
    for (int i = 0; i < n; ++i) draw[i] = zrng::bits(key, uint64_t(i));
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return draw[a] < draw[b]; });
    return order;
}

// ---------------------------------------------------------------- model state
// Activation buffers of one forward pass. The head's (fc inputs and outputs) exist twice for
// ElasticZO, which keeps both perturbed passes for its BP update.
struct Head {
    std::vector<float> p2, h1, h2, logits, probs;  // [B,784] (only if fc1 is BP), [B,120], [B,84], [B,10], [B,10]
};

struct Net {
    int B;
    int first_bp;         // index of the first layer trained by BP (NLAYERS: none)
    size_t n_zo, n_bp;
    std::vector<float> params;   // NPARAMS
    std::vector<float> grads;    // n_bp: the BP part only
    // activations (one pass)
    std::vector<float> xpad, c1, p1, p1pad, c2;
    std::vector<float> w2t;  // conv2's weights as [6][5][5][16] for conv_forward_oc
    std::vector<float> w2f;  // conv2's weights flipped as [6][16][5][5] for its input gradient (full-bp)
    Head head[2];
    std::vector<int> labels;
    // errors for the BP part
    std::vector<float> dlogits, dh2, dh1, dp2, dc2, dc2pad, dp1, dc1;

    Net(int batch, const Spec& s, const std::vector<float>& init) : B(batch), params(init) {
        first_bp = s.method == "full-bp" ? 0 : s.method == "full-zo" ? NLAYERS : NLAYERS - s.bp_layers;
        n_zo = size_t(layer_offset(first_bp));
        n_bp = NPARAMS - n_zo;
        grads.assign(n_bp, 0.f);
        xpad.assign(size_t(B) * 32 * 32, 0.f);
        c1.assign(size_t(B) * 6 * 28 * 28, 0.f);
        p1.assign(size_t(B) * 6 * 14 * 14, 0.f);
        p1pad.assign(size_t(B) * 6 * 18 * 18, 0.f);
        c2.assign(size_t(B) * 16 * 14 * 14, 0.f);
        w2t.assign(W_SIZE[1], 0.f);
        for (int k = 0; k < (s.method == "elastic-zo" ? 2 : 1); ++k) {
            if (k == 0 || first_bp <= 2) head[k].p2.assign(size_t(B) * 784, 0.f);
            head[k].h1.assign(size_t(B) * 120, 0.f);
            head[k].h2.assign(size_t(B) * 84, 0.f);
            head[k].logits.assign(size_t(B) * 10, 0.f);
            head[k].probs.assign(size_t(B) * 10, 0.f);
        }
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

    float* p2_of(int k) { return head[k].p2.empty() ? head[0].p2.data() : head[k].p2.data(); }

    // x: [b, 784] normalised images (b <= B); writes head[k]
    void forward(int b, int k) {
        Head& hd = head[k];
        conv_forward<1, 6, 28, 28>(c1.data(), xpad.data(), W(0), Bias(0), b);
        maxpool_forward(p1.data(), c1.data(), b * 6, 28, 28);
        pad2(p1pad.data(), p1.data(), b, 6, 14, 14);
        transpose_conv_weights<6, 16>(w2t.data(), W(1));
        conv_forward_oc<6, 16, 14, 14>(c2.data(), p1pad.data(), w2t.data(), Bias(1), b);
        float* p2 = p2_of(k);
        maxpool_forward(p2, c2.data(), b * 16, 14, 14);
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
        fc_backward(first_bp <= 1 ? dp2.data() : nullptr, dW(2), dBias(2), dh1.data(), p2_of(k), W(2), B, 784, 120);
        if (first_bp > 1) return;
        maxpool_backward(dc2.data(), dp2.data(), c2.data(), B * 16, 14, 14);
        relu_backward(dc2.data(), c2.data(), dc2.size());
        conv_weight_grad<6, 16, 14, 14>(dW(1), dBias(1), dc2.data(), p1pad.data(), B);
        if (first_bp > 0) return;
        pad2(dc2pad.data(), dc2.data(), B, 16, 14, 14);
        flip_conv_weights<6, 16>(w2f.data(), W(1));
        conv_forward<16, 6, 14, 14, false>(dp1.data(), dc2pad.data(), w2f.data(), nullptr, B);
        maxpool_backward(dc1.data(), dp1.data(), c1.data(), B * 6, 28, 28);
        relu_backward(dc1.data(), c1.data(), dc1.size());
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
};

// ---------------------------------------------------------------- measurement
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

static long status_kib(const char* field) {
    std::ifstream f("/proc/self/status");
    std::string line;
    const std::string want = std::string(field) + ":";
    while (std::getline(f, line))
        if (line.rfind(want, 0) == 0) return std::strtol(line.c_str() + want.size(), nullptr, 10);
    return -1;
}

static long peak_rss_bytes() {
    long kib = status_kib("VmHWM");
    if (kib < 0) {
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        kib = ru.ru_maxrss;
    }
    return kib * 1024;
}

static std::string read_first_line(const char* path) {
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

static json env_facts() {
    utsname u{};
    uname(&u);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::string cpu;
    std::ifstream info("/proc/cpuinfo");
    for (std::string line; std::getline(info, line);) {
        auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
        if (key == "model name" || key == "Model" || key == "Hardware") {
            cpu = line.substr(line.find_first_not_of(" \t", colon + 1));
            break;
        }
    }
    std::string governor = read_first_line("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
    return {{"hostname", host}, {"arch", u.machine}, {"cpu_model", cpu.empty() ? u.machine : cpu},
            {"cores", int(std::thread::hardware_concurrency())}, {"governor", governor.empty() ? "unknown" : governor},
            {"kernel", u.release},
            {"versions", {{"zobench-train", "1"}, {"compiler", __VERSION__}, {"openmp", _OPENMP}}},
            {"binary_sha256", nullptr}, {"harness_commit", ""}};
}

static void emit(const json& j) {
    std::cout << j.dump() << "\n" << std::flush;
}

static std::string method_key(const Spec& s) {
    return s.method == "elastic-zo" ? "elastic-zo-k" + std::to_string(s.bp_layers) : s.method;
}

static void inject_fault(const Spec& s) {
    std::string kind = s.h.fault, only;
    auto at = kind.find('@');
    if (at != std::string::npos) only = kind.substr(at + 1), kind = kind.substr(0, at);
    if (!only.empty() && only != method_key(s)) return;
    if (kind == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (kind == "crash") std::abort();
    if (kind == "oom") throw std::bad_alloc();
}

// ---------------------------------------------------------------- training
struct State {
    long steps = 0;
    double train_seconds = 0;
    json epochs = json::array(), trace = json::array();
};

static void load_batch(Net& net, const Split& split, const std::vector<float>& lut, const int* idx, int b) {
    for (int i = 0; i < b; ++i) {
        const uint8_t* img = split.images.data() + size_t(idx[i]) * 784;
        float* dst = net.xpad.data() + size_t(i) * 32 * 32;
        for (int h = 0; h < 28; ++h)
            for (int x = 0; x < 28; ++x) dst[(h + 2) * 32 + x + 2] = lut[img[h * 28 + x]];
        net.labels[i] = split.labels[idx[i]];
    }
}

static void train(const Spec& s, Net& net, const Split& tr, const Split& te, const std::vector<float>& lut,
                  PhaseClock& clock, State& st) {
    const int B = s.h.batch_size;
    const int steps_per_epoch = tr.n / B;
    if (steps_per_epoch == 0) throw SpecError("hyper.batch_size is larger than the training samples");
    emit({{"event", "start"}, {"job_id", s.job_id}, {"epochs", s.h.epochs}, {"steps_total", s.h.epochs * steps_per_epoch}});
    auto last_emit = Clock::now();
    const bool zo = net.n_zo > 0, head = net.n_bp > 0;
    for (int epoch = 0; epoch < s.h.epochs; ++epoch) {
        const double decay = std::pow(s.h.lr_decay, epoch / s.h.lr_decay_every);
        const double lr_zo = s.h.lr_zo * decay, lr_bp = s.h.lr_bp * decay;
        const std::vector<int> order = permutation(s.seed, epoch, tr.n);
        PhaseClock snap = clock;
        double loss_sum = 0;
        clock.start();
        const auto t0 = Clock::now();
        for (int b = 0; b < steps_per_epoch; ++b) {
            load_batch(net, tr, lut, order.data() + size_t(b) * B, B);
            clock.lap(DATA);
            json rec = {{"step", st.steps}};
            if (!zo) {  // full-bp
                net.forward(B, 0);
                clock.lap(FORWARD);
                double loss = net.loss(B, 0);
                clock.lap(LOSS);
                net.backward(0, 1.f);
                clock.lap(BACKWARD);
                net.bp_update(float(lr_bp));
                clock.lap(BP_UPDATE);
                loss_sum += loss;
                rec["loss"] = loss;
            } else {
                const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_ZO, uint64_t(st.steps));
                net.perturb(key, float(s.h.eps));
                clock.lap(ZO_PERTURB);
                net.forward(B, 0);
                clock.lap(FORWARD);
                const double lp = net.loss(B, 0);
                clock.lap(LOSS);
                net.perturb(key, float(-2.0 * s.h.eps));
                clock.lap(ZO_PERTURB);
                net.forward(B, head ? 1 : 0);
                clock.lap(FORWARD);
                const double lm = net.loss(B, head ? 1 : 0);
                clock.lap(LOSS);
                double g = (lp - lm) / (2.0 * s.h.eps);
                g = std::min(std::max(g, -s.h.zo_grad_clip), s.h.zo_grad_clip);
                net.perturb(key, float(s.h.eps - lr_zo * g));
                clock.lap(ZO_UPDATE);
                if (head) {  // BP through the mean loss of the two perturbed passes
                    net.backward(0, 0.5f);
                    net.backward(1, 0.5f);
                    clock.lap(BACKWARD);
                    net.bp_update(float(lr_bp));
                    clock.lap(BP_UPDATE);
                }
                loss_sum += 0.5 * (lp + lm);
                rec.update({{"loss", 0.5 * (lp + lm)}, {"loss_plus", lp}, {"loss_minus", lm}, {"grad", g}});
            }
            if (st.steps < s.h.trace_steps) st.trace.push_back(rec);
            st.steps += 1;
            if (!s.h.fault.empty()) inject_fault(s);
            if (std::chrono::duration<double>(Clock::now() - last_emit).count() > 0.5) {
                last_emit = Clock::now();
                emit({{"event", "step"}, {"step", st.steps}, {"loss", rec["loss"]}});
            }
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        st.train_seconds += seconds;
        clock.start();
        double test_loss = 0;
        long correct = 0;
        std::vector<int> idx(B);
        for (int lo = 0; lo < te.n; lo += B) {  // evaluated in training-sized batches
            const int b = std::min(B, te.n - lo);
            std::iota(idx.begin(), idx.begin() + b, lo);
            load_batch(net, te, lut, idx.data(), b);
            net.forward(b, 0);
            test_loss += net.loss(b, 0) * b;
            for (int i = 0; i < b; ++i) {
                const float* l = net.head[0].logits.data() + i * 10;
                correct += int(std::max_element(l, l + 10) - l) == net.labels[i];
            }
        }
        clock.lap(EVAL);
        json rec = {{"epoch", epoch + 1}, {"seconds", seconds}, {"phases", clock.as_json(&snap)},
                    {"train_loss", loss_sum / steps_per_epoch}, {"test_loss", test_loss / te.n},
                    {"test_accuracy", double(correct) / te.n}};
        st.epochs.push_back(rec);
        json ev = rec;
        ev.erase("phases");
        ev["event"] = "epoch";
        ev["step"] = st.steps;
        emit(ev);
    }
}

static std::string utc_now() {
    std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", std::gmtime(&t));
    return buf;
}

static void write_atomic(const std::string& path, const json& j) {
    const std::string tmp = path + ".tmp-" + std::to_string(getpid());
    {
        std::ofstream f(tmp);
        f << j.dump(1);
        f.flush();
        if (!f) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
}

int main(int argc, char** argv) {
    std::string spec_path, out_path;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--spec") spec_path = argv[i + 1];
        else if (a == "--out") out_path = argv[i + 1];
    }
    if (spec_path.empty() || out_path.empty()) {
        std::cerr << "usage: zobench-train --spec spec.json --out result.json\n";
        return 2;
    }
    const auto wall0 = Clock::now();
    json result = {{"schema", 1}, {"job", nullptr}, {"status", "failed"}, {"error", nullptr},
                   {"started_at", utc_now()}, {"wall_seconds", 0.0}, {"train_seconds", 0.0}, {"steps", 0},
                   {"phases", json::object()}, {"epochs", json::array()},
                   {"memory", {{"peak_rss_bytes", 0}, {"baseline_rss_bytes", 0}, {"device_peak_bytes", nullptr}}},
                   {"model", nullptr}, {"env", env_facts()}};
    State st;
    PhaseClock clock;
    std::unique_ptr<Net> net;
    Spec s;
    try {
        s = read_spec(spec_path);
        result["job"] = s.raw;
        if (s.raw.contains("harness_commit")) result["env"]["harness_commit"] = s.raw["harness_commit"];
        if (s.threads > 0) omp_set_num_threads(s.threads);
        const Split tr = load_split(s, true, s.h.train_samples), te = load_split(s, false, s.h.test_samples);
        const std::vector<float> lut = lookup_table(s.dataset);
        std::vector<float> init(NPARAMS);
        if (!s.init_weights.empty()) {
            std::ifstream f(s.init_weights, std::ios::binary | std::ios::ate);
            if (!f || f.tellg() != std::streamoff(sizeof(float) * NPARAMS))
                throw SpecError("init_weights: " + s.init_weights + " must hold " + std::to_string(NPARAMS) +
                                " float32 values");
            f.seekg(0);
            f.read(reinterpret_cast<char*>(init.data()), sizeof(float) * NPARAMS);
        } else {  // the documented default init, drawn from zobench-z like models.py
            const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_INIT, 0);
            for (int l = 0; l < NLAYERS; ++l) {
                const int fan_in = W_SIZE[l] / B_SIZE[l];
                const float bound = float(1.0 / std::sqrt(double(fan_in)));
                for (int i = layer_offset(l); i < layer_offset(l + 1); ++i)
                    init[i] = (zrng::uniform(key, uint64_t(i)) * 2.0f - 1.0f) * bound;
            }
        }
        net = std::make_unique<Net>(s.h.batch_size, s, init);
#pragma omp parallel
        { volatile int warm = omp_get_thread_num(); (void)warm; }  // start the thread pool before timing
        result["memory"]["baseline_rss_bytes"] = status_kib("VmRSS") * 1024;
        if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {  // VmHWM := VmRSS
            std::fputs("5", f);
            std::fclose(f);
        }
        train(s, *net, tr, te, lut, clock, st);
        result["status"] = "ok";
    } catch (const std::bad_alloc&) {
        result["status"] = "oom";
        result["error"] = "std::bad_alloc: an allocation failed";
    } catch (const std::exception& e) {
        result["error"] = e.what();
    }
    if (result["job"].is_null()) result["job"] = {{"job_id", s.job_id}};
    if (net) {
        result["model"] = {{"name", "lenet5"}, {"params_total", NPARAMS}, {"params_zo", net->n_zo},
                           {"params_bp", net->n_bp},
                           {"weights_sha256", sha256_hex(reinterpret_cast<const uint8_t*>(net->params.data()),
                                                         sizeof(float) * NPARAMS)}};
        result["phases"] = clock.as_json();
    }
    result["steps"] = st.steps;
    result["train_seconds"] = st.train_seconds;
    result["epochs"] = st.epochs;
    if (!st.trace.empty()) result["trace"] = st.trace;
    result["memory"]["peak_rss_bytes"] = peak_rss_bytes();
    result["wall_seconds"] = std::chrono::duration<double>(Clock::now() - wall0).count();
    write_atomic(out_path, result);
    emit({{"event", "done"}, {"status", result["status"]}, {"error", result["error"]}});
    return result["status"] == "ok" ? 0 : 1;
}
