// Seeded, checkpointable random numbers: xoshiro256** for sequences (shuffling, initialisation)
// and a counter-based hash for element-wise randomness (dropout) that any device can compute.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kiln {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { Seed(seed); }
  void Seed(uint64_t seed);

  uint64_t Next();
  // Uniform in [0, 1).
  float Uniform();
  // Uniform in [lo, hi).
  float Uniform(float lo, float hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n).
  uint64_t Below(uint64_t n);
  // A fresh permutation of 0..n-1 (Fisher-Yates).
  std::vector<int32_t> Permutation(int32_t n);

  using State = std::array<uint64_t, 4>;
  State state() const { return s_; }
  void set_state(const State& s) { s_ = s; }

 private:
  State s_{};
};

// Stateless mixing of (seed, index) into a uniform [0, 1) float: the same on every backend.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float CounterUniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(SplitMix64(seed ^ SplitMix64(index)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace kiln
