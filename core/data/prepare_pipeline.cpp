#include "core/data/prepare_pipeline.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

EncodedItem encode_item(const WorkItem& item, const Tokenizer& tok, TokenEncoder& enc, uint64_t val_units) {
  EncodedItem out;
  out.disk_done = item.disk_done;
  out.text_bytes = item.text.size();
  const std::vector<int32_t> prefix = tok.document_prefix(), suffix = tok.document_suffix();
  std::vector<int32_t> ids;
  std::vector<size_t> starts;
  uint64_t unit = item.first_unit;
  auto add_special = [&](const std::vector<int32_t>& special) {
    for (int32_t id : special) {
      ids.push_back(id);
      out.val_tokens += unit++ < val_units;
    }
  };
  for (const auto& piece : item.pieces) {
    if (piece.starts_document) add_special(prefix);
    const std::string_view text = std::string_view(item.text).substr(piece.begin, piece.end - piece.begin);
    const size_t before = ids.size();
    if (unit >= val_units || unit + text.size() <= val_units) {
      enc.encode(text, ids);
      if (unit < val_units) out.val_tokens += ids.size() - before;
    } else {  // the split falls inside this text: find which tokens start before it
      starts.clear();
      enc.encode(text, ids, &starts);
      for (size_t s : starts) out.val_tokens += unit + s < val_units;
    }
    unit += text.size();
    if (piece.ends_document) add_special(suffix);
  }
  out.units = unit - item.first_unit;
  out.tokens = std::move(ids);
  return out;
}

EncodePipeline::EncodePipeline(const Tokenizer& tok, int threads, uint64_t val_units,
                               std::function<void(EncodedItem&)> consume)
    : tok_(tok),
      val_units_(val_units),
      max_in_flight_(2 * static_cast<size_t>(std::max(threads, 1)) + 1),
      consume_(std::move(consume)) {
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { work(); });
}

EncodePipeline::~EncodePipeline() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void EncodePipeline::work() {
  std::unique_ptr<TokenEncoder> enc;
  for (;;) {
    std::pair<uint64_t, WorkItem> job;
    {
      std::unique_lock lock(mu_);
      work_ready_.wait(lock, [&] { return stop_ || !todo_.empty(); });
      if (stop_) return;
      job = std::move(todo_.front());
      todo_.pop_front();
    }
    try {
      if (!enc) enc = tok_.encoder();
      EncodedItem result = encode_item(job.second, tok_, *enc, val_units_);
      std::lock_guard lock(mu_);
      done_.emplace(job.first, std::move(result));
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    result_ready_.notify_all();
  }
}

void EncodePipeline::submit(WorkItem item) {
  {
    std::lock_guard lock(mu_);
    todo_.emplace_back(submitted_++, std::move(item));
  }
  work_ready_.notify_one();
  drain(max_in_flight_);
}

void EncodePipeline::finish() { drain(0); }

void EncodePipeline::drain(size_t max_in_flight) {
  for (;;) {
    std::unique_lock lock(mu_);
    result_ready_.wait(lock, [&] {
      return error_ || done_.count(consumed_) != 0 || submitted_ - consumed_ <= max_in_flight;
    });
    if (error_) std::rethrow_exception(error_);
    auto it = done_.find(consumed_);
    if (it == done_.end()) return;  // nothing ready, and few enough in flight
    EncodedItem result = std::move(it->second);
    done_.erase(it);
    ++consumed_;
    lock.unlock();
    consume_(result);
  }
}

}  // namespace pt
