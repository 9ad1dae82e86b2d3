// The binary's threads: one team, started once, that every parallel loop of a step runs on.
//
// Why not OpenMP's: a step of LeNet-5 at batch 32 is ~20 parallel loops of 10-100 us each, and
// how a thread waits between them decides the step's time. OpenMP fixes the waiting once, for the
// whole process, from OMP_WAIT_POLICY, and no one setting is right both on a quiet machine and on a
// loaded one (docs/threads.md has the measurements):
// - sleeping (passive) costs a wake-up per loop; on a quiet VM or board that wakes a halted, idle
//   core, ~50 us a loop, and made two threads slower than one;
// - spinning (active, or libgomp's spin-then-sleep) is fastest on a quiet machine and collapses
//   beside other work: a thread spins for a sibling that the kernel has descheduled for a
//   neighbour's time slice, 30-60x slower beside one busy loop.
// So this team runs on the cores the machine leaves it. Every WINDOW_NS the caller of the loops
// (thread 0) reads how long the team's threads waited, runnable, for a CPU (each thread's
// run_delay in /proc/thread-self/schedstat; where the kernel keeps none, the process's
// involuntary context switches stand in), and how many tasks other than the team's are
// runnable (/proc/loadavg). While the waits stay under CONTENDED of the team's time and no other
// task runs (calm), every thread works and an idle one spins up to SPIN_NS before it sleeps on a
// futex. Otherwise only as many threads work as the other tasks leave cores free, at least the
// caller, and none spins: a thread that would wait for a descheduled sibling at every loop does
// its sibling's share itself instead (two threads beside a busy loop per core: each loop a
// scheduler round trip; the caller alone: one core, no waits).
// OMP_WAIT_POLICY=ACTIVE / PASSIVE fix the choice (every thread, always spin / never), as in OpenMP.
//
// What a loop computes never depends on how many threads worked: a loop is cut into T slots,
// T the team's size, split as OpenMP's schedule(static) splits it among T threads (the first n %
// T one item more), and the working threads run the slots between them. Per-slot partial sums
// are therefore those of T threads under OpenMP, whatever the load. Regions do not nest: a loop
// inside a loop runs on its caller's thread alone.
#pragma once
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace team {

enum class Wait { AUTO, PASSIVE, ACTIVE };
inline const char* name_of(Wait w) { return w == Wait::AUTO ? "auto" : w == Wait::PASSIVE ? "passive" : "active"; }

constexpr int64_t SPIN_NS = 200'000;      // how long an idle thread spins while the machine is calm
constexpr int64_t WINDOW_NS = 2'000'000;  // how often thread 0 looks at the team's waits for a CPU
constexpr double CONTENDED = 0.02;        // the share of the team's time spent waiting that says other
                                          // work wants its cores (a decaying mean over the windows)
constexpr double SWITCHES_PER_S = 500;    // without schedstat: involuntary switches a second that say so
constexpr double OTHERS = 0.5;            // other runnable tasks (a decaying mean) that end the calm
constexpr double DECAY = 0.75;            // each window's weight in those means is 1 - DECAY

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t value) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, value, nullptr, nullptr, 0);
}
inline void futex_wake(std::atomic<uint32_t>* word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// true once ready() holds, spinning at most budget_ns (< 0: for ever); false when the budget ran out
template <class Ready>
inline bool spin_until(Ready ready, int64_t budget_ns) {
    if (ready()) return true;
    if (budget_ns == 0) return false;
    const int64_t start = now_ns();
    for (unsigned i = 1;; ++i) {
        relax();
        if (ready()) return true;
        if (budget_ns > 0 && i % 64 == 0 && now_ns() - start > budget_ns) return false;
    }
}

// the CPUs this process may run on (taskset, a cgroup's cpuset), as OpenMP counts its default team
inline int cpus_allowed() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
}

inline Wait wait_from_env() {
    const char* v = std::getenv("OMP_WAIT_POLICY");
    std::string s = v ? v : "";
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    return s == "PASSIVE" ? Wait::PASSIVE : s == "ACTIVE" ? Wait::ACTIVE : Wait::AUTO;
}

thread_local inline bool in_region = false;

