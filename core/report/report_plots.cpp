#include "core/report/report_plots.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace pt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// 'text' for the shell, and for gnuplot (a quote inside is doubled there, closed and reopened here).
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Two columns of numbers: x and the field `y` of every record that has both.
size_t write_columns(const fs::path& path, const std::vector<json>& metrics, const char* x, const char* y) {
  std::ofstream out(path);
  size_t rows = 0;
  for (const json& r : metrics)
    if (r.contains(x) && r.contains(y) && r[x].is_number() && r[y].is_number()) {
      out << r[x].get<double>() << ' ' << r[y].get<double>() << '\n';
      rows++;
    }
  return rows;
}

// The multiple-choice task's name in the records (eval.task: fields <name>_acc and
// <name>_acc_norm), "" when none has them.
std::string task_name(const std::vector<json>& metrics) {
  const std::string suffix = "_acc_norm";
  for (const json& r : metrics)
    for (const auto& [key, value] : r.items()) {
      if (key.size() <= suffix.size() || !key.ends_with(suffix)) continue;
      const std::string name = key.substr(0, key.size() - suffix.size());
      if (r.contains(name + "_acc")) return name;
    }
  return "";
}

}  // namespace

Plots write_plots(const std::string& out_dir, const std::vector<json>& metrics, const std::string& gnuplot) {
  Plots p;
  if (metrics.empty()) {
    p.note = "no plots: metrics.jsonl has no records";
    return p;
  }
  const fs::path dir = fs::absolute(out_dir);
  const fs::path work = dir / (".plots_tmp_" + std::to_string(::getpid()));
  std::error_code ec;
  // A plot from an earlier session must not pass for this one's.
  for (const char* f : {"loss.png", "throughput.png", "task.png"}) fs::remove(dir / f, ec);
  fs::create_directories(work, ec);
  const size_t train = write_columns(work / "train.dat", metrics, "tokens", "loss");
  const size_t val = write_columns(work / "val.dat", metrics, "tokens", "val_loss");
  write_columns(work / "throughput.dat", metrics, "step", "tokens_per_s");
  const std::string task = task_name(metrics);
  const size_t task_rows = task.empty() ? 0 : write_columns(work / "task.dat", metrics, "tokens", (task + "_acc").c_str());
  if (task_rows > 0) write_columns(work / "task_norm.dat", metrics, "tokens", (task + "_acc_norm").c_str());

  // pngcairo is in gnuplot-nox; the plain png terminal is the fallback of older builds.
  std::string script = "set terminal pngcairo size 960,540 noenhanced\n";
  script += "set grid\nset key top right\n";
  script += "set output " + gnuplot_quote((dir / "loss.png").string()) + "\n";
  script += "set title 'loss'\nset xlabel 'tokens'\nset ylabel 'cross-entropy'\n";
  script += "plot " + gnuplot_quote((work / "train.dat").string()) + " using 1:2 with lines title 'train'";
  if (val > 0) script += ", " + gnuplot_quote((work / "val.dat").string()) + " using 1:2 with linespoints title 'val'";
  script += "\nset output " + gnuplot_quote((dir / "throughput.png").string()) + "\n";
  script += "set title 'throughput'\nset xlabel 'step'\nset ylabel 'tokens/s'\n";
  script += "plot " + gnuplot_quote((work / "throughput.dat").string()) + " using 1:2 with linespoints title 'tokens/s'\n";
  if (task_rows > 0) {
    script += "set output " + gnuplot_quote((dir / "task.png").string()) + "\n";
    script += "set title " + gnuplot_quote(task + " (eval.task)") + "\nset xlabel 'tokens'\nset ylabel 'accuracy'\n";
    script += "plot " + gnuplot_quote((work / "task.dat").string()) + " using 1:2 with linespoints title " +
              gnuplot_quote(task + "_acc") + ", " + gnuplot_quote((work / "task_norm.dat").string()) +
              " using 1:2 with linespoints title " + gnuplot_quote(task + "_acc_norm") + "\n";
  }
  std::ofstream(work / "plots.gp") << script;

  std::string output;
  int status = -1;
  if (train > 0) {
    FILE* pipe = popen((shell_quote(gnuplot) + " " + shell_quote((work / "plots.gp").string()) + " 2>&1").c_str(), "r");
    if (pipe) {
      char buf[1024];
      while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
      status = pclose(pipe);
    }
  }
  fs::remove_all(work, ec);
  const int code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (train == 0) p.note = "no plots: no record of metrics.jsonl has a loss";
  else if (code == 127) p.note = "no plots: " + gnuplot + " was not found (install gnuplot-nox: scripts/setup.sh)";
  else if (code != 0) p.note = "no plots: " + gnuplot + " failed: " + output.substr(0, output.find('\n'));
  if (!p.note.empty()) return p;
  for (const char* f : {"loss.png", "throughput.png", "task.png"})
    if (fs::exists(dir / f)) p.files.push_back(f);
  if (p.files.size() < (task_rows > 0 ? 3u : 2u)) p.note = "some plots are missing: " + gnuplot + " wrote no PNG";
  return p;
}

}  // namespace pt
