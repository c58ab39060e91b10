#include "core/ckpt/checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/ckpt/durable_io.h"
#include "core/ckpt/manifest.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(int step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08d", step);
  return buf;
}

std::optional<int> parse_step_dir_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(digits);
}

DirScan scan_checkpoint_dir(const std::string& dir) {
  DirScan s;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return s;

  std::vector<int> complete;  // step dirs holding a manifest
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(ec)) continue;
    if (name.rfind(".tmp_step_", 0) == 0 || name.rfind(".trash_step_", 0) == 0) {
      s.leftovers.push_back(entry.path().string());
    } else if (auto step = parse_step_dir_name(name)) {
      if (fs::is_regular_file(entry.path() / kManifestFile, ec)) complete.push_back(*step);
    }
  }
  std::sort(complete.begin(), complete.end());
  std::sort(s.leftovers.begin(), s.leftovers.end());

  const fs::path latest = fs::path(dir) / "latest";
  if (fs::exists(latest, ec)) {
    s.latest_present = true;
    try {
      std::string text = read_small_file(latest.string());
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      s.latest = parse_step_dir_name(text);
      if (!s.latest) s.latest_problem = latest.string() + " holds \"" + text + "\", not a step directory name";
    } catch (const std::exception& e) {
      s.latest_problem = e.what();
    }
  }
  for (int step : complete) {
    if (s.latest && step > *s.latest) s.uncommitted.push_back(step);
    else if (s.latest || !s.latest_problem.empty()) s.committed.push_back(step);
    else s.uncommitted.push_back(step);  // no pointer at all: nothing was ever committed
  }
  return s;
}

void write_latest(const std::string& dir, int step) {
  write_file_atomic((fs::path(dir) / "latest").string(), step_dir_name(step) + "\n");
}

std::vector<int> steps_to_prune(const std::vector<int>& committed, int keep_latest, int keep_every, int keep_step) {
  std::vector<int> out;
  const size_t n = committed.size();
  const size_t keep_from = n > static_cast<size_t>(keep_latest) ? n - keep_latest : 0;
  for (size_t i = 0; i < keep_from; i++) {
    const int step = committed[i];
    const bool milestone = keep_every > 0 && step % keep_every == 0;
    if (!milestone && step != keep_step) out.push_back(step);
  }
  return out;
}

}  // namespace pt::ckpt
