// `picotrain prepare`: text in, llm.c token shards out.
//
// Inputs: text files, gzip files, JSON Lines (one document per line, field "text") and directories
// of them; the walk order and how each file is read are in prepare_inputs.h.
//
// Tokenizers (core/tokenizer): "bytes", one token per byte (vocabulary 256), each document
// followed by kDocumentSeparator ("\n\n", the plain-text paragraph break: it has no special ids);
// "gpt2", GPT-2's BPE (vocabulary 50257), each document preceded by <|endoftext|> (50256), as
// llm.c's fineweb.py writes FineWeb. The text "<|endoftext|>" inside a document is ordinary text.
// "llama3" (or any tokenizer.json): each document preceded by its marker, Llama 3's
// <|begin_of_text|> (128000), as llm.c's fineweb.py writes Llama 3 data; special tokens spelled
// out inside a document are matched as such (hf_tokenizer.h).
//
// Split. The documents, with the ids put around them, form one stream of units: a unit is a byte
// of text or one of those ids. Its first V units are the validation set, the rest the training
// set: V = ceil(val_fraction * U) of the U units, raised to kMinValTokens (one 1024-token sequence
// plus its shifted target) when smaller but never past half the data, and always less than U.
// A token belongs to val when the text it came from starts within the first V units. With the
// byte tokenizer units are tokens, so val is exactly V tokens; with GPT-2 it is the tokens of the
// first V bytes (about V/4 tokens of English), cut at a token boundary. Finding U needs a first
// pass over .gz and JSONL inputs (decompressing, parsing); text files are counted by their size.
// val_fraction = 0: no val shards and no first pass.
//
// Output. <out_dir>/<name>_val_000000.bin, ... and <out_dir>/<name>_train_000000.bin, ..., each
// at most shard_tokens tokens (numbered per split from 0): llm.c's version 1 (uint16 tokens), or
// version 7 (uint32) when the tokenizer has ids past 65,535. Older shards of the same name and split
// beyond the new ones (a previous, larger run) are deleted so that a glob never mixes two runs.
//
// Threads. Documents are cut into chunks of about chunk_bytes (long ones where the tokenizer says
// a cut cannot change the tokens), encoded on `threads` threads and written in input order: the
// shards are the same, byte for byte, for any thread count and chunk size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tokenizer/byte_tokenizer.h"

namespace pt {

inline constexpr const char* kDocumentSeparator = kByteDocumentSeparator;
inline constexpr uint64_t kMinValTokens = 1025;

struct PrepareOptions {
  std::string tokenizer = "bytes";           // bytes | gpt2 | llama3 | a tokenizer.json path (make_tokenizer)
  std::string tokenizer_dir;                 // gpt2's or llama3's files; "": default_tokenizer_dir(tokenizer)
  std::vector<std::string> inputs;           // files and directories
  std::string out_dir;
  std::string name = "corpus";
  double val_fraction = 0.005;
  uint64_t shard_tokens = 100'000'000;
  int threads = 0;                           // encoding threads; 0: one per core
  size_t chunk_bytes = size_t{1} << 20;      // text per unit of parallel work (the output does not depend on it)
};

struct PrepareResult {
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::vector<std::string> files;  // the shards written: val first, then train, in order
  uint64_t documents = 0;
  uint64_t text_bytes = 0;  // of the documents (decompressed, JSON-decoded)
  double seconds = 0;       // wall time of the whole run
};

// Throws ConfigError for bad options (unknown tokenizer, missing tokenizer files, missing input, no
// input text, ...) and RuntimeError for I/O failures and malformed input files (naming the file,
// and the line for JSONL). Prints progress on stderr when the work takes more than a second.
PrepareResult prepare_dataset(const PrepareOptions& opts);

}  // namespace pt
