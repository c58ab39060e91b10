// The tokenizer travels with the model: a checkpoint's manifest records the tokenizer its model
// was trained with (data.tokenizer), so that `picotrain sample`, eval and `convert --format hf`
// use it again. manifest.json's "tokenizer" object is one of:
//
//   {"name": "llama3"}   bytes, gpt2, llama3: the name alone. Their files are picotrain's own
//                        (data/NAME, scripts/get_data.sh --tokenizer) and found by name on any
//                        machine; copying Llama 3's 9 MB tokenizer.json into every step directory
//                        would cost more than a small model's weights.
//   {"name": PATH, "file": "tokenizer.json"}
//                        a tokenizer.json given by path (or a folder holding one): the file is
//                        copied into the step directory, with the tokenizer_config.json beside it
//                        when there is one. A path is only as good as the machine it was written
//                        on: the copy keeps the checkpoint self-contained when the file moves,
//                        changes or stays behind, and an export ships exactly the file trained with.
//
// A checkpoint without the object (written before it existed, or by a run without data.tokenizer)
// records none: its tokenizer is the one its vocabulary implies (tokenizer_for_vocab).
#pragma once
#include <memory>
#include <string>

#include "core/ckpt/manifest.h"
#include "core/tokenizer/tokenizer.h"

namespace pt::ckpt {

inline constexpr const char* kTokenizerFile = "tokenizer.json";
inline constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";

// Records `name` (make_tokenizer's names or a path; "": nothing) in `meta`, with the copies a path
// needs. Throws ConfigError when a path holds no tokenizer.json.
void record_tokenizer(Manifest& meta, const std::string& name);

// The tokenizer `meta` records, loaded: a name from `files_dir` ("": default_tokenizer_dir), a
// copied file from `step_dir`. Null when none is recorded. Throws ConfigError when it cannot be
// loaded, CorruptCheckpoint when the record is malformed.
std::unique_ptr<Tokenizer> recorded_tokenizer(const Manifest& meta, const std::string& step_dir,
                                              const std::string& files_dir);

}  // namespace pt::ckpt
