#include "core/data/data_loader.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

namespace {

int checked_positive(int v, const char* what) {
  check(v > 0, std::string("DataLoader: ") + what + " must be positive, got " + std::to_string(v));
  return v;
}

}  // namespace

DataLoader::DataLoader(const std::string& glob, int vocab_size, int B, int T)
    : stream_(glob, vocab_size),
      B_(checked_positive(B, "B (micro_batch_size)")),
      T_(checked_positive(T, "T (seq_len)")) {
  const auto need = static_cast<uint64_t>(T) + 1;
  if (total_tokens() < need)
    throw RuntimeError("data '" + glob + "': the " + std::to_string(files().size()) + " shard(s) hold " +
                       std::to_string(total_tokens()) + " tokens, fewer than one sequence needs (batch.seq_len + 1 = " +
                       std::to_string(need) + "); use more data or a shorter seq_len");
}

void DataLoader::load(uint64_t cursor, int64_t first_sequence, int32_t* inputs, int32_t* targets) const {
  check(first_sequence >= 0, "DataLoader::load: negative first_sequence " + std::to_string(first_sequence));
  const uint64_t total = total_tokens();
  const auto T = static_cast<uint64_t>(T_);
  // The cursor grows without bound over a long run; reduce everything modulo total so the sum
  // cannot overflow (the 128-bit product covers any sequence index).
  const uint64_t base = cursor % total;
  std::vector<int32_t> row(T + 1);
  for (int b = 0; b < B_; ++b) {
    const uint64_t s = static_cast<uint64_t>(first_sequence) + static_cast<uint64_t>(b);
    const auto offset = static_cast<uint64_t>(static_cast<unsigned __int128>(s) * T % total);
    stream_.read((base + offset) % total, T + 1, row.data());
    std::copy(row.begin(), row.end() - 1, inputs + b * T);
    std::copy(row.begin() + 1, row.end(), targets + b * T);
  }
}

}  // namespace pt
