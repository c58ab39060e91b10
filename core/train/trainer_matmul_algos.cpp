// precision.matmul_algos: which cuBLASLt algorithm each product runs (core/ops/matmul_algos.h
// says why a timed choice is made once, agreed by every rank and written down).
#include <filesystem>

#include "core/ckpt/durable_io.h"
#include "core/common/console.h"
#include "core/dist/coordination.h"
#include "core/train/trainer.h"

namespace pt {

namespace {

std::string run_algos_path(const RunConfig& cfg) {
  return (std::filesystem::path(cfg.run.out_dir) / "matmul_algos.json").string();
}

}  // namespace

void Trainer::start_matmul_algos() {
  const std::string& mode = cfg_.precision.matmul_algos;
  matmul_commit_due_ = false;
  if (mode == "heuristic") return;
  const bool lead = world_.rank == 0;
  const std::string library = ops_.matmul_library();
  if (library.empty()) {
    if (lead)
      print_line(Stream::out, "matmul    | precision.matmul_algos=" + mode + ": the " + device_name(ops_.device()) +
                                  " backend has no algorithms to choose from");
    return;
  }
  const bool timed = mode == "timed";
  // A timed run reads its own file only when it resumes: a fresh run times again.
  if (!timed || !ckpt_->resumed_from().empty()) {
    const std::string path = timed ? run_algos_path(cfg_) : mode;
    // Rank 0 reads (the run directory may be its alone); "-" + why when it cannot.
    std::string text;
    if (lead) {
      try {
        text = ckpt::read_small_file(path);
        text.insert(text.begin(), '+');
      } catch (const std::exception& e) {
        text = e.what();
        text.insert(text.begin(), '-');
      }
    }
    text = broadcast_string(*groups_.world, text, 0);
    if (text[0] == '-') {
      if (!timed) throw ConfigError("precision.matmul_algos: cannot read " + path + ": " + text.substr(1));
      if (lead) print_warning("precision.matmul_algos=timed: the resumed run's " + path + " is missing (" +
                              text.substr(1) + "); timing again, so results may differ in the last bits from the run's "
                              "earlier sessions");
    } else {
      const MatmulAlgos given = matmul_algos_from_json(text.substr(1), path);
      if (given.library == library) {
        ops_.use_matmul_algos(given);
        if (lead)
          print_linef(Stream::out, "matmul    | the algorithms of %zu products from %s (timed on %s)",
                      given.chosen.size(), path.c_str(), given.library.c_str());
        return;
      }
      if (lead)
        print_warning(path + " holds algorithms timed on " + given.library + ", not on this " + library + ": " +
                      (timed ? "timing again" : "cuBLASLt's heuristic chooses") +
                      ", so results may differ in the last bits from the run that timed them");
      if (!timed) return;
    }
  }
  ops_.time_matmul_algos();
  matmul_commit_due_ = true;
}

void Trainer::commit_matmul_algos() {
  if (!matmul_commit_due_) return;
  matmul_commit_due_ = false;
  const MatmulAlgos mine = ops_.timed_matmul_algos();
  std::vector<MatmulAlgos> ranks;
  for (const std::string& text : all_gather_strings(*groups_.world, matmul_algos_json(mine)))
    ranks.push_back(matmul_algos_from_json(text, "a rank's timed matmul algorithms"));
  const MatmulAlgos agreed = agree_matmul_algos(ranks);
  // A rank on another GPU or library (rare) keeps its own choices: the agreed ones are not its.
  ops_.use_matmul_algos(mine.library == agreed.library ? agreed : mine);
  if (world_.rank != 0) return;
  const std::string path = run_algos_path(cfg_);
  ckpt::write_file_atomic(path, matmul_algos_json(agreed));
  const MatmulAlgos& own = ranks[0];
  const double saved = own.heuristic_us > 0 ? 100.0 * (1.0 - own.chosen_us / own.heuristic_us) : 0.0;
  print_linef(Stream::out,
              "matmul    | timed %zu products in the first step, each on cuBLASLt's top candidates; rank 0's %zu: %d "
              "chosen otherwise than the heuristic, %.1f%% less time (%.0f -> %.0f us, one call each); the choices "
              "from step %d on, in %s",
              agreed.chosen.size(), own.chosen.size(), own.differs, saved, own.heuristic_us, own.chosen_us, step_ + 1,
              path.c_str());
}

}  // namespace pt
