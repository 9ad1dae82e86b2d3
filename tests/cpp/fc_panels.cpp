// The INT8 FC forward's GEMM (int8_kernels.hpp fc_forward: weights packed a panel of outputs at a
// time) against the plain sum of products, on shapes no model has: inputs that are no multiple of
// four bytes or of a 16-byte vector, fewer outputs than a panel, a thread's share that is no
// multiple of four rows, batches that leave a short block of images, a team of three threads.
// Prints a line per shape, "B I O same" or "B I O differs"; tests/test_int8.py runs it on
// both panel layouts (a lane's bytes in order, and neon-smull's).
#include <cstdio>
#include <vector>

#include "int8_kernels.hpp"

int main() {
    // the last two are large enough to be split among the team (fc_forward), in uneven shares
    const int shapes[][3] = {{1, 1, 1},     {5, 3, 7},       {7, 17, 33},      {32, 84, 10},
                             {6, 30, 40},   {13, 401, 65},   {32, 400, 121},   {33, 122, 700}};
    team::get().configure(3, team::Wait::PASSIVE);
    const int T = team::size();
    for (const auto& s : shapes) {
        const int B = s[0], I = s[1], O = s[2];
        std::vector<uint8_t> in(size_t(B) * I + int8::READ_SLACK);
        std::vector<int8_t> w(size_t(O) * I), panels(size_t(T) * int8::fc_panel_bytes(I) + 1);
        std::vector<int32_t> acc(size_t(B) * O, -1);
        for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t((i * 37 + 11) % 128);
        for (size_t i = 0; i < w.size(); ++i) w[i] = int8_t(int((i * 91 + 5) % 255) - 127);
        int8::fc_forward(acc.data(), in.data(), w.data(), B, I, O, panels.data());
        bool same = true;
        for (int b = 0; b < B; ++b)
            for (int o = 0; o < O; ++o) {
                int32_t sum = 0;
                for (int i = 0; i < I; ++i) sum += int32_t(in[size_t(b) * I + i]) * int32_t(w[size_t(o) * I + i]);
                same = same && acc[size_t(b) * O + o] == sum;
            }
        std::printf("%d %d %d %s\n", B, I, O, same ? "same" : "differs");
    }
}
