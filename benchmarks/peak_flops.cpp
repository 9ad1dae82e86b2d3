// The cores' FP32 peak, measured: every thread runs 16 independent chains of a 16-lane
// multiply-add, enough to fill the FMA pipes of any core, in GCC's portable vector type, so
// -march=native lowers it to AVX-512, AVX2 or NEON as the machine has. Prints GFLOP/s
// (2 per multiply-add) for all threads together. benchmarks/runtimes.py builds and runs it.
#include <omp.h>

#include <cstdio>

typedef float v16 __attribute__((vector_size(64)));

int main() {
    const long rounds = 20000000;
    float sink = 0.f;
    const double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : sink)
    {
        v16 a[16], x, y;
        for (int l = 0; l < 16; ++l) x[l] = 1.0000001f, y[l] = 0.9999999f;
        for (int i = 0; i < 16; ++i)
            for (int l = 0; l < 16; ++l) a[i][l] = float(i);
        for (long r = 0; r < rounds; ++r)
            for (int i = 0; i < 16; ++i) a[i] = a[i] * x + y;
        for (int i = 0; i < 16; ++i)
            for (int l = 0; l < 16; ++l) sink += a[i][l];
    }
    const double seconds = omp_get_wtime() - t0;
    std::printf("%.1f\n", omp_get_max_threads() * double(rounds) * 16 * 16 * 2 / seconds / 1e9);
    return sink == 0.f;  // keeps the work observable
}