class Team {
   public:
    Team() = default;
    Team(const Team&) = delete;
    ~Team() { stop(); }

    // the team's size (0: OMP_NUM_THREADS, else every allowed CPU) and waiting; before the first loop
    void configure(int threads, Wait wait) {
        stop();
        if (threads <= 0) {
            const char* env = std::getenv("OMP_NUM_THREADS");
            threads = env ? std::atoi(env) : 0;
        }
        n_ = threads > 0 ? threads : cpus_allowed();
        wait_ = wait;
        cpus_ = std::min(n_, cpus_allowed());
        calm_ = wait_ != Wait::PASSIVE;
        active_ = wait_ == Wait::AUTO ? cpus_ : n_;
        budget_.store(budget(), std::memory_order_relaxed);
        slots_ = std::make_unique<Slot[]>(size_t(n_));
        delays_ = std::make_unique<std::atomic<int>[]>(size_t(n_));
        for (int t = 0; t < n_; ++t) delays_[size_t(t)].store(t ? -1 : open_schedstat());
        // under auto at most cpus_ threads ever work a loop (watch): a thread past them would only
        // wake at every fork to find nothing to do, and spin on a CPU the working ones need
        started_ = wait_ == Wait::AUTO ? cpus_ : n_;
        for (int t = 1; t < started_; ++t) workers_.emplace_back([this, t] { work(t); });
        loadavg_ = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        window_start_ = now_ns(), waited_ = run_delay(), switches_ = involuntary_switches(), pressure_ = others_ = 0;
    }

    int size() const { return n_; }

    // f(t, T) for every slot t < T of the team (T its size), the working threads taking the
    // slots in turn, the caller as thread 0; returns when all are done
    template <class F>
    void run(F&& f) {
        if (n_ == 1 || in_region) {
            f(0, 1);
            return;
        }
        watch();
        const int working = active_;
        in_region = true;
        if (working > 1) {
            using Fn = std::remove_reference_t<F>;
            job_ = const_cast<void*>(static_cast<const void*>(&f));
            call_ = [](void* fn, int t, int T) { (*static_cast<Fn*>(fn))(t, T); };
            pending_.store(uint32_t(working - 1), std::memory_order_relaxed);
            gen_.store(((gen_.load(std::memory_order_relaxed) >> WORKING_BITS) + 1) << WORKING_BITS | uint32_t(working),
                       std::memory_order_seq_cst);
            if (sleepers_.load(std::memory_order_seq_cst) > 0) futex_wake(&gen_);
        }
        for (int t = 0; t < n_; t += working) f(t, n_);
        in_region = false;
        if (working > 1) join();
    }

    // a thread's own cache line, for partial results (reduce)
    template <class T>
    T& slot(int t) {
        static_assert(sizeof(T) <= sizeof(Slot), "a slot is one cache line");
        return *reinterpret_cast<T*>(slots_[size_t(t)].bytes);
    }

    // what the team did, for the result's env.threads: its size, the wait policy, the share of
    // parallel loops started while it spun (calm), the mean threads that worked a loop, and how
    // long an idle thread spins while calm
    struct Record {
        int threads;
        std::string wait;
        double spinning_share, working;
        int64_t spin_ns;
    };
    Record record() const {
        const double all = double(forks_calm_ + forks_contended_);
        return {n_, name_of(wait_), all > 0 ? double(forks_calm_) / all : (calm_ ? 1.0 : 0.0),
                all > 0 ? double(worked_) / all : double(active_),
                wait_ == Wait::ACTIVE ? -1 : wait_ == Wait::PASSIVE ? 0 : SPIN_NS};
    }
    void reset_record() { forks_calm_ = forks_contended_ = worked_ = 0; }

   private:
    struct alignas(64) Slot {
        unsigned char bytes[64];
    };

    int64_t budget() const { return wait_ == Wait::ACTIVE ? -1 : calm_ ? SPIN_NS : 0; }

    // the tasks runnable on the machine now (/proc/loadavg's fourth field, "R/total"); -1 unknown
    int runnable() const {
        char buf[128];
        const ssize_t got = loadavg_ < 0 ? -1 : pread(loadavg_, buf, sizeof buf - 1, 0);
        if (got <= 0) return -1;
        buf[got] = 0;
        const char* slash = std::strchr(buf, '/');
        const char* at = slash;
        while (at && at > buf && at[-1] != ' ') --at;
        return at ? std::atoi(at) : -1;
    }

