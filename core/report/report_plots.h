// The run report's plots, drawn by gnuplot (Debian's gnuplot-nox; scripts/setup.sh installs it):
// loss.png, train and validation loss against tokens, throughput.png, tokens/s against step, and
// with eval.task task.png, its acc and acc_norm against tokens, from the metrics.jsonl records. Without gnuplot (or when it fails) there are no plots and the
// note says why: plots never fail a run.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pt {

struct Plots {
  std::vector<std::string> files;  // the PNGs written, relative to out_dir
  std::string note;                // "" when every plot was drawn, else why not
};

// gnuplot: the program to run (found on PATH unless it is a path).
Plots write_plots(const std::string& out_dir, const std::vector<nlohmann::json>& metrics,
                  const std::string& gnuplot = "gnuplot");

}  // namespace pt
