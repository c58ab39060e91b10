// Encodes work items on a pool of threads and hands the results back in submission order, so the
// shards come out the same whatever the thread count.
//
// The calling thread reads and submits; submit() returns once the item is queued, after handing any
// finished results to `consume` (on the calling thread, in order). At most a few items per
// thread are in flight, which bounds memory to a few chunks per thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/data/prepare_chunker.h"
#include "core/tokenizer/tokenizer.h"

namespace pt {

struct EncodedItem {
  std::vector<int32_t> tokens;
  size_t val_tokens = 0;  // how many of `tokens`, from the front, belong to the val split
  uint64_t units = 0;     // the item's span in the unit stream
  uint64_t text_bytes = 0;
  uint64_t disk_done = 0;
};

// The tokens of one item: each piece's text encoded, with the document prefix/suffix ids around
// it. A token is in val when the unit its text starts at is < val_units (see prepare.h).
EncodedItem encode_item(const WorkItem& item, const Tokenizer& tok, TokenEncoder& enc, uint64_t val_units);

class EncodePipeline {
 public:
  EncodePipeline(const Tokenizer& tok, int threads, uint64_t val_units, std::function<void(EncodedItem&)> consume);
  ~EncodePipeline();  // stops the workers; results not yet consumed are dropped
  EncodePipeline(const EncodePipeline&) = delete;
  EncodePipeline& operator=(const EncodePipeline&) = delete;

  // Rethrows, on the calling thread, the first exception a worker met.
  void submit(WorkItem item);
  // Waits for every item and consumes the rest.
  void finish();

 private:
  void work();
  // Consumes results in order; blocks while more than `max_in_flight` are pending.
  void drain(size_t max_in_flight);

  const Tokenizer& tok_;
  const uint64_t val_units_;
  const size_t max_in_flight_;
  std::function<void(EncodedItem&)> consume_;

  std::mutex mu_;
  std::condition_variable work_ready_, result_ready_;
  std::deque<std::pair<uint64_t, WorkItem>> todo_;
  std::map<uint64_t, EncodedItem> done_;
  uint64_t submitted_ = 0, consumed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

}  // namespace pt
