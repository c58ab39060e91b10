#include "core/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/common/error.h"
#include "core/data/prepare_chunker.h"
#include "core/data/prepare_inputs.h"
#include "core/data/prepare_pipeline.h"
#include "core/data/prepare_progress.h"
#include "core/data/prepare_shard_writer.h"
#include "core/data/shard.h"
#include "core/common/console.h"

namespace pt {

namespace fs = std::filesystem;

namespace {

void validate(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("prepare: no input given (pass text files or directories with --input)");
  if (o.out_dir.empty()) throw ConfigError("prepare: no output directory given (--out)");
  if (o.name.empty() || o.name.find('/') != std::string::npos)
    throw ConfigError("prepare: name='" + o.name + "' must be a non-empty file name prefix without '/'");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw ConfigError("prepare: val_fraction=" + std::to_string(o.val_fraction) + " must be in [0, 1)");
  if (o.shard_tokens == 0 || o.shard_tokens > kMaxShardTokens)
    throw ConfigError("prepare: shard_tokens=" + std::to_string(o.shard_tokens) + " must be in [1, " +
                      std::to_string(kMaxShardTokens) + "] (the shard header stores an int32 count)");
  if (o.threads < 0) throw ConfigError("prepare: threads=" + std::to_string(o.threads) + " must be >= 0 (0: one per core)");
}

// The rule documented in prepare.h, in units.
uint64_t val_units_for(uint64_t total, double fraction) {
  if (fraction <= 0.0 || total < 2) return 0;
  auto val = static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(total)));
  if (val < kMinValTokens) val = std::max(val, std::min(kMinValTokens, total / 2));
  return std::min(val, total - 1);
}

struct IgnoreDocuments final : DocumentSink {
  void begin_document() override {}
  void text(std::string_view) override {}
  void end_document() override {}
};

// What each file holds, where the val split needs it: from the size for text files, else by
// reading the file once (decompressing, parsing JSON). nullopt where it is not needed.
std::vector<std::optional<DocumentCount>> count_documents(const std::vector<InputFile>& files, bool need_all) {
  std::vector<std::optional<DocumentCount>> counts(files.size());
  uint64_t to_read = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    DocumentCount c;
    if (count_from_size(files[i], c)) counts[i] = c;
    else to_read += files[i].disk_bytes;
  }
  if (!need_all || to_read == 0) return counts;
  if (to_read > (uint64_t{64} << 20))
    print_linef(Stream::err, "prepare: reading %.1f MB of .gz/JSONL input once to size the val split",
                static_cast<double>(to_read) / 1e6);
  IgnoreDocuments ignore;
  for (size_t i = 0; i < files.size(); ++i)
    if (!counts[i]) counts[i] = read_documents(files[i], ignore);
  return counts;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& opts) {
  validate(opts);
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(opts.tokenizer, opts.tokenizer_dir);
  // llm.c's version-1 shards hold uint16 ids; a vocabulary with ids past 65,535 (Llama 3's 128,256)
  // gets version 7, uint32, as llm.c's data scripts write for Llama 3.
  const bool wide = tok->vocab_size() > 65536;
  const fs::path out_dir = opts.out_dir;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw RuntimeError("prepare: cannot create output directory " + opts.out_dir + ": " + ec.message());

  const std::vector<InputFile> files = list_inputs(opts.inputs, out_dir);
  const auto counts = count_documents(files, opts.val_fraction > 0);
  const uint64_t ids_per_document = tok->document_prefix().size() + tok->document_suffix().size();
  uint64_t units = 0, known_text = 0, disk_total = 0;
  bool all_counted = true;
  for (size_t i = 0; i < files.size(); ++i) {
    disk_total += files[i].disk_bytes;
    if (!counts[i]) {
      all_counted = false;
      continue;
    }
    known_text += counts[i]->text_bytes;
    units += counts[i]->text_bytes + counts[i]->documents * ids_per_document;
  }
  auto no_text = [&] {
    return ConfigError("prepare: the inputs hold no text (" + std::to_string(files.size()) +
                       " non-hidden files found); nothing to tokenize");
  };
  if (all_counted && known_text == 0) throw no_text();
  const uint64_t val_units = all_counted ? val_units_for(units, opts.val_fraction) : 0;

  PrepareResult result;
  ShardWriter val(out_dir, opts.name, "val", opts.shard_tokens, wide, result.files);
  ShardWriter train(out_dir, opts.name, "train", opts.shard_tokens, wide, result.files);
  PrepareProgress progress(disk_total);
  uint64_t units_done = 0, tokens_done = 0;
  auto consume = [&](EncodedItem& r) {
    const std::span<const int32_t> t = r.tokens;
    val.add(t.first(r.val_tokens));
    if (r.val_tokens < t.size()) {
      val.finish();  // complete: its shards are listed before train's
      train.add(t.subspan(r.val_tokens));
    }
    units_done += r.units;
    result.text_bytes += r.text_bytes;
    tokens_done += t.size();
    progress.update(r.disk_done, result.text_bytes, tokens_done);
  };

  const int threads = opts.threads > 0 ? opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  EncodePipeline pipeline(*tok, threads, val_units, consume);
  uint64_t disk_done = 0;
  Chunker chunker(*tok, opts.chunk_bytes, disk_done, [&](WorkItem&& item) { pipeline.submit(std::move(item)); });
  uint64_t disk_before = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const DocumentCount c = read_documents(files[i], chunker, [&](uint64_t d) { disk_done = disk_before + d; });
    // The split point was computed from the counts; a file that changed since would move it.
    if (counts[i] && *counts[i] != c)
      throw RuntimeError("prepare: " + files[i].path.string() + " changed while being read (" +
                         std::to_string(counts[i]->text_bytes) + " bytes expected, " + std::to_string(c.text_bytes) +
                         " read)");
    result.documents += c.documents;
    disk_before += files[i].disk_bytes;
    disk_done = disk_before;
  }
  chunker.finish();
  pipeline.finish();
  if (result.text_bytes == 0) throw no_text();
  check(!all_counted || units_done == units, "prepare: internal error: " + std::to_string(units_done) +
                                                 " units encoded, " + std::to_string(units) + " counted");

  val.finish();
  train.finish();
  progress.finish(result.text_bytes, tokens_done);
  result.val_tokens = val.tokens();
  result.train_tokens = train.tokens();
  result.seconds = progress.seconds();
  if (result.train_tokens == 0)
    print_line(Stream::err, "prepare: warning: every token fell into val (the input is too small for the split); "
                            "lower --val-fraction or add text");
  return result;
}

}  // namespace pt
