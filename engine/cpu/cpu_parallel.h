// How the CPU backend's op files split work over OpenMP threads. Internal to engine/cpu/.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::cpu_internal {

// Below this many elements a loop runs on the calling thread: waking the team costs more.
inline constexpr int64_t kParallelMin = 1 << 15;

// Samples go to threads in fixed contiguous blocks (static schedule), so every reduction sums in
// the same order on every run with the same thread count.
inline int SampleThreads(int batch, int threads) { return std::max(1, std::min(batch, threads)); }

}  // namespace kiln::cpu_internal
