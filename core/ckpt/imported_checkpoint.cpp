#include "core/ckpt/imported_checkpoint.h"

#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_tokenizer.h"
#include "core/ckpt/checkpoint_writer.h"
#include "core/ckpt/manifest.h"
#include "core/common/error.h"

namespace pt::ckpt {

void refuse_nonempty_import_target(const std::string& out_dir) {
  const DirScan scan = scan_checkpoint_dir(out_dir);
  if (!scan.committed.empty() || scan.latest_present)
    throw ConfigError("convert --to " + out_dir + ": that directory already holds checkpoints; choose a new one");
}

std::string write_imported_checkpoint(const std::string& out_dir, const ModelSection& model, const ParamTable& table,
                                      const std::vector<float>& weights, const std::string& source,
                                      const std::string& tokenizer) {
  check(weights.size() == table.total_numel(), "write_imported_checkpoint: weights do not match the table");
  // The manifest's config is a default run config around the imported model: it documents
  // the shape; a run that resumes from this checkpoint brings its own config.
  RunConfig cfg;
  cfg.model = model;
  Manifest meta;
  meta.step = 0;
  meta.model = model_shape_json(model);
  meta.layout = {{"world_size", 1}, {"imported_from", source}};
  cfg.data.tokenizer = tokenizer;
  meta.config = config_to_json(cfg);
  record_tokenizer(meta, tokenizer);
  return write_checkpoint(out_dir, meta, [&](CheckpointWriter& w) {
    for (const auto& p : table.specs())
      w.add_chunk("master/" + p.name, p.global_shape, "master_r00000.bin", 0, weights.data() + p.offset, p.numel);
  });
}

}  // namespace pt::ckpt
