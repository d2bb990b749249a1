#include "engine/rng.h"

namespace kiln {

namespace {
inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

void Rng::Seed(uint64_t seed) {
  uint64_t x = seed;
  for (auto& word : s_) {
    x += 0x9E3779B97F4A7C15ull;
    word = SplitMix64(x);
  }
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

float Rng::Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }

uint64_t Rng::Below(uint64_t n) {
  // Rejection sampling keeps the distribution exactly uniform.
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  uint64_t x;
  do {
    x = Next();
  } while (x >= limit);
  return x % n;
}

std::vector<int32_t> Rng::Permutation(int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = i;
  for (int32_t i = n - 1; i > 0; --i) std::swap(p[i], p[Below(static_cast<uint64_t>(i) + 1)]);
  return p;
}

}  // namespace kiln