    static int open_schedstat() { return open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC); }

    // the team's total time waiting for a CPU, in ns (schedstat's second field); -1 where unknown
    int64_t run_delay() const {
        int64_t sum = 0;
        for (size_t t = 0; t < size_t(started_); ++t) {
            const int fd = delays_ ? delays_[t].load(std::memory_order_acquire) : -1;
            char buf[96];
            const ssize_t got = fd < 0 ? -1 : pread(fd, buf, sizeof buf - 1, 0);
            if (got <= 0) return -1;
            buf[got] = 0;
            char* rest = nullptr;
            std::strtoull(buf, &rest, 10);
            sum += int64_t(std::strtoull(rest, nullptr, 10));
        }
        return sum;
    }

    static long involuntary_switches() {
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        return ru.ru_nivcsw;
    }

    // thread 0, at each fork: once a window, is other work taking the team's cores, and how many
    // does it leave?
    void watch() {
        if (wait_ == Wait::AUTO) {
            const int64_t t = now_ns(), window = t - window_start_;
            if (window >= WINDOW_NS) {
                const int64_t waited = run_delay();
                const long switches = involuntary_switches();
                const double share = waited >= 0 && waited_ >= 0 ? double(waited - waited_) / (double(window) * active_)
                                     : double(switches - switches_) / (SWITCHES_PER_S * 1e-9 * double(window)) * CONTENDED;
                // the team's own runnable threads: the working ones spin at a fork while calm; else
                // the caller alone runs now
                const int r = runnable();
                const double others = r < 0 ? 0.0 : std::max(0, r - (calm_ ? active_ : 1));
                pressure_ = DECAY * pressure_ + (1 - DECAY) * share;
                others_ = DECAY * others_ + (1 - DECAY) * others;
                calm_ = pressure_ < CONTENDED && others_ < OTHERS;
                active_ = calm_ ? cpus_ : std::clamp(int(std::lround(cpus_allowed() - others_)), 1, cpus_);
                budget_.store(budget(), std::memory_order_relaxed);
                waited_ = waited, switches_ = switches, window_start_ = t;
            }
        }
        (calm_ ? forks_calm_ : forks_contended_) += 1;
        worked_ += active_;
    }

    void join() {
        auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
        if (spin_until(done, budget())) return;
        master_asleep_.store(1, std::memory_order_seq_cst);
        for (uint32_t v; (v = pending_.load(std::memory_order_seq_cst)) != 0;) futex_wait(&pending_, v);
        master_asleep_.store(0, std::memory_order_relaxed);
    }

    void work(int t) {
        in_region = true;  // a worker's loops run on it alone
        delays_[size_t(t)].store(open_schedstat(), std::memory_order_release);
        uint32_t seen = 0;
        for (;;) {
            auto forked = [&] { return gen_.load(std::memory_order_acquire) != seen; };
            if (!spin_until(forked, wait_ == Wait::ACTIVE ? -1 : budget_.load(std::memory_order_relaxed))) {
                sleepers_.fetch_add(1, std::memory_order_seq_cst);
                while (gen_.load(std::memory_order_seq_cst) == seen) futex_wait(&gen_, seen);
                sleepers_.fetch_sub(1, std::memory_order_relaxed);
            }
            seen = gen_.load(std::memory_order_acquire);
            if (stopping_.load(std::memory_order_acquire)) return;
            const int working = int(seen & ((1u << WORKING_BITS) - 1));
            if (t >= working) continue;  // not needed this loop: back to waiting
            for (int slot = t; slot < n_; slot += working) call_(job_, slot, n_);
            if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && master_asleep_.load(std::memory_order_seq_cst))
                futex_wake(&pending_);
        }
    }

    void stop() {
        if (!workers_.empty()) {
            stopping_.store(true, std::memory_order_release);
            gen_.fetch_add(1u << WORKING_BITS, std::memory_order_seq_cst);
            futex_wake(&gen_);
            for (auto& w : workers_) w.join();
            workers_.clear();
            stopping_.store(false, std::memory_order_relaxed);
        }
        for (int t = 0; delays_ && t < n_; ++t)
            if (const int fd = delays_[size_t(t)].load(); fd >= 0) close(fd);
        delays_.reset();
        if (loadavg_ >= 0) close(loadavg_);
        loadavg_ = -1;
    }

    int n_ = 1, cpus_ = 1;        // the team's size (its slots), and the threads that may work at once
    int started_ = 1;             // the threads running: the caller and its workers
    int active_ = 1;              // the threads that work the next loop (watch)
    Wait wait_ = Wait::AUTO;
    bool calm_ = true;
    std::vector<std::thread> workers_;
    std::unique_ptr<Slot[]> slots_;
    void* job_ = nullptr;
    void (*call_)(void*, int, int) = nullptr;
    // the fork's generation, and in its low WORKING_BITS the threads that work it: one word, so a
    // worker reads both at once (the futex word the idle threads sleep on)
    static constexpr unsigned WORKING_BITS = 11;
    alignas(64) std::atomic<uint32_t> gen_{0};
    alignas(64) std::atomic<uint32_t> pending_{0};
    alignas(64) std::atomic<uint32_t> master_asleep_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<int64_t> budget_{SPIN_NS};
    std::atomic<bool> stopping_{false};
    // thread 0's view of the machine (watch): each thread's schedstat, what they showed at the
    // window's start, and the decaying share of the team's time spent waiting for a CPU
    std::unique_ptr<std::atomic<int>[]> delays_;
    int loadavg_ = -1;
    int64_t window_start_ = 0, waited_ = -1;
    long switches_ = 0;
    double pressure_ = 0, others_ = 0;
    long forks_calm_ = 0, forks_contended_ = 0, worked_ = 0;
};

