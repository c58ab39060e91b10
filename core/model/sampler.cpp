#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/common/counter_rng.h"

namespace pt {

int32_t choose_token(std::span<const float> logits, double temperature, int top_k, double u) {
  check(!logits.empty(), "choose_token: no logits");
  const int V = static_cast<int>(logits.size());
  // std::max_element returns the first maximum: the lowest id among ties.
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (temperature <= 0 || top_k == 1) return argmax;

  // The candidates, in ascending id order: every id, or the top_k (ordered by logit, ties by id).
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  if (top_k > 0 && top_k < V) {
    auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::nth_element(ids.begin(), ids.begin() + (top_k - 1), ids.end(), before);
    ids.resize(top_k);
    std::sort(ids.begin(), ids.end());
  }
  const double mx = logits[argmax];  // the argmax is always a candidate
  std::vector<double> p(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); i++) total += p[i] = std::exp((logits[ids[i]] - mx) / temperature);
  const double target = u * total;
  double cum = 0;
  for (size_t i = 0; i < ids.size(); i++) {
    cum += p[i];
    if (cum > target) return ids[i];
  }
  // Rounding left the cumulative sum a hair short of target: the last candidate with mass.
  for (size_t i = ids.size(); i-- > 0;)
    if (p[i] > 0) return ids[i];
  return argmax;
}

double sample_uniform(uint64_t seed, uint64_t i) {
  static const uint64_t stream = hash_name("sample");
  // counter_uniform is in (0, 1); u < 1 always, and a 0 would only ever pick the first candidate.
  return counter_uniform(seed, stream, i);
}

std::vector<int32_t> generate(KvCacheDecoder& decoder, std::span<const int32_t> context, const SampleOptions& o,
                              int vocab, const std::function<void(int32_t)>& on_token) {
  std::vector<int32_t> out;
  if (o.max_new_tokens <= 0) return out;
  std::span<const float> logits = decoder.prime(context);
  vocab = std::min<int>(vocab, static_cast<int>(logits.size()));
  for (int i = 0; i < o.max_new_tokens; i++) {
    const int32_t id = choose_token(logits.first(vocab), o.temperature, o.top_k, sample_uniform(o.seed, i));
    out.push_back(id);
    if (on_token) on_token(id);
    if (id == o.stop_token || i + 1 == o.max_new_tokens) break;
    logits = decoder.push(id);
  }
  return out;
}

namespace {
// Bytes a character starting with `lead` has in all (1 for ASCII); 0 when `lead` cannot start
// one (a continuation byte, or a byte UTF-8 never uses).
int utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}
bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  // Hold back only a suffix that is the start of a character still missing bytes: a lead byte in
  // the last three followed by nothing but continuation bytes, fewer than it needs. Everything
  // before it is final, valid or not.
  size_t keep_from = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); back++) {
    const size_t i = pending_.size() - back;
    const auto c = static_cast<unsigned char>(pending_[i]);
    if (is_continuation(c)) continue;
    if (utf8_length(c) > static_cast<int>(back)) keep_from = i;
    break;
  }
  std::string ready = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return ready;
}

std::string Utf8Stream::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

std::string tokenizer_for_vocab(int vocab_size) {
  if (vocab_size == 256) return "bytes";
  if (vocab_size == 50257) return "gpt2";
  if (vocab_size == 128256) return "llama3";
  return "";
}

const char* vocabularies_with_a_tokenizer() {
  return "the byte tokenizer's (256), GPT-2's (50257) or Llama 3's (128256)";
}

}  // namespace pt
