#include "core/ckpt/checksum.h"

#include <bit>
#include <cstdio>
#include <cstring>

namespace pt::ckpt {
namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian host needs byte swaps here");

constexpr uint64_t kPrime = 0x100000001b3ull;
constexpr uint64_t kOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kPhi = 0x9e3779b97f4a7c15ull;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a bijection with full avalanche
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t checksum64(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4];
  for (uint64_t k = 0; k < 4; k++) lane[k] = kOffset ^ (k * kPhi);
  const size_t words = bytes / 8;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    uint64_t w[4];
    std::memcpy(w, p + i * 8, 32);
    for (int k = 0; k < 4; k++) lane[k] = (lane[k] ^ w[k]) * kPrime;
  }
  for (; i < words; i++) {
    uint64_t w;
    std::memcpy(&w, p + i * 8, 8);
    lane[i % 4] = (lane[i % 4] ^ w) * kPrime;
  }
  if (const size_t tail = bytes % 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + words * 8, tail);
    lane[words % 4] = (lane[words % 4] ^ w) * kPrime;
  }
  uint64_t h = static_cast<uint64_t>(bytes) * kPhi;
  for (uint64_t l : lane) h = mix(h ^ l);
  return h;
}

std::string checksum_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace pt::ckpt
