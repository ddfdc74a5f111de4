// alloc_churn: an allocation-heavy program for measuring heap checkers (tools/debug-overhead).
// Builds and tears down a string-keyed map of vectors, and churns a ring of malloc'd blocks of
// 16 B-4 KiB, with a fixed seed; prints a checksum so every checker's run can be compared with
// the plain run's output. Frees everything: a checker that reports a leak here is wrong.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

std::uint64_t state = 0x9e3779b97f4a7c15ull;
std::uint64_t next_random() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

std::uint64_t map_churn(int rounds) {
  std::uint64_t sum = 0;
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, std::vector<int>> table;
    for (int i = 0; i < 2000; ++i) {
      std::string key = "key-" + std::to_string(next_random() % 5000);
      auto& values = table[key];
      const int n = static_cast<int>(next_random() % 24);
      for (int j = 0; j < n; ++j) values.push_back(j * i);
    }
    for (const auto& [key, values] : table) sum += key.size() + values.size();
  }
  return sum;
}

std::uint64_t ring_churn(int operations) {
  constexpr int slots = 4096;
  static unsigned char* ring[slots];
  static std::size_t sizes[slots];
  std::uint64_t sum = 0;
  for (int i = 0; i < operations; ++i) {
    const int slot = static_cast<int>(next_random() % slots);
    if (ring[slot] != nullptr) {
      sum += ring[slot][sizes[slot] - 1];
      std::free(ring[slot]);
    }
    const std::size_t size = 16 + next_random() % 4081;
    ring[slot] = static_cast<unsigned char*>(std::malloc(size));
    if (ring[slot] == nullptr) std::abort();
    std::memset(ring[slot], static_cast<int>(i & 0xff), size);
    sizes[slot] = size;
  }
  for (auto*& block : ring) {
    std::free(block);
    block = nullptr;
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const int scale = argc > 1 ? std::atoi(argv[1]) : 1;
  const std::uint64_t a = map_churn(20 * scale);
  const std::uint64_t b = ring_churn(200000 * scale);
  std::printf("alloc_churn: %llu %llu\n", static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
  return 0;
}
