// The checkpoint checksum, "fnv1a64x4": a fast 64-bit hash of a byte range, written here so the
// format depends on nothing outside this file. Its definition is part of the checkpoint format
// (manifest.json names it), so it must never change; a new hash gets a new name.
//
// Definition. The bytes are read as little-endian 64-bit words (the last partial word, if any,
// is padded with zero bytes). Word i goes to lane i % 4; each lane is an FNV-1a chain over
// words: lane = (lane ^ word) * 0x100000001b3, starting from 0xcbf29ce484222325 ^ (k * phi)
// for lane k (phi = 0x9e3779b97f4a7c15). The result folds the byte length and the four lanes
// through the splitmix64 finaliser: h = length * phi; for each lane k: h = mix(h ^ lane_k).
//
// Why this shape: four independent multiply chains run at memory speed (one chain would be
// bound by multiply latency), and every step is a bijection of the lane state, so any change
// confined to one 8-byte word is ALWAYS detected; other corruptions are caught with
// probability 1 - 2^-64. It is not a cryptographic hash: it guards against disks and bugs, not
// against an adversary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace pt::ckpt {

inline constexpr const char* kChecksumName = "fnv1a64x4";

uint64_t checksum64(const void* data, size_t bytes);

// 16 lowercase hex digits: JSON numbers lose precision above 2^53, strings do not.
std::string checksum_hex(uint64_t h);

}  // namespace pt::ckpt
