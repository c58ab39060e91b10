// A model brought in from another program's files (an llm.c model file, a Hugging Face folder)
// becomes a weights-only picotrain checkpoint at step 0: training from it starts Adam from zero
// moments and the schedule from step 0. Shared by every importer so they commit the same way.
#pragma once
#include <string>
#include <vector>

#include "core/config/run_config.h"
#include "core/model/param_table.h"

namespace pt::ckpt {

// Throws ConfigError when `out_dir` already holds checkpoints (committed, or a `latest`):
// an import never mixes with, or prunes, a run's own checkpoints.
void refuse_nonempty_import_target(const std::string& out_dir);

// Commits `weights` (table order, table.total_numel() floats) as step_00000000 in `out_dir`
// and points latest at it; `source` is recorded in the manifest's layout and `tokenizer` (a
// make_tokenizer name or path; "": none) as the model's tokenizer (checkpoint_tokenizer.h).
// Returns the step directory.
std::string write_imported_checkpoint(const std::string& out_dir, const ModelSection& model, const ParamTable& table,
                                      const std::vector<float>& weights, const std::string& source,
                                      const std::string& tokenizer = "");

}  // namespace pt::ckpt
