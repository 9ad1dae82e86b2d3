// zobench-z v1 (docs/zrng.md): the counter-based generator shared with the Python runners.
// Bit-identical to workloads/zrng.py: integer mixing, then one float32 multiply.
#pragma once
#include <cstdint>

namespace zrng {

constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;
constexpr uint64_t STREAM_ZO = 1, STREAM_INIT = 2, STREAM_DATA = 3;
constexpr int32_t Z_OFFSET = 2 * 65535;
// float32(sqrt(3 / (65536^2 - 1))), bits 0x37DDB3D7
inline float z_scale() {
    const uint32_t bits = 0x37DDB3D7u;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline uint64_t stream_key(uint64_t seed, uint64_t stream, uint64_t counter) {
    return mix64(mix64(mix64(seed) ^ stream) ^ counter);
}

inline uint64_t bits(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * GOLDEN); }

// z[i]: the sum of the four 16-bit lanes, centred, times Z_SCALE (Irwin-Hall n=4, unit variance)
inline float normal(uint64_t key, uint64_t i, float scale) {
    uint64_t b = bits(key, i);
    int32_t s = int32_t(b & 0xFFFF) + int32_t((b >> 16) & 0xFFFF) + int32_t((b >> 32) & 0xFFFF) + int32_t(b >> 48);
    return float(s - Z_OFFSET) * scale;
}

// u[i] in [0, 1): the top 24 bits, exact
inline float uniform(uint64_t key, uint64_t i) { return float(bits(key, i) >> 40) * (1.0f / 16777216.0f); }

}  // namespace zrng
