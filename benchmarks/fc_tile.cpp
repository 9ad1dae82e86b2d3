// The FP32 FC forward (workloads/cpp/fp32_kernels.hpp fc_forward) on the FC shapes of LeNet-5 and
// PointNet at batch 32, on this process's threads (OMP_NUM_THREADS, as the binary reads it), and
// one register tile alone in L1 beside them: how far the layer is from the tile's rate, and the
// tile from the cores' peak (benchmarks/peak_flops.cpp). Medians of 9 rounds; asserts nothing.
//   g++ -O3 -march=native -fopenmp-simd -pthread -Iworkloads/cpp benchmarks/fc_tile.cpp -o build/fc_tile
//   OMP_NUM_THREADS=1 build/fc_tile
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "fp32_kernels.hpp"

template <class F>
static double median_seconds(F f, int reps) {
    std::vector<double> t;
    for (int round = 0; round < 9; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) f();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main() {
    const int B = 32;
    const int shapes[][2] = {{784, 120}, {120, 84}, {84, 10}, {1024, 512}, {512, 256}, {256, 40}};
    std::printf("fc_forward, batch 32, %s, FC_RO %d\n%10s %10s %10s\n", fp32k::SIMD, fp32k::FC_RO, "I -> O", "us",
                "GFLOP/s");
    for (const auto& s : shapes) {
        const int I = s[0], O = s[1];
        std::vector<float> in(size_t(B) * I), w(size_t(O) * I), bias(size_t(O), 0.f), out(size_t(B) * O);
        for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 13) * 0.01f;
        for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 7) * 0.02f - 0.06f;
        const double sec = median_seconds(
            [&] { fp32k::fc_forward(out.data(), in.data(), w.data(), bias.data(), B, I, O, true); },
            std::max(1, int(2e7 / (double(B) * I * O))));
        std::printf("%4d -> %-3d %10.1f %10.1f\n", I, O, sec * 1e6, 2.0 * B * I * O / sec / 1e9);
    }
    const int I = 784;      // one tile, its rows and images in L1
    std::vector<float> x(size_t(4) * I, 0.01f), w(size_t(fp32k::FC_RO) * I, 0.02f);
    const float* xp[4];
    const float* wp[fp32k::FC_RO];
    for (int j = 0; j < 4; ++j) xp[j] = &x[size_t(j) * I];
    for (int r = 0; r < fp32k::FC_RO; ++r) wp[r] = &w[size_t(r) * I];
    float acc[fp32k::FC_RO][4];
    const double sec = median_seconds([&] { fp32k::dot_tile(acc, wp, xp, I); asm volatile("" ::: "memory"); }, 20000);
    std::printf("one %d x 4 tile, I = %d, in L1: %.3f us, %.1f GFLOP/s\n", fp32k::FC_RO, I, sec * 1e6,
                2.0 * 4 * fp32k::FC_RO * I / sec / 1e9);
}
