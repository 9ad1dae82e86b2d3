// zrng::add_normal, the FP32 perturbation's SIMD pass, against numpy and against the scalar
// lambda it replaced (tests/test_zrng.py): for a key, start and count on the command line, the z
// it adds to zeros with alpha = 1 (exactly z) as float32 bits, one per line, then whether it adds
// alpha * z to other weights exactly as each_bits32 with normal() does.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zrng.hpp"

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    const uint64_t key = std::strtoull(argv[1], nullptr, 0);
    const size_t start = std::strtoull(argv[2], nullptr, 0), n = std::strtoull(argv[3], nullptr, 0);
    // the weights of [start, start + n) at their absolute indices, as the nets index them
    std::vector<float> z(n, 0.f), a(n), b(n);
    const auto at = [start](std::vector<float>& v) { return reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(v.data()) - start * sizeof(float)); };
    zrng::add_normal(at(z), key, start, n, 1.f);
    for (size_t i = 0; i < n; ++i) a[i] = b[i] = float(i % 97) * 0.013f - 0.6f;
    const float alpha = -0.0371f, scale = zrng::z_scale();
    zrng::add_normal(at(a), key, start, n, alpha);
    float* bb = at(b);
    zrng::each_bits32(key, start, n, [=](size_t i, uint32_t x) { bb[i] += alpha * zrng::normal(x, scale); });
    for (float v : z) {
        uint32_t w;
        std::memcpy(&w, &v, 4);
        std::printf("%08" PRIx32 "\n", w);
    }
    std::printf("%s\n", std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0 ? "same" : "differs");
    return 0;
}