// the process's team (configured by train.cpp from the spec's threads and OMP_WAIT_POLICY)
inline Team& get() {
    static Team t;
    return t;
}

inline int size() { return get().size(); }

// thread t's share [lo, hi) of n items among T: OpenMP's schedule(static), the first n % T one more
inline std::pair<long, long> share(long n, int t, int T) {
    const long q = n / T, r = n % T;
    const long lo = t * q + std::min<long>(t, r);
    return {lo, lo + q + (t < r)};
}

// f(t, T) on every thread: a parallel region (per-thread scratch, then share())
template <class F>
inline void run(F&& f) {
    get().run(std::forward<F>(f));
}

// `serial` of the loops below: ALONE runs a loop on its caller's thread whatever its size
constexpr long ALONE = LONG_MAX;

// f(lo, hi) over each thread's share of [0, n): for loops that vectorize or keep per-thread
// state across their items. Below `serial` items the caller runs them all (a loop too small to
// be worth waking the team for).
template <class F>
inline void ranges(long n, F&& f, long serial = 1) {
    if (n <= 0) return;
    if (n < serial || size() == 1) return (void)f(0L, n);
    run([&](int t, int T) {
        const auto [lo, hi] = share(n, t, T);
        if (lo < hi) f(lo, hi);
    });
}

// f(i) for every i < n, split as ranges() splits it
template <class F>
inline void each(long n, F&& f, long serial = 1) {
    ranges(n, [&](long lo, long hi) {
        for (long i = lo; i < hi; ++i) f(i);
    }, serial);
}

// f(lo, hi, acc) over each thread's share into its own acc (from init), the parts combined in
// thread order: OpenMP's reduction clause
template <class T, class F, class C>
inline T reduce(long n, T init, F&& f, C&& combine, long serial = 1) {
    if (n < serial || size() == 1) {
        T acc = init;
        if (n > 0) f(0L, n, acc);
        return acc;
    }
    Team& tm = get();
    int used = 1;
    run([&](int t, int T_) {
        const auto [lo, hi] = share(n, t, T_);
        T acc = init;
        if (lo < hi) f(lo, hi, acc);
        tm.slot<T>(t) = acc;
        if (t == 0) used = T_;
    });
    T out = init;
    for (int t = 0; t < used; ++t) out = combine(out, tm.slot<T>(t));
    return out;
}

}  // namespace team
