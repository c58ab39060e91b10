#include "core/dist/coordination.h"

#include <algorithm>
#include <cstring>

#include "core/common/error.h"

namespace pt {

namespace {

// A host vector seen as a Tensor: the control messages below live in host memory.
template <class T>
Tensor host_tensor(std::vector<T>& v, DType dtype) {
  return Tensor{v.data(), v.size(), dtype};
}

// Strings travel as int32 words (the Comm moves typed elements, not bytes).
std::vector<int32_t> to_words(const std::string& s, size_t words) {
  std::vector<int32_t> w(words, 0);
  std::memcpy(w.data(), s.data(), s.size());
  return w;
}

}  // namespace

int first_rank_with(Comm& group, bool flag) {
  std::vector<double> flags(group.size(), 0.0);
  flags[group.rank()] = flag ? 1.0 : 0.0;
  group.all_reduce(flags.data(), flags.size());
  for (int r = 0; r < group.size(); r++)
    if (flags[r] > 0) return r;
  return -1;
}

bool is_config_error(std::exception_ptr failure) {
  if (!failure) return false;
  try {
    std::rethrow_exception(failure);
  } catch (const ConfigError&) {
    return true;
  } catch (...) {
  }
  return false;
}

void agree(Comm& group, std::exception_ptr local_failure, const std::string& what) {
  const int failed = first_rank_with(group, local_failure != nullptr);
  const int failed_config = first_rank_with(group, is_config_error(local_failure));
  if (local_failure) std::rethrow_exception(local_failure);
  if (failed < 0) return;
  const std::string msg = what + " failed on rank " + std::to_string(group.members()[failed]) + " (see its error)";
  if (failed_config == failed) throw ConfigError(msg);
  throw RuntimeError(msg);
}

std::vector<std::string> all_gather_strings(Comm& group, const std::string& text) {
  const int n = group.size();
  std::vector<double> lengths(n, 0.0);
  lengths[group.rank()] = static_cast<double>(text.size());
  group.all_reduce(lengths.data(), lengths.size());
  size_t longest = 0;
  for (double l : lengths) longest = std::max(longest, static_cast<size_t>(l));
  const size_t words = (longest + 3) / 4;
  std::vector<int32_t> mine = to_words(text, words), all(words * n);
  if (words > 0) group.all_gather(host_tensor(mine, DType::i32), host_tensor(all, DType::i32));
  std::vector<std::string> out(n);
  for (int r = 0; r < n; r++)
    out[r].assign(reinterpret_cast<const char*>(all.data() + r * words), static_cast<size_t>(lengths[r]));
  return out;
}

std::string broadcast_string(Comm& group, const std::string& text, int root) {
  double length = group.rank() == root ? static_cast<double>(text.size()) : 0.0;
  // A sum in which only the root contributes is the root's length.
  group.all_reduce(&length, 1);
  std::vector<int32_t> words = to_words(group.rank() == root ? text : std::string(), (static_cast<size_t>(length) + 3) / 4);
  if (!words.empty()) group.broadcast(host_tensor(words, DType::i32), root);
  return std::string(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
}

}  // namespace pt
