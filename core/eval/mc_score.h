// Scoring multiple-choice examples with a language model, as llm.c scores HellaSwag: each
// ending is one row "context + ending" of the model's batch, whose targets are the ending's
// tokens only (every other position has no target, -1); the loss of the ending is the sum of
// its tokens' cross-entropies given everything before them. The prediction is the ending with
// the lowest summed loss ("acc") and, separately, with the lowest mean loss per token
// ("acc_norm", which does not favour short endings). Ties go to the lower index.
//
// Lengths. A row holds seq_len inputs, so context + ending may have seq_len + 1 tokens. A longer
// example loses tokens from the left of its context (the same cut for all its endings, so they
// are scored after the same context): "truncated". An example whose longest ending alone has more
// than seq_len tokens (not a token of the context would remain) is left out: "skipped". Both are
// counted and reported; the accuracies are over the examples scored.
#pragma once
#include <cstdint>
#include <vector>

#include "core/eval/mc_task.h"

namespace pt {

// One row of the batch: an ending after its (possibly truncated) context.
struct McRow {
  std::vector<int32_t> tokens;  // context then ending
  size_t context = 0;           // tokens[context..] are the ending: the scored tokens
  size_t scored() const { return tokens.size() - context; }
};

// The rows of a task, example after example, each example's endings in order.
struct McLayout {
  std::vector<McRow> rows;
  std::vector<size_t> first_row;  // per scored example: the index of its first row
  std::vector<int> endings;       // per scored example: its number of endings (rows)
  std::vector<int> labels;        // per scored example
  std::vector<int64_t> example;   // per scored example: its index in the task
  int64_t skipped = 0;
  int64_t truncated = 0;
};

// Lays out `examples` for rows of `seq_len` inputs (see the file comment).
McLayout layout_mc_rows(const std::vector<McTokens>& examples, int seq_len);

// Rows [first, first + B) of `layout` as one micro-batch of B x T inputs and targets (row r's
// input t is token t, its target token t + 1 where that is an ending token, else -1); rows past
// the end, and positions past a row's tokens, are input 0 without a target.
void fill_mc_batch(const McLayout& layout, int64_t first, int B, int T, int32_t* inputs, int32_t* targets);

// One scored example: each ending's summed and mean loss, and the two predictions.
struct McExampleScore {
  int64_t example = 0;
  int label = 0;
  std::vector<double> loss_sum, loss_mean;
  int pred = 0, pred_norm = 0;
};

struct McScores {
  std::vector<McExampleScore> examples;
  int64_t correct = 0, correct_norm = 0;
  int64_t skipped = 0, truncated = 0;
  int64_t count() const { return static_cast<int64_t>(examples.size()); }
  double acc() const { return count() ? static_cast<double>(correct) / count() : 0.0; }
  double acc_norm() const { return count() ? static_cast<double>(correct_norm) / count() : 0.0; }
};

// The scores from each row's summed loss (`row_loss`, indexed like layout.rows).
McScores score_mc(const McLayout& layout, const std::vector<double>& row_loss);

}  // namespace pt
