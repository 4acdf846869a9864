// Counter-based random numbers for the CPU kernels (Dropout, Attention's dropout): a value is a
// hash of a key and an element index, so it does not depend on how work is split across threads,
// and a backward kernel regenerates the forward's mask from the key.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

namespace graphtrain::cpu {

inline uint64_t mix(uint64_t z) {  // splitmix64 finalizer
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits, like a float32 generator.
inline float uniform(uint64_t key, uint64_t index) {
  return static_cast<float>(mix(key ^ mix(index)) >> 40) * (1.0f / 16777216.0f);
}

// A seed no other kernel instance of this process shares.
inline uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{0};
  return mix(std::random_device{}() ^ counter.fetch_add(1));
}

}  // namespace graphtrain::cpu
