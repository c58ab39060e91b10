#include "core/eval/mc_score.h"

#include <algorithm>

#include "core/common/error.h"

namespace pt {

McLayout layout_mc_rows(const std::vector<McTokens>& examples, int seq_len) {
  check(seq_len >= 2, "layout_mc_rows: seq_len " + std::to_string(seq_len) + " leaves no room for a context");
  const size_t fits = static_cast<size_t>(seq_len) + 1;  // tokens in a row: T inputs and the last target
  McLayout l;
  for (size_t e = 0; e < examples.size(); e++) {
    const McTokens& ex = examples[e];
    size_t longest = 0;
    for (const auto& ending : ex.endings) longest = std::max(longest, ending.size());
    const size_t cut = ex.context.size() + longest > fits ? ex.context.size() + longest - fits : 0;
    if (cut >= ex.context.size()) {  // the longest ending alone fills the row: no context would remain
      l.skipped++;
      continue;
    }
    if (cut > 0) l.truncated++;
    l.first_row.push_back(l.rows.size());
    l.endings.push_back(static_cast<int>(ex.endings.size()));
    l.labels.push_back(ex.label);
    l.example.push_back(static_cast<int64_t>(e));
    for (const auto& ending : ex.endings) {
      McRow row;
      row.tokens.assign(ex.context.begin() + static_cast<std::ptrdiff_t>(cut), ex.context.end());
      row.context = row.tokens.size();
      row.tokens.insert(row.tokens.end(), ending.begin(), ending.end());
      l.rows.push_back(std::move(row));
    }
  }
  return l;
}

void fill_mc_batch(const McLayout& layout, int64_t first, int B, int T, int32_t* inputs, int32_t* targets) {
  std::fill(inputs, inputs + static_cast<size_t>(B) * T, 0);
  std::fill(targets, targets + static_cast<size_t>(B) * T, -1);
  for (int r = 0; r < B; r++) {
    const int64_t i = first + r;
    if (i >= static_cast<int64_t>(layout.rows.size())) break;
    const McRow& row = layout.rows[static_cast<size_t>(i)];
    check(row.tokens.size() <= static_cast<size_t>(T) + 1, "fill_mc_batch: a row longer than seq_len + 1");
    int32_t* in = inputs + static_cast<size_t>(r) * T;
    int32_t* tg = targets + static_cast<size_t>(r) * T;
    for (size_t t = 0; t + 1 < row.tokens.size(); t++) {
      in[t] = row.tokens[t];
      if (t + 1 >= row.context) tg[t] = row.tokens[t + 1];
    }
  }
}

McScores score_mc(const McLayout& layout, const std::vector<double>& row_loss) {
  check(row_loss.size() == layout.rows.size(), "score_mc: " + std::to_string(row_loss.size()) + " losses for " +
                                                   std::to_string(layout.rows.size()) + " rows");
  McScores s;
  s.skipped = layout.skipped;
  s.truncated = layout.truncated;
  for (size_t x = 0; x < layout.first_row.size(); x++) {
    McExampleScore e;
    e.example = layout.example[x];
    e.label = layout.labels[x];
    for (int k = 0; k < layout.endings[x]; k++) {
      const size_t row = layout.first_row[x] + static_cast<size_t>(k);
      e.loss_sum.push_back(row_loss[row]);
      e.loss_mean.push_back(row_loss[row] / static_cast<double>(layout.rows[row].scored()));
    }
    // min_element returns the first of equal values: ties go to the lower index.
    e.pred = static_cast<int>(std::min_element(e.loss_sum.begin(), e.loss_sum.end()) - e.loss_sum.begin());
    e.pred_norm = static_cast<int>(std::min_element(e.loss_mean.begin(), e.loss_mean.end()) - e.loss_mean.begin());
    s.correct += e.pred == e.label;
    s.correct_norm += e.pred_norm == e.label;
    s.examples.push_back(std::move(e));
  }
  return s;
}

}  // namespace pt
