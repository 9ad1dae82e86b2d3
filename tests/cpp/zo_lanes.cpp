// The ZO passes' SIMD lanes against numpy and torch (tests/test_zrng.py). FP32: for the key, start
// and count on the command line, the z zrng::add_normal adds to zeros with alpha = 1 (exactly z) as
// float32 bits, one per line, then whether it adds alpha * z to other weights exactly as
// each_bits32 with normal() does. INT8: for the same key, an INT8 start and count, a scale and a
// sparsity threshold, the z int8::zo_pass adds to zero weights (in [-scale, scale]: exactly z), one
// per line.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "int8_z.hpp"

int main(int argc, char** argv) {
    if (argc != 8) return 2;
    const uint64_t key = std::strtoull(argv[1], nullptr, 0);
    const size_t start = std::strtoull(argv[2], nullptr, 0), n = std::strtoull(argv[3], nullptr, 0);
    // the weights of [start, start + n) at their absolute indices, as the nets index them
    const auto at = [](auto& v, size_t first) { return v.data() - first; };
    std::vector<float> z(n, 0.f), a(n), b(n);
    zrng::add_normal(at(z, start), key, start, n, 1.f);
    for (size_t i = 0; i < n; ++i) a[i] = b[i] = float(i % 97) * 0.013f - 0.6f;
    const float alpha = -0.0371f, scale = zrng::z_scale();
    zrng::add_normal(at(a, start), key, start, n, alpha);
    float* bb = at(b, start);
    zrng::each_bits32(key, start, n, [=](size_t i, uint32_t x) { bb[i] += alpha * zrng::normal(x, scale); });
    for (float v : z) {
        uint32_t w;
        std::memcpy(&w, &v, 4);
        std::printf("%08" PRIx32 "\n", w);
    }
    std::printf("%s\n", std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0 ? "same" : "differs");

    const size_t start8 = std::strtoull(argv[4], nullptr, 0), n8 = std::strtoull(argv[5], nullptr, 0);
    const int16_t r = int16_t(std::atoi(argv[6]));
    const uint16_t thr = uint16_t(std::atoi(argv[7]));
    std::vector<int8_t> q(n8, 0);
    int8::zo_pass(at(q, start8), key, start8, n8, [=](auto& e, const auto& u) { int8::zo_noise(e, u, r, thr); });
    for (int8_t v : q) std::printf("%d\n", int(v));
    return 0;
}
