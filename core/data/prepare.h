// `picotrain prepare`: text files in, llm.c token shards out.
//
// Documents. Every input file is one document. Directories are walked recursively, files in
// sorted (bytewise) path order; hidden files and directories (name starting with '.') are skipped,
// and so is the output directory, so a re-run never reads back its own shards.
//
// Tokenizers. "bytes": token = byte value, vocabulary 256 (train with model.vocab_size=256). It has
// no special tokens, so each document is followed by kDocumentSeparator ("\n\n"), the plain-text
// paragraph break, rather than an end-of-text id. A GPT-2 BPE tokenizer comes later.
//
// Split. The stream of all documents is cut once: its first part is the validation set, the rest
// the training set. The val part is ceil(val_fraction * N) tokens, raised to kMinValTokens (one
// 1024-token sequence plus its shifted target) when smaller, but never raised past half the data;
// it is always smaller than N, so train keeps at least one token. val_fraction = 0: no val shards.
//
// Output. <out_dir>/<name>_val_000000.bin, ... and <out_dir>/<name>_train_000000.bin, ..., each
// at most shard_tokens tokens (numbered per split from 0). Older shards of the same name and split
// beyond the new ones (a previous, larger run) are deleted so that a glob never mixes two runs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pt {

inline constexpr const char* kDocumentSeparator = "\n\n";
inline constexpr uint64_t kMinValTokens = 1025;

struct PrepareOptions {
  std::string tokenizer = "bytes";
  std::vector<std::string> inputs;  // text files and directories
  std::string out_dir;
  std::string name = "corpus";
  double val_fraction = 0.005;
  uint64_t shard_tokens = 100'000'000;
};

struct PrepareResult {
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::vector<std::string> files;  // the shards written: val first, then train, in order
};

// Throws ConfigError for bad options (unknown tokenizer, missing input, no input text, ...) and
// RuntimeError for I/O failures. Prints progress on stderr when the work takes more than a second.
PrepareResult prepare_dataset(const PrepareOptions& opts);

}  // namespace pt
