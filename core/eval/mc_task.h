// Multiple-choice tasks in HellaSwag's JSONL format: one example a line, an object with
//   "ctx": the context (text), "endings": the candidate continuations (texts, at least two),
//   "label": the index of the right ending.
// Other fields (HellaSwag's "ind", "activity_label", "split", ...) are ignored. Tokenized as llm.c's
// dev/data/hellaswag.py does: the context's tokens, then each ending's with a leading space
// (" " + ending), so the ending's first word is the token it would be in running text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace pt {

struct McExample {
  std::string context;
  std::vector<std::string> endings;
  int label = 0;
  int line = 0;  // 1-based line of the file, for messages
};

// Token ids of one example: what the scorer reads (core/eval/mc_score.h). Tests and the PyTorch
// reference build these directly.
struct McTokens {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> endings;
  int label = 0;
};

// The first `max_examples` examples of `path` (0: all; blank lines are skipped). Throws
// ConfigError naming the file and the line for a line that is not such an object (bad JSON, a
// missing or mistyped field, fewer than two endings, an empty context or ending, a label out of
// range), and for a file that cannot be read or holds no example.
std::vector<McExample> read_mc_task(const std::string& path, int64_t max_examples = 0);

// The examples' token ids (see the file comment).
std::vector<McTokens> tokenize_mc_task(const std::vector<McExample>& examples, const Tokenizer& tok);

// The task's name for the log's fields (<name>_acc): the file's name up to its first '_' or '.'
// ("hellaswag_val.jsonl" -> "hellaswag"), lower-cased, other characters than [a-z0-9] as '_'.
std::string mc_task_name(const std::string& path);

}  // namespace pt
