#include "core/data/token_stream.h"

#include <glob.h>

#include <algorithm>

#include "core/common/error.h"

namespace pt {

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty()))
    throw RuntimeError("data: no files match '" + pattern +
                       "' (make shards with scripts/get_data.sh and `picotrain prepare` first?)");
  if (rc != 0) throw RuntimeError("data: cannot expand '" + pattern + "' (glob error " + std::to_string(rc) + ")");
  // glob(3) sorts with strcoll, which depends on the locale; a plain sort is the same everywhere.
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenStream::TokenStream(const std::string& glob, int vocab_size) : files_(expand_glob(glob)) {
  shards_.reserve(files_.size());
  starts_.reserve(files_.size() + 1);
  starts_.push_back(0);
  for (const auto& path : files_) {
    shards_.emplace_back(path, vocab_size);
    starts_.push_back(starts_.back() + shards_.back().size());
  }
  if (total_tokens() == 0)
    throw RuntimeError("data: the " + std::to_string(files_.size()) + " shard(s) matching '" + glob +
                       "' hold no tokens");
}

void TokenStream::read(uint64_t pos, uint64_t n, int32_t* out) const {
  const uint64_t total = total_tokens();
  pos %= total;
  while (n > 0) {
    // The last shard starting at or before pos; empty shards start where their successor does,
    // so upper_bound skips them.
    const size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
    const uint64_t take = std::min(n, starts_[i + 1] - pos);
    shards_[i].read(pos - starts_[i], take, out);
    out += take;
    n -= take;
    pos += take;
    if (pos == total) pos = 0;  // epoch boundary
  }
}

}  // namespace pt
