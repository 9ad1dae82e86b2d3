// zobench-train: the C++ runner. `zobench-train --spec spec.json --out result.json`
//
// Same contract as the Python runners (docs/runners.md): JSON-lines progress on stdout, a
// schema-1 result written atomically at the end (also on failure), the same phase names,
// the same data order, initial weights and ZO perturbations (zobench-z, docs/zrng.md), so
// its losses and projected gradients can be checked against the torch runner step by step.
// The algorithms follow workloads/methods.py line for line.
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.hpp"
#include "fp32_net.hpp"
#include "int8_net.hpp"
#include "team.hpp"

// Every allocation on a cache line's start: the buffers' rows and vectors then sit where the
// kernels' loads expect them (LeNet-5's conv2 on two threads: 198 us a batch aligned, 268 us where
// glibc's mmap left the buffers 16 bytes past a line), the same from run to run.
void* operator new(std::size_t n) {
    if (void* p = std::aligned_alloc(64, (n + 63) / 64 * 64 ?: 64)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

template <class T>
static void take(const json& j, const char* key, T& into) {
    if (j.contains(key) && !j[key].is_null()) into = j[key].get<T>();
}

static bool one_of(const std::string& v, std::initializer_list<const char*> choices) {
    for (const char* c : choices)
        if (v == c) return true;
    return false;
}

// The ZO parts (docs/zo-optimizers.md): the ones this binary runs, and the reasons of
// support.unsupported for those it does not (the plan leaves them out first)
static void check_zo_parts(const Spec& s) {
    const Hyper& h = s.h;
    if (!one_of(h.zo_estimator, {"two-point", "one-sided", "forward-grad"}))
        throw SpecError("hyper.zo_estimator: expected one of 'two-point', 'one-sided', 'forward-grad', got " + h.zo_estimator);
    if (!one_of(h.zo_update, {"sgd", "sign", "momentum", "conservative", "adam"}))
        throw SpecError("hyper.zo_update: expected one of 'sgd', 'sign', 'momentum', 'conservative', 'adam', got " + h.zo_update);
    if (!one_of(h.zo_sparsity, {"all", "layers", "magnitude", "random"}))
        throw SpecError("hyper.zo_sparsity: expected one of 'all', 'layers', 'magnitude', 'random', got " + h.zo_sparsity);
    if (!one_of(h.zo_mask_draw, {"zo-bench", "exact"}))
        throw SpecError("hyper.zo_mask_draw: expected one of 'zo-bench', 'exact', got " + h.zo_mask_draw);
    if (!one_of(h.zo_distribution, {"irwin-hall", "gaussian"}))
        throw SpecError("hyper.zo_distribution: expected one of 'irwin-hall', 'gaussian', got " + h.zo_distribution);
    if (h.zo_queries < 1 || uint64_t(h.zo_queries) > zrng::MAX_QUERIES) throw SpecError("hyper.zo_queries: expected 1..1024");
    if (!(h.zo_momentum >= 0 && h.zo_momentum < 1)) throw SpecError("hyper.zo_momentum: expected 0 <= momentum < 1");
    if (!(h.zo_mask_fraction > 0 && h.zo_mask_fraction <= 1)) throw SpecError("hyper.zo_mask_fraction: expected 0 < fraction <= 1");
    if (h.zo_layers < 1 || h.zo_mask_every < 1) throw SpecError("hyper.zo_layers, zo_mask_every: expected >= 1");
    if (!(h.weight_decay >= 0 && std::isfinite(h.weight_decay))) throw SpecError("hyper.weight_decay: expected a value >= 0");
    if (s.method == "full-bp") return;
    const bool mezo = h.zo_estimator == "two-point" && h.zo_queries == 1 && h.zo_update == "sgd" && h.zo_sparsity == "all"
                      && h.zo_distribution == "irwin-hall" && h.weight_decay == 0;
    if (s.precision == "int8" && !mezo)     // the words of workloads/spec.py INT8_ZO_PARTS
        throw SpecError("hyper: INT8 trains its ZO part by Alg. 2, the sign of the two-point loss difference "
                        "(docs/int8.md): the other estimators and update rules are FP32's");
    if (h.zo_estimator == "forward-grad")   // support.no_forward_ad
        throw SpecError("hyper.zo_estimator: forward-grad needs forward-mode AD (a Jacobian-vector product), which "
                        "the cpp runtime does not have; torch runs it");
    if (h.weight_decay > 0 && h.zo_update == "conservative")   // the words of workloads/spec.py CONSERVATIVE_DECAY
        throw SpecError("hyper.weight_decay: conservative keeps the best of θ and θ ± lr d on the batch, and no peer "
                        "decays it (ZO-Bench's conservative runs set weight_decay 0): give it weight_decay = 0");
    if (h.zo_sparsity == "layers" && h.zo_layers > first_bp_layer(s))   // as methods.Sparsity's
        throw SpecError("hyper.zo_layers: " + s.arch.name + "'s ZO part has " + std::to_string(first_bp_layer(s)) +
                        " units (layers, or a transformer's embeddings and blocks), not " + std::to_string(h.zo_layers));
    if (s.method == "elastic-zo" && h.zo_queries > 1)  // support.CPP_HEAD_QUERIES
        throw SpecError("hyper.zo_queries: the cpp runtime keeps the BP head's activations of two passes, so "
                        "elastic-zo runs one query a step there; torch and ort run more");
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
    take(j, "zo_loss", s.zo_loss);
    take(j, "threads", s.threads);
    take(j, "seed", s.seed);
    take(j, "init_weights", s.init_weights);
    take(j, "save_weights", s.save_weights);
    take(j, "eval_start", s.eval_start);
    if (j.contains("workload")) {
        take(j["workload"], "dataset", s.dataset);
        take(j["workload"], "data_dir", s.data_dir);
        take(j["workload"], "rotate", s.rotate);
        take(j["workload"], "validation", s.validation);
        take(j["workload"], "subset", s.subset);
    }
    if (!j.contains("workload") || !j["workload"].contains("architecture"))
        throw SpecError("workload.architecture: missing (the model's layer list, which this binary runs)");
    if (j.contains("hyper")) {
        const json& h = j["hyper"];
#define TAKE(type, name, value) take(h, #name, s.h.name);
        ZOBENCH_HYPER(TAKE)
#undef TAKE
    }
    if (s.method != "full-bp" && s.method != "full-zo" && s.method != "elastic-zo")
        throw SpecError("method: expected full-bp, full-zo or elastic-zo, got " + s.method);
    s.arch = parse_arch(j["workload"]["architecture"], s.h.points);
    first_bp_layer(s);  // checks bp_layers against the model's fc head
    if (s.precision != "fp32" && s.precision != "int8") throw SpecError("precision: expected fp32 or int8, got " + s.precision);
    if (s.zo_loss != "float" && s.zo_loss != "integer") throw SpecError("zo_loss: expected float or integer, got " + s.zo_loss);
    if (s.h.zo_scale < 1 || s.h.zo_scale > 127) throw SpecError("hyper.zo_scale: expected 1..127");
    if (s.h.optimizer != "sgd" && s.h.optimizer != "adam")
        throw SpecError("hyper.optimizer: expected sgd or adam, got " + s.h.optimizer);
    // the words of workloads/spec.py ADAM_INT8
    if (s.precision == "int8" && s.h.optimizer != "sgd")
        throw SpecError("hyper.optimizer: adam trains FP32 only; INT8 trains its BP part with NITI's integer update (docs/int8.md)");
    if (!(s.h.adam_beta1 >= 0 && s.h.adam_beta1 < 1 && s.h.adam_beta2 >= 0 && s.h.adam_beta2 < 1 && s.h.adam_eps > 0))
        throw SpecError("hyper.adam_beta1, adam_beta2: expected 0 <= beta < 1; hyper.adam_eps: expected > 0");
    check_zo_parts(s);
    // the host resolves -1 (the device's default) before a runner sees the spec: here it is a count
    if (s.h.warmup_steps < 0) throw SpecError("hyper.warmup_steps: expected >= 0");
    return s;
}

// ---------------------------------------------------------------- data
// An IDX file (big-endian header: 0, 0, type, rank, then the dims) opened at its first item.
// type 0x08: unsigned bytes, 0x0D: float32 (big-endian, swapped on reading).
struct Idx {
    std::ifstream f;
    int type = 0;
    std::vector<uint32_t> dims;
    size_t item = 1;  // values per item (the product of the dims after the first)

    Idx(const std::string& path) : f(path, std::ios::binary) {
        if (!f) return;
        uint8_t head[4];
        f.read(reinterpret_cast<char*>(head), 4);
        if (!f || head[0] || head[1] || (head[2] != 0x08 && head[2] != 0x0D) || head[3] < 1)
            throw SpecError(path + ": not an IDX file of unsigned bytes or float32");
        type = head[2];
        dims.assign(head[3], 0);
        for (auto& d : dims) d = read_u32();
        for (size_t i = 1; i < dims.size(); ++i) item *= dims[i];
        if (!f) throw SpecError(path + ": shorter than its header");
    }
    uint32_t read_u32() {
        uint8_t b[4];
        f.read(reinterpret_cast<char*>(b), 4);
        return uint32_t(b[0]) << 24 | uint32_t(b[1]) << 16 | uint32_t(b[2]) << 8 | b[3];
    }
    // the first `take` values of each of the first n items (only those are read)
    template <class T>
    std::vector<T> read(int n, size_t take, const std::string& path) {
        const size_t width = type == 0x0D ? 4 : 1;
        if (width != sizeof(T)) throw SpecError(path + ": not the type this model reads");
        std::vector<T> out(size_t(n) * take);
        const std::streamoff start = f.tellg();
        for (int i = 0; i < n; ++i) {
            f.seekg(start + std::streamoff(size_t(i) * item * width));
            f.read(reinterpret_cast<char*>(out.data() + size_t(i) * take), std::streamsize(take * width));
        }
        if (!f) throw SpecError(path + ": shorter than its header says");
        if (width == 4)
            for (T& v : out) {
                uint32_t u;
                std::memcpy(&u, &v, 4);
                u = __builtin_bswap32(u);
                std::memcpy(&v, &u, 4);
            }
        return out;
    }
};

// The host turns a rotated data set's images (harness/preparation/artifacts.py rotated_idx) into a folder
// whose `rotation` file names the angle: refuse a folder whose images are not turned by
// workload.rotate, so a job pointed at the original files fails instead of training on them
// (the rule of workloads/datasets.py check_rotation: no file, no rotation; whole turns are none).
static void check_rotation(const Spec& s, const std::string& dir) {
    const std::string marker = dir + "/rotation";
    double made = 0;
    std::ifstream f(marker);
    if (f && (!(f >> made >> std::ws) || !f.eof())) throw SpecError(marker + ": not an angle");
    const auto rotated = [](double d) { return std::fmod(d, 360.0) != 0; };
    if (made == s.rotate || !(rotated(made) || rotated(s.rotate))) return;
    const auto g = [](double d) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", d);
        return std::string(text);
    };
    throw SpecError("dataset '" + s.dataset + "': " + dir + " holds " +
                    (rotated(made) ? "images rotated by " + g(made) + " degrees" : "unrotated images (no rotation file)") +
                    ", but workload.rotate is " + g(s.rotate) +
                    "; the harness makes the rotated files (harness/preparation/artifacts.py rotated_idx) and gives a job their "
                    "folder as its data_dir");
}

// The host draws a subset of each split (harness/preparation/artifacts.py subset_idx) and splits a
// validation set off the training set (validation_idx) into folders whose `subset` and `validation`
// files say how many samples they drew or hold out: refuse any other folder, so a tuning trial never
// scores on the test set and a fine-tuning job never trains on more than its subset (the rules of
// workloads/datasets.py check_counted).
static void check_counted(const Spec& s, const std::string& dir, const std::string& key, long want,
                          const std::string& has, const std::string& samples, const std::string& whole,
                          const std::string& maker) {
    const std::string marker = dir + "/" + key;
    long made = 0;
    std::ifstream f(marker);
    if (f && (!(f >> made >> std::ws) || !f.eof())) throw SpecError(marker + ": not a sample count");
    if (made == want) return;
    throw SpecError("dataset '" + s.dataset + "': " + dir + " holds " +
                    (made ? has + std::to_string(made) + samples : whole + " (no " + key + " file)") +
                    ", but workload." + key + " is " + std::to_string(want) + "; the harness makes " + maker +
                    " (harness/preparation/artifacts.py) and gives a job their folder as its data_dir");
}

// The first `limit` samples (0: all) of a split: images [N][C][H][W] as the model's input
// shape, or the first `points` of each cloud [N][P][3]; only what is used is read.
static Split load_split(const Spec& s, bool train, int limit) {
    std::vector<std::string> dirs;
    if (!s.data_dir.empty()) dirs.push_back(s.data_dir + "/" + s.dataset);
    if (const char* env = std::getenv("ZOBENCH_DATA")) dirs.push_back(std::string(env) + "/" + s.dataset);
    dirs.push_back("/usr/share/datasets/" + s.dataset);
    const std::string prefix = train ? "train" : "t10k";
    const bool points = s.arch.points();
    const std::string data_name = prefix + (points ? "-points-idx3-float" : "-images-idx3-ubyte");
    const Layer& first = s.arch.layers[0];
    const size_t size = points ? first.in_size() : size_t(first.C) * first.H * first.W;
    for (const auto& d : dirs) {
        Idx data(d + "/" + data_name);
        if (data.dims.empty()) continue;
        check_rotation(s, d);
        check_counted(s, d, "subset", s.subset, "a subset of ", " samples a split", "the whole splits",
                      "a subset's files (subset_idx)");
        check_counted(s, d, "validation", s.validation, "a validation split of ", " held-out samples",
                      "the training and test sets", "a validation split's files (validation_idx)");
        Idx lab(d + "/" + prefix + "-labels-idx1-ubyte");
        if (lab.dims.size() != 1 || lab.dims[0] != data.dims[0]) throw SpecError(d + ": data and labels do not match");
        const bool fits = points ? data.dims.size() == 3 && data.dims[2] == 3 && data.dims[1] >= uint32_t(first.rows)
                                 : data.item == size;
        if (!fits) throw SpecError(d + "/" + data_name + ": its samples are not the model's input " + s.arch.name + " takes");
        Split out;
        out.n = limit ? std::min<int>(limit, int(data.dims[0])) : int(data.dims[0]);
        out.size = size;
        if (points) out.points = data.read<float>(out.n, size, d + "/" + data_name);
        else out.pixels = data.read<uint8_t>(out.n, size, d + "/" + data_name);
        for (uint8_t v : lab.read<uint8_t>(out.n, 1, d + "/" + prefix + "-labels-idx1-ubyte")) out.labels.push_back(v);
        for (int y : out.labels)
            if (y >= s.arch.classes) throw SpecError(d + ": a label is not below the model's " + std::to_string(s.arch.classes) + " classes");
        return out;
    }
    std::string where;
    for (const auto& d : dirs) where += (where.empty() ? "" : ", ") + d;
    throw SpecError("dataset '" + s.dataset + "': uncompressed " + data_name + " not found in " + where +
                    " (the harness deploys them; gunzip the IDX files to run by hand)");
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

// ---------------------------------------------------------------- measurement
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

// the kernels this binary was built with (env.kernels), each named by the constant beside the
// #if that chose it; zrng: how the FP32 perturbation sums a hash's bytes (zrng::add_normal), its
// other loops being `omp simd` loops like FP32's kernels
static json kernel_paths() {
    return {{"conv", fp32k::SIMD}, {"fc", fp32k::SIMD}, {"int8", int8::KERNELS}, {"zrng", zrng::KERNELS}};
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
            {"kernel", u.release}, {"kernels", kernel_paths()},
            {"versions", {{"zobench-train", "1"}, {"compiler", __VERSION__}, {"threads", "zobench team 1"}}},
            {"binary_sha256", nullptr}, {"harness_commit", ""}, {"zrng", zrng::VERSION}};
}

// env.threads: the team that ran the timed loops (team.hpp), and how it waited: the share of
// its parallel loops started while the machine was calm enough to spin, and how many of its
// threads worked a loop on average (docs/threads.md)
static json threads_record() {
    const team::Team::Record r = team::get().record();
    return {{"team", r.threads}, {"wait", r.wait}, {"spin_us", r.spin_ns < 0 ? json(nullptr) : json(r.spin_ns / 1000)},
            {"spinning_share", std::round(r.spinning_share * 1000) / 1000},
            {"working", std::round(r.working * 100) / 100}};
}

static void find_nonfinite(const json& j, const std::string& where, std::vector<std::string>& found) {
    if (j.is_number_float() && !std::isfinite(j.get<double>())) {
        const double v = j.get<double>();
        found.push_back((where.empty() ? "value" : where) + ": " + (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"));
    } else if (j.is_object()) {
        for (const auto& item : j.items())
            find_nonfinite(item.value(), where.empty() ? item.key() : where + "." + item.key(), found);
    } else if (j.is_array()) {
        for (size_t i = 0; i < j.size(); ++i) find_nonfinite(j[i], where + "[" + std::to_string(i) + "]", found);
    }
}

// An event on stdout, as workloads/loop.py emits it (jsonfile.normal): a value that is not
// finite is null (nlohmann writes it so), and where and what it was is listed under "nonfinite"
static void emit(json j) {
    std::vector<std::string> nonfinite;
    find_nonfinite(j, "", nonfinite);
    if (!nonfinite.empty()) {
        std::sort(nonfinite.begin(), nonfinite.end());
        j["nonfinite"] = nonfinite;
    }
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
// this process's CPU time: every thread, and the launcher before its exec
static double own_cpu_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The machine's busy and steal time (/proc/stat) and this process's CPU time, summed over the
// timed loops: the result's timed_loop_load, as workloads/timed_loop_load.py measures it (its
// docstring says why the harness's window around the whole runner is not enough)
class TimedLoopLoad {
    struct Counters {
        bool ok = false, has_steal = false;
        double busy = 0, steal = 0, own = 0;
        int cores = 0;
    };
    static Counters read() {
        Counters c;
        c.own = own_cpu_seconds();
        std::ifstream f("/proc/stat");
        const double hz = double(sysconf(_SC_CLK_TCK));
        std::string line;
        for (bool first = true; std::getline(f, line) && line.rfind("cpu", 0) == 0; first = false) {
            if (!first) {
                c.cores += std::isdigit(static_cast<unsigned char>(line[3])) ? 1 : 0;
                continue;
            }
            std::istringstream in(line.substr(3));
            std::vector<long long> v;
            for (long long x; in >> x;) v.push_back(x);
            if (line.rfind("cpu ", 0) != 0 || v.size() < 4 || hz <= 0) return c;
            for (size_t i : {0, 1, 2, 5, 6})  // user nice system irq softirq (timed_loop_load.py BUSY_FIELDS)
                if (i < v.size()) c.busy += v[i] / hz;
            c.has_steal = v.size() > 7;
            if (c.has_steal) c.steal = v[7] / hz;
        }
        c.ok = c.cores > 0;
        return c;
    }
    Counters start_;
    double wall_ = 0, busy_ = 0, own_ = 0, steal_ = 0;
    bool known_ = true, has_steal_ = true;
    int cores_ = 0;

   public:
    void begin() { start_ = read(); }
    void end(double seconds) {
        const Counters now = read();
        if (!start_.ok || !now.ok) {
            known_ = false;
            return;
        }
        wall_ += seconds, busy_ += now.busy - start_.busy, own_ += now.own - start_.own;
        has_steal_ = has_steal_ && start_.has_steal && now.has_steal;
        steal_ += now.steal - start_.steal;
        cores_ = now.cores;
    }
    json record() const {
        if (!known_ || !cores_ || wall_ <= 0) return nullptr;
        auto ms = [](double x) { return std::round(x * 1000) / 1000; };  // ticks are 10 ms: no more digits
        return {{"wall_seconds", wall_}, {"cores", cores_}, {"cpu_seconds_other", ms(std::max(0.0, busy_ - own_))},
                {"steal_seconds", has_steal_ ? json(ms(steal_)) : json(nullptr)}};
    }
};

struct State {
    long steps = 0;
    double train_seconds = 0;
    json epochs = json::array(), trace = json::array();
    int warmup_steps = 0;  // the untimed warm-up (warm_up): steps taken, and its wall clock
    double warmup_seconds = 0;
    TimedLoopLoad load;  // the machine's, while the timed loops ran
};

// full batches an epoch takes (the last partial one is dropped)
static int batches_per_epoch(const Spec& s, const Split& tr) {
    const int n = tr.n / s.h.batch_size;
    if (n == 0) throw SpecError("hyper.batch_size is larger than the training samples");
    return n;
}

// an epoch's learning rates (lr_zo, lr_bp): decayed by lr_decay every lr_decay_every epochs
static std::pair<double, double> epoch_lrs(const Spec& s, int epoch) {
    const double decay = std::pow(s.h.lr_decay, epoch / s.h.lr_decay_every);
    return {s.h.lr_zo * decay, s.h.lr_bp * decay};
}

// The untimed warm-up, as the Python runners do it (workloads/loop.py): hyper.warmup_steps
// full optimizer steps of the job's method on the first batch of epoch 0, with the step keys
// of steps 0.. and epoch 0's learning rates, on a throwaway clock (no phase, step, trace row or
// train_seconds is charged), between a save and an exact restore of the trainable state
// (the nets' save() and restore(): all that outlives a step). The training that follows is bit
// for bit the one without it; the caches, the thread pool and the pages are warm. Its wall clock
// (save + steps + restore) goes to the result's "warmup".
//
// The saved state is a copy of the trainable buffers, freed when the warm-up ends: no buffer of
// the net is free during a step to hold it, and it does not exist while training runs, so it is
// not in buffers_bytes (the training allocation). main() warms up before it resets the peak RSS,
// so the copy is not in peak_rss_bytes either.
template <class NetT>
static void warm_up(const Spec& s, NetT& net, const Split& tr, State& st) {
    if (s.h.warmup_steps == 0) return;
    const int B = s.h.batch_size;
    batches_per_epoch(s, tr);
    const std::vector<int> order = permutation(s.seed, 0, tr.n);
    const auto [lr_zo, lr_bp] = epoch_lrs(s, 0);
    PhaseClock scratch;
    const auto t0 = Clock::now();
    {
        const auto saved = net.save();
        scratch.start();
        for (int t = 0; t < s.h.warmup_steps; ++t) {
            net.load(tr, order.data(), B);
            net.step(s, t, 0, lr_zo, lr_bp, scratch);
        }
        net.restore(saved);
    }
    st.warmup_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    st.warmup_steps = s.h.warmup_steps;
}

// the test split's mean loss and accuracy, in training-sized batches (the activation buffers are)
template <class NetT>
static std::pair<double, double> evaluate(const Spec& s, NetT& net, const Split& te) {
    const int B = s.h.batch_size;
    double loss = 0;
    long correct = 0;
    std::vector<int> idx(B);
    for (int lo = 0; lo < te.n; lo += B) {
        const int b = std::min(B, te.n - lo);
        std::iota(idx.begin(), idx.begin() + b, lo);
        net.load(te, idx.data(), b);
        net.eval(b, loss, correct);
    }
    return {loss / te.n, double(correct) / te.n};
}

// eval_start: the starting weights (warm-up has put them back) on the test split, untimed, as
// the epochs evaluate: a fine-tuning job's accuracy without fine-tuning; null without it
template <class NetT>
static json evaluate_start(const Spec& s, NetT& net, const Split& te) {
    if (!s.eval_start) return nullptr;
    const auto [test_loss, test_accuracy] = evaluate(s, net, te);
    return {{"test_loss", test_loss}, {"test_accuracy", test_accuracy}};
}

// hyper.max_train_seconds is spent (workloads/loop.py out_of_time: the same rule)
static bool out_of_time(const Spec& s, double seconds) {
    return s.h.max_train_seconds > 0 && seconds >= s.h.max_train_seconds;
}

// hyper.inject_work (test-only): a slowdown made of real work, which an instruction count sees as
// it is (inject_slowdown's busy-wait on a clock is not work). After step t, floor((t + 1) F) -
// floor(t F) more steps of the job's method on the same batch and step key, from a copy of the
// trainable state put back after them (warm_up's save and restore): so over n steps floor(n F)
// steps more, the training itself bit for bit the one without, and time and instructions both
// grow by about F (the copy adds a little; its bytes are not in buffers_bytes). Its laps are the
// step's phases: the extra work is where the step's own is.
template <class NetT>
static void extra_work(const Spec& s, NetT& net, const Split& tr, const int* batch, long t, int epoch, PhaseClock& clock) {
    const long extra = long(std::floor(double(t + 1) * s.h.inject_work)) - long(std::floor(double(t) * s.h.inject_work));
    if (extra <= 0) return;
    const auto [lr_zo, lr_bp] = epoch_lrs(s, epoch);
    const auto saved = net.save();
    for (long i = 0; i < extra; ++i) {
        net.load(tr, batch, s.h.batch_size);
        clock.lap(DATA);
        net.step(s, t, epoch, lr_zo, lr_bp, clock);
    }
    net.restore(saved);
    clock.lap(DATA);
}

template <class NetT>
static void train(const Spec& s, NetT& net, const Split& tr, const Split& te, PhaseClock& clock, State& st) {
    const int B = s.h.batch_size;
    const int steps_per_epoch = batches_per_epoch(s, tr);
    emit({{"event", "start"}, {"job_id", s.job_id}, {"epochs", s.h.epochs}, {"steps_total", s.h.epochs * steps_per_epoch}});
    auto last_emit = Clock::now();
    for (int epoch = 0; epoch < s.h.epochs; ++epoch) {
        const auto [lr_zo, lr_bp] = epoch_lrs(s, epoch);
        const std::vector<int> order = permutation(s.seed, epoch, tr.n);
        PhaseClock snap = clock;
        double loss_sum = 0;
        int steps = 0;
        st.load.begin();
        clock.start();
        const auto t0 = Clock::now();
        for (int b = 0; b < steps_per_epoch; ++b) {
            const auto step_t0 = Clock::now();
            clock.step = st.steps;
            net.load(tr, order.data() + size_t(b) * B, B);
            clock.lap(DATA);
            const auto r = net.step(s, st.steps, epoch, lr_zo, lr_bp, clock);
            if (s.h.inject_work > 0) extra_work(s, net, tr, order.data() + size_t(b) * B, st.steps, epoch, clock);
            if (s.h.inject_slowdown > 0) {  // test-only: a real, CPU-bound slowdown for the regression gate
                const auto until = Clock::now() + (Clock::now() - step_t0) * s.h.inject_slowdown;
                while (Clock::now() < until) {
                }
                clock.lap(DATA);
            }
            loss_sum += r.loss;
            if (st.steps < s.h.trace_steps) {
                json rec = {{"step", st.steps}};
                r.add_to(rec);
                st.trace.push_back(std::move(rec));
            }
            st.steps += 1;
            if (!s.h.fault.empty()) inject_fault(s);
            // a progress line when half a second passed: by the clock, so never under Valgrind, whose
            // count of a step must not depend on how fast it ran
            if (!UNDER_VALGRIND && std::chrono::duration<double>(Clock::now() - last_emit).count() > 0.5) {
                last_emit = Clock::now();
                emit({{"event", "step"}, {"step", st.steps}, {"loss", r.loss}});
            }
            steps = b + 1;
            if (out_of_time(s, st.train_seconds + std::chrono::duration<double>(Clock::now() - t0).count())) break;
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        clock.step = -1;
        st.load.end(seconds);
        st.train_seconds += seconds;
        clock.start();
        const auto [test_loss, test_accuracy] = evaluate(s, net, te);
        clock.lap(EVAL);
        json rec = {{"epoch", epoch + 1}, {"seconds", seconds}, {"phases", clock.as_json(&snap)},
                    {"train_loss", loss_sum / steps}, {"test_loss", test_loss},
                    {"test_accuracy", test_accuracy}};
        st.epochs.push_back(rec);
        json ev = rec;
        ev.erase("phases");
        ev["event"] = "epoch";
        ev["step"] = st.steps;
        emit(ev);
        if (out_of_time(s, st.train_seconds)) break;
    }
}

static std::string utc_now() {
    std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S+00:00", std::gmtime(&t));
    return buf;
}

// nlohmann writes NaN and Infinity as null; as the Python runners do (workloads/jsonfile.py),
// the result names each such value under "nonfinite", so a diverged loss stays visible.
// path holds the bytes whole or not at all
static void write_atomic(const std::string& path, const char* data, size_t size) {
    const std::string tmp = path + ".tmp-" + std::to_string(getpid());
    {
        std::ofstream f(tmp, std::ios::binary);
        f.write(data, std::streamsize(size));
        f.flush();
        if (!f) throw std::runtime_error("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp);
}

static void write_atomic(const std::string& path, const json& j) {
    const std::string text = j.dump(1);
    write_atomic(path, text.data(), text.size());
}

// the fp32 initial weights: the harness's file, or the documented default drawn from zobench-z
// (the architecture's init, U(-b, b) per layer: models.py init_weights)
static std::vector<float> initial_weights(const Spec& s) {
    size_t total = 0;
    for (const Layer& L : s.arch.layers) total += L.w_size() + L.O;
    std::vector<float> init(total);
    if (!s.init_weights.empty()) {
        const std::vector<uint8_t> w = read_weights_file(s.init_weights, sizeof(float) * total,
                                                         std::to_string(total) + " float32 values");
        std::memcpy(init.data(), w.data(), w.size());
        return init;
    }
    const uint64_t key = zrng::stream_key(s.seed, zrng::STREAM_INIT, 0);
    size_t i = 0;
    for (const Layer& L : s.arch.layers) {
        const float bias_bound = float(1.0 / std::sqrt(double(L.fan_in())));
        const float bound = s.arch.he_init ? float(std::sqrt(6.0 / L.fan_in())) : bias_bound;
        for (const size_t end = i + L.w_size(); i < end; ++i) init[i] = (zrng::uniform(key, uint64_t(i)) * 2.0f - 1.0f) * bound;
        for (const size_t end = i + L.O; i < end; ++i) init[i] = (zrng::uniform(key, uint64_t(i)) * 2.0f - 1.0f) * bias_bound;
    }
    return init;
}

static std::string sha256_of(const std::vector<uint8_t>& bytes) { return sha256_hex(bytes.data(), bytes.size()); }

template <class NetT>
static json model_facts(const Spec& s, const NetT& net, const std::string& init_sha256) {
    return {{"name", s.arch.name}, {"params_total", net.params_total()}, {"params_zo", net.n_zo}, {"params_bp", net.n_bp},
            {"weights_sha256", sha256_of(net.weights_bytes())}, {"init_sha256", init_sha256}};
}

// the final weights beside the result (save_weights); the file's name
static std::string save_weights(const std::string& result_path, const std::vector<uint8_t>& bytes) {
    const size_t slash = result_path.rfind('/');
    write_atomic((slash == std::string::npos ? "" : result_path.substr(0, slash + 1)) + WEIGHTS_FILE,
                 reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return WEIGHTS_FILE;
}

int main(int argc, char** argv) {
    std::string spec_path, out_path;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--spec") spec_path = argv[i + 1];
        else if (a == "--out") out_path = argv[i + 1];
    }
    if (argc == 2 && std::string(argv[1]) == "--hyper") {  // the hyperparameters it takes, and their defaults
        json h = json::object();
#define DEFAULT(type, name, value) h[#name] = type(value);
        ZOBENCH_HYPER(DEFAULT)
#undef DEFAULT
        std::cout << h.dump() << "\n";
        return 0;
    }
    if (spec_path.empty() || out_path.empty()) {
        std::cerr << "usage: zobench-train --spec spec.json --out result.json | --hyper\n";
        return 2;
    }
    const auto wall0 = Clock::now();
    // workloads/result.py skeleton's fields, each present (tests/test_cpp.py holds the two equal)
    json result = {{"schema", 2},  // workloads/vocab.py RESULT_SCHEMA
                   {"job", nullptr}, {"status", "failed"}, {"error", nullptr}, {"started_at", utc_now()},
                   {"wall_seconds", 0.0}, {"train_seconds", 0.0}, {"cpu_seconds", 0.0}, {"steps", 0},
                   {"phases", json::object()}, {"epochs", json::array()},
                   {"warmup", nullptr}, {"start_eval", nullptr}, {"timed_loop_load", nullptr},
                   {"nonfinite", json::array()},
                   {"memory", {{"peak_rss_bytes", 0}, {"baseline_rss_bytes", 0}, {"loaded_rss_bytes", nullptr},
                               {"buffers_bytes", nullptr}, {"buffers", nullptr}, {"buffer_parts", nullptr},
                               {"device_peak_bytes", nullptr},
                               {"device_reserved_peak_bytes", nullptr}, {"device_used_bytes", nullptr}}},
                   {"model", nullptr}, {"env", env_facts()},
                   {"energy", {{"source", nullptr}, {"joules", nullptr}, {"joules_per_step", nullptr},
                               {"avg_power_w", nullptr}, {"unavailable", "the C++ runner reads no power meter"}}}};
    State st;
    PhaseClock clock;
    std::unique_ptr<fp32::Net> net32;
    std::unique_ptr<int8::Net> net8;
    std::string init_sha256, weights_file;
    Spec s;
    auto started = [&] {
        team::run([](int, int) {});  // every thread up before timing, and what it did counted from here
        team::get().reset_record();
        result["memory"]["baseline_rss_bytes"] = status_kib("VmRSS") * 1024;
        if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {  // VmHWM := VmRSS
            std::fputs("5", f);
            std::fclose(f);
        }
    };
    try {
        s = read_spec(spec_path);
        result["job"] = s.raw;
        if (s.raw.contains("harness_commit")) result["env"]["harness_commit"] = s.raw["harness_commit"];
        team::get().configure(s.threads, team::wait_from_env());
        const Split tr = load_split(s, true, s.h.train_samples), te = load_split(s, false, s.h.test_samples);
        auto run = [&](auto& net) {
            init_sha256 = sha256_of(net.weights_bytes());
            warm_up(s, net, tr, st);
            result["start_eval"] = evaluate_start(s, net, te);
            started();
            train(s, net, tr, te, clock, st);
            if (s.save_weights) weights_file = save_weights(out_path, net.weights_bytes());
        };
        if (s.precision == "int8") {
            run(*(net8 = std::make_unique<int8::Net>(s.h.batch_size, s)));
        } else {
            run(*(net32 = std::make_unique<fp32::Net>(s.h.batch_size, s, initial_weights(s),
                                                      s.arch.points() ? std::vector<float>() : lookup_table(s.dataset))));
        }
        result["status"] = "ok";
    } catch (const std::bad_alloc&) {
        result["status"] = "oom";
        result["error"] = "std::bad_alloc: an allocation failed";
    } catch (const std::exception& e) {
        result["error"] = e.what();
    }
    if (result["job"].is_null()) result["job"] = {{"job_id", s.job_id}};
    if (net32) result["model"] = model_facts(s, *net32, init_sha256), net32->buffers.add_to(result["memory"]);
    if (net8) result["model"] = model_facts(s, *net8, init_sha256), net8->buffers.add_to(result["memory"]);
    if (!weights_file.empty()) result["model"]["weights_file"] = weights_file;
    if (net32 || net8) {
        result["phases"] = clock.as_json();
        result["warmup"] = {{"steps", st.warmup_steps}, {"seconds", st.warmup_seconds}};
    }
    result["steps"] = st.steps;
    result["train_seconds"] = st.train_seconds;
    result["epochs"] = st.epochs;
    result["timed_loop_load"] = st.load.record();
    result["env"]["threads"] = threads_record();
    if (!st.trace.empty()) result["trace"] = st.trace;
    result["memory"]["peak_rss_bytes"] = peak_rss_bytes();
    result["wall_seconds"] = std::chrono::duration<double>(Clock::now() - wall0).count();
    result["cpu_seconds"] = own_cpu_seconds();  // what the harness nets out of the machine's load
    std::vector<std::string> nonfinite;
    find_nonfinite(result, "", nonfinite);
    if (!nonfinite.empty()) {
        std::sort(nonfinite.begin(), nonfinite.end());
        nonfinite.erase(std::unique(nonfinite.begin(), nonfinite.end()), nonfinite.end());
        result["nonfinite"] = nonfinite;
    }
    write_atomic(out_path, result);
    emit({{"event", "done"}, {"status", result["status"]}, {"error", result["error"]}});
    return result["status"] == "ok" ? 0 : 1;
}
