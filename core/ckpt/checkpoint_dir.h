// The checkpoint directory (checkpoint.dir): one committed checkpoint per step, a `latest`
// pointer, and leftovers of interrupted saves.
//
//   step_00000100/        a checkpoint: manifest.json + tensor data files
//   step_00000200/
//   latest                "step_00000200\n": the newest COMMITTED checkpoint
//   .tmp_step_00000300_4242/   a save in progress (or killed): never loaded, removed by the next save
//   .trash_step_00000100_4242/ a pruned checkpoint being deleted: never loaded, removed by the next save
//
// A checkpoint is committed when its directory holds a manifest (it was renamed into place
// whole) AND `latest` has reached its step. A step directory newer than `latest` comes from a
// save killed between the rename and the pointer update (or from a run abandoned by resuming an
// older checkpoint): it is ignored, and replaced if that step is saved again.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace pt::ckpt {

std::string step_dir_name(int step);  // "step_00000100"
std::optional<int> parse_step_dir_name(const std::string& name);

struct DirScan {
  bool latest_present = false;    // a `latest` file exists
  std::string latest_problem;     // why it could not be read ("" when fine or absent)
  std::optional<int> latest;      // the step `latest` names
  std::vector<int> committed;     // ascending
  std::vector<int> uncommitted;   // step dirs with a manifest but newer than `latest`
  std::vector<std::string> leftovers;  // .tmp_* and .trash_* directories (full paths)
};

// Reads the directory (which may not exist: then everything is empty). When `latest` exists
// but is unreadable, every step directory with a manifest counts as committed (and
// latest_problem says why): a damaged pointer must not hide good checkpoints.
DirScan scan_checkpoint_dir(const std::string& dir);

// Atomically points `latest` at step (temp file + rename + directory fsync).
void write_latest(const std::string& dir, int step);

// Retention: of the committed steps (ascending), those to delete. Kept: the newest
// `keep_latest`, every milestone (a multiple of keep_every, when keep_every > 0), and `keep_step`
// (the newest checkpoint whose steps were all finite; -1: none).
std::vector<int> steps_to_prune(const std::vector<int>& committed, int keep_latest, int keep_every,
                                int keep_step = -1);

}  // namespace pt::ckpt
