#include "core/report/run_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/common/build_info.h"
#include "core/common/error.h"
#include "core/common/format.h"
#include "core/report/report_plots.h"

namespace pt {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_metrics(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step")) out.push_back(std::move(j));
  }
  return out;
}

namespace {

// The records throughput is averaged over: every logged step but step 1, which pays for
// warm-up (allocation, first-touch), unless it is the only one.
std::vector<const json*> throughput_records(const std::vector<json>& metrics) {
  std::vector<const json*> out;
  for (const json& r : metrics)
    if (r.value("step", 0) > 1) out.push_back(&r);
  if (out.empty())
    for (const json& r : metrics) out.push_back(&r);
  return out;
}

double mean_of(const std::vector<const json*>& records, const char* field) {
  double sum = 0;
  int n = 0;
  for (const json* r : records)
    if (r->contains(field) && (*r)[field].is_number()) sum += (*r)[field].get<double>(), n++;
  return n ? sum / n : 0.0;
}

json loss_section(const std::vector<json>& metrics) {
  json j = {{"final_train", nullptr}, {"final_train_step", nullptr}, {"final_val", nullptr}, {"final_val_step", nullptr}};
  for (const json& r : metrics) {
    if (r.contains("loss") && r["loss"].is_number()) j["final_train"] = r["loss"], j["final_train_step"] = r["step"];
    if (r.contains("val_loss")) j["final_val"] = r["val_loss"], j["final_val_step"] = r["step"];
  }
  return j;
}

}  // namespace

json build_report(const RunSummary& s, const std::vector<json>& metrics, const SessionTotals& sessions) {
  const RunConfig& c = s.cfg;
  const auto& par = c.parallel;
  json r;
  const uint64_t tokens = metrics.empty() ? 0 : metrics.back().value("tokens", uint64_t{0});
  r["run"] = {{"name", c.run.name},
              {"out_dir", c.run.out_dir},
              {"status", s.finished ? "finished" : "stopped"},
              {"stop_reason", s.stop_reason},
              {"step", s.step},
              {"total_steps", c.schedule.total_steps},
              {"tokens", tokens},
              {"params", s.params}};
  // The code the run was trained with (cmake/build_info.cmake): a result names what produced it.
  const BuildInfo& build = build_info();
  r["build"] = {{"commit", build.commit}, {"tree", build.tree}, {"cuda", build.cuda}, {"mpi", build.mpi}};
  r["hardware"] = {{"device", s.device},
                   {"gpus", s.gpu ? s.ranks : 0},
                   {"gpu_model", s.gpu ? s.device : "none (CPU backend)"},
                   {"ranks", s.ranks},
                   {"nodes", s.nodes},
                   {"interconnect", {{"within_node", s.interconnect_node}, {"between_nodes", s.interconnect_network}}}};
  r["layout"] = {{"dp", par.dp},
                 {"tp", par.tp},
                 {"pp", par.pp},
                 {"cp", par.cp},
                 {"order", par.order},
                 {"zero_stage", par.zero_stage},
                 {"dp_replicate", par.dp_replicate},
                 {"sequence_parallel", par.sequence_parallel},
                 {"pp_schedule", par.pp_schedule},
                 {"pp_virtual_stages", par.pp_virtual_stages},
                 {"cp_impl", par.cp_impl},
                 {"recompute", c.recompute.mode},
                 {"memory_per_rank", s.memory},
                 {"memory_measured", s.memory_measured}};
  r["batch"] = {{"tokens_per_step", c.batch.global_batch_tokens},
                {"micro_batch_size", c.batch.micro_batch_size},
                {"seq_len", c.batch.seq_len},
                {"grad_accum_steps", c.batch.grad_accum_steps},
                {"dp", par.dp}};
  r["precision"] = {{"compute_dtype", s.compute_dtype}, {"master_weights", c.precision.master_weights},
                    {"fp8", c.precision.fp8}, {"matmul_algos", c.precision.matmul_algos}};
  if (c.precision.fp8 != "off")
    r["precision"].update({{"fp8_layers", c.precision.fp8_layers}, {"fp8_grad_format", c.precision.fp8_grad_format}});
  if (c.precision.fp8 == "delayed") r["precision"]["fp8_amax_history"] = c.precision.fp8_amax_history;
  r["checkpoint"] = {{"every_steps", c.checkpoint.every_steps},
                     {"final", c.checkpoint.final},
                     {"cadence", c.checkpoint.cadence()},
                     {"final_checkpoint", s.final_checkpoint.empty() ? json() : json(s.final_checkpoint)},
                     {"keep_latest", c.checkpoint.keep_latest},
                     {"keep_every", c.checkpoint.keep_every},
                     {"dir", c.checkpoint.dir},
                     {"writes", sessions.time.checkpoints},
                     {"seconds", sessions.time.checkpoint}};
  const std::vector<const json*> timed = throughput_records(metrics);
  r["throughput"] = {
      {"tokens_per_s", mean_of(timed, "tokens_per_s")},
      {"tflops_per_gpu", mean_of(timed, "tflops_per_gpu")},
      {"mfu", mean_of(timed, "mfu")},
      {"steps_averaged", timed.size()},
      // precision.fp8: MFU against the device's FP8 peak too (null without FP8 or a known peak).
      {"mfu_fp8", mean_of(timed, "mfu_fp8") > 0 ? json(mean_of(timed, "mfu_fp8")) : json()},
      {"averaged_over", "the metrics.jsonl records, step 1 (warm-up) left out when there are others"},
      {"flops_per_token", s.flops_per_token},
      {"flops_formula", s.flops_formula},
      {"peak_tflops", s.peak_tflops},
      {"peak_source", s.peak_source},
      {"mfu_formula", "MFU = tokens/s x FLOPs per token / (ranks x peak) = tflops_per_gpu / peak_tflops; FLOPs per "
                      "token by logging.flops_formula (" + s.flops_formula + "), recompute not counted"}};
  json time = to_json(sessions.time);
  time["comm_by_kind"] = to_json(sessions.comm);
  time["sessions_counted"] = sessions.sessions - sessions.crashed;
  time["averaged_over_ranks"] = s.ranks;
  r["time"] = time;
  json stalls = json::array();
  for (const Stall& st : sessions.stalls) stalls.push_back({{"step", st.step}, {"ms", st.ms}});
  r["reliability"] = {{"sessions", sessions.sessions},
                      {"restarts", sessions.restarts},
                      {"crashed_sessions", sessions.crashed},
                      {"stalls", stalls},
                      {"stall_rule", "a step slower than 3 x the median step of its session"},
                      {"median_step_ms", s.median_step_ms},
                      {"skipped_steps", s.skipped_steps},
                      {"rollbacks", s.rollbacks},
                      {"replay_checks", s.replay_checks},
                      {"replay_mismatches", s.replay_mismatches},
                      {"replay_seconds", s.replay_s},
                      {"guard_events", s.guard_events}};
  r["loss"] = loss_section(metrics);
  r["sample"] = {{"prompt", s.sample_prompt}, {"text", s.sample_text}, {"note", s.sample_note}};
  return r;
}

namespace {

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
double num(const json& v) { return v.is_number() ? v.get<double>() : 0.0; }

// Where the run's trained model is and what to do with it: sample it, export it, train on from
// it. A finished run's final checkpoint is its product (checkpoint.final); a stopped one's is
// the stop's.
std::string trained_model_markdown(const json& run, const json& ck) {
  std::string md = "## Trained model\n\n";
  const json& path = ck["final_checkpoint"];
  if (!path.is_string()) {
    return md + format("The last step (%d) was not saved: checkpoint.final=false (a run that only measures). "
                       "Leave it at true for a finished run to keep its model.\n\n",
                       run["step"].get<int>());
  }
  const std::string p = path.get<std::string>();
  md += format("The checkpoint of step %d: `%s` (the whole training state).\n\n", run["step"].get<int>(), p.c_str());
  md += "- sample from it: `picotrain sample --checkpoint " + p + "`\n";
  md += "- export it as a Hugging Face folder: `picotrain convert --from " + p + " --to " + text(run["out_dir"]) +
        "/hf --format hf` (or an llm.c model file: `--to model.bin`)\n";
  md += text(run["status"]) == "finished"
            ? "- train on from it: `picotrain train --config ... --set checkpoint.resume=" + p +
                  " --set schedule.total_steps=N` (a larger N)\n\n"
            : "- continue the run: `picotrain train --config ... --set checkpoint.resume=auto`\n\n";
  return md;
}

}  // namespace

std::string report_markdown(const json& r) {
  const json &run = r["run"], &hw = r["hardware"], &lay = r["layout"], &b = r["batch"], &t = r["throughput"],
             &tm = r["time"], &rel = r["reliability"], &loss = r["loss"], &ck = r["checkpoint"];
  std::string md = "# Run report: " + text(run["name"]) + "\n\n";
  md += text(run["status"]) == "finished"
            ? format("Finished: %d of %d steps", run["step"].get<int>(), run["total_steps"].get<int>())
            : "Stopped: " + text(run["stop_reason"]);
  md += format(", %.0f tokens trained, %.2fM parameters. Run directory `%s`.\n\n", num(run["tokens"]),
            num(run["params"]) / 1e6, text(run["out_dir"]).c_str());

  md += "## Hardware\n\n| | |\n|---|---|\n";
  md += "| GPUs | " + (hw["gpus"].get<int>() > 0 ? format("%d x ", hw["gpus"].get<int>()) + text(hw["gpu_model"]) : text(hw["gpu_model"])) + " |\n";
  md += "| device | " + text(hw["device"]) + " |\n";
  if (r.contains("build"))
    md += "| built from | commit " + text(r["build"]["commit"]) + " (" + text(r["build"]["tree"]) + " tree) |\n";
  md += format("| ranks | %d on %d node(s) |\n", hw["ranks"].get<int>(), hw["nodes"].get<int>());
  md += "| interconnect within a node | " + text(hw["interconnect"]["within_node"]) + " |\n";
  md += "| interconnect between nodes | " + text(hw["interconnect"]["between_nodes"]) + " |\n\n";

  md += "## Layout, batch, precision\n\n| | |\n|---|---|\n";
  md += format("| layout | dp %d x tp %d x pp %d x cp %d (order %s) |\n", lay["dp"].get<int>(), lay["tp"].get<int>(),
            lay["pp"].get<int>(), lay["cp"].get<int>(), text(lay["order"]).c_str());
  md += format("| ZeRO | stage %d, HSDP replicas %d |\n", lay["zero_stage"].get<int>(), lay["dp_replicate"].get<int>());
  md += "| pipeline | " + text(lay["pp_schedule"]) + format(", %d virtual stage(s) |\n", lay["pp_virtual_stages"].get<int>());
  md += "| tensor / context parallel | sequence_parallel " + text(lay["sequence_parallel"]) + ", cp_impl " + text(lay["cp_impl"]) + " |\n";
  md += "| recompute | " + text(lay["recompute"]) + " |\n";
  for (const auto& m : lay["memory_per_rank"]) md += "| memory per rank | " + text(m) + " |\n";
  if (const std::string measured = lay.value("memory_measured", std::string()); !measured.empty())
    md += "| memory measured (rank 0) | " + measured + " |\n";
  md += format("| effective batch | %.0f tokens per step = %d sequences x %d tokens x dp %d x %d accumulation steps |\n",
            num(b["tokens_per_step"]), b["micro_batch_size"].get<int>(), b["seq_len"].get<int>(), b["dp"].get<int>(),
            b["grad_accum_steps"].get<int>());
  md += format("| sequence length | %d |\n", b["seq_len"].get<int>());
  md += "| precision | compute " + text(r["precision"]["compute_dtype"]) + ", master weights " +
        text(r["precision"]["master_weights"]);
  if (text(r["precision"]["fp8"]) != "off")
    md += "; FP8 " + text(r["precision"]["fp8"]) + " products (layers " + text(r["precision"]["fp8_layers"]) +
          ", gradients " + text(r["precision"]["fp8_grad_format"]) + ")";
  if (const std::string algos = r["precision"].value("matmul_algos", std::string("heuristic")); algos != "heuristic")
    md += "; matmul algorithms " + (algos == "timed" ? std::string("timed in the first step") : "from " + algos);
  md += " |\n";
  md += "| checkpoints | " + text(ck["cadence"]) +
        format(", keep %d; %d written (%.2f s) |\n\n", ck["keep_latest"].get<int>(), ck["writes"].get<int>(), num(ck["seconds"]));

  md += "## Throughput\n\n| | |\n|---|---|\n";
  md += format("| tokens/s | %.1f |\n| TFLOP/s per GPU | %.4g |\n| MFU | %.2f%% |\n", num(t["tokens_per_s"]),
            num(t["tflops_per_gpu"]), 100 * num(t["mfu"]));
  if (t["mfu_fp8"].is_number()) md += format("| MFU against the FP8 peak | %.2f%% |\n", 100 * num(t["mfu_fp8"]));
  md += format("| FLOPs per token | %.4g (%s) |\n", num(t["flops_per_token"]), text(t["flops_formula"]).c_str());
  md += format("| peak | %.4g TFLOP/s (%s) |\n", num(t["peak_tflops"]), text(t["peak_source"]).c_str());
  md += "| formula | " + text(t["mfu_formula"]) + " |\n";
  md += format("| averaged over | %d steps: %s |\n\n", t["steps_averaged"].get<int>(), text(t["averaged_over"]).c_str());

  md += "## Where the time went\n\n";
  const double wall = num(tm["wall_s"]);
  md += format("Seconds per rank (the mean over %d rank(s)), summed over %d session(s) that ended cleanly.\n\n",
            tm["averaged_over_ranks"].get<int>(), tm["sessions_counted"].get<int>());
  md += "| | seconds | share |\n|---|---:|---:|\n";
  const std::pair<const char*, const char*> rows[] = {
      {"compute", "compute_s"},          {"communication (collectives)", "comm_s"},
      {"pipeline bubble (waiting on neighbours)", "bubble_s"}, {"data wait", "data_s"},
      {"checkpoint writes", "checkpoint_s"}, {"validation", "eval_s"},
      {"text samples", "sample_s"},      {"other (start-up, MFU probe, logging)", "other_s"}};
  for (const auto& [label, key] : rows)
    md += format("| %s | %.3f | %.1f%% |\n", label, num(tm[key]), wall > 0 ? 100 * num(tm[key]) / wall : 0.0);
  md += format("| **wall** | %.3f | 100%% |\n\n", wall);
  // The steps again, cut by the device's own clock (core/metrics/step_timeline.h).
  const json& dev = tm["device_phases_s"];
  const double steps_s = num(tm["steps_s"]);
  if (dev.is_object() && steps_s > 0) {
    md += "Inside the training steps, on the device's clock (time marks in the compute stream: CUDA events on a GPU, "
          "the host clock on the CPU), seconds per rank:\n\n| phase | seconds | share of the steps |\n|---|---:|---:|\n";
    const std::pair<const char*, const char*> phases[] = {
        {"forward (and the loss)", "forward"},
        {"backward (recompute and in-backward reductions included)", "backward"},
        {"pipeline send/recv", "pp_comm"},
        {"gradient reduction not hidden behind backward", "grad_sync"},
        {"optimizer (norm, clip, AdamW, ZeRO gather)", "optimizer"}};
    double inside = 0;
    for (const auto& [label, key] : phases) {
      const double x = dev.value(key, 0.0);
      inside += x;
      if (x > 0 || std::string(key) != "pp_comm") md += format("| %s | %.3f | %.1f%% |\n", label, x, 100 * x / steps_s);
    }
    const double outside = std::max(0.0, steps_s - inside);
    md += format("| outside the device timeline (data reading, host overhead) | %.3f | %.1f%% |\n", outside,
                 100 * outside / steps_s);
    md += format("| **steps** | %.3f | 100%% |\n\n", steps_s);
  }
  if (!tm["comm_by_kind"].empty()) {
    md += "| communication call (whole session) | seconds | calls | MB (payload) |\n|---|---:|---:|---:|\n";
    for (const auto& [kind, v] : tm["comm_by_kind"].items())
      md += format("| %s | %.4f | %.0f | %.2f |\n", kind.c_str(), num(v["seconds"]), num(v["calls"]), num(v["bytes"]) / 1e6);
    md += "\n";
  }

  md += "## Stalls and restarts\n\n";
  md += format("%d session(s): %d restart(s), %d ended without a clean stop (crashed or killed; their time is not counted "
            "above). ",
            rel["sessions"].get<int>(), rel["restarts"].get<int>(), rel["crashed_sessions"].get<int>());
  md += format("%zu stall(s) (%s; median step %.1f ms)", rel["stalls"].size(), text(rel["stall_rule"]).c_str(),
            num(rel["median_step_ms"]));
  for (const auto& st : rel["stalls"]) md += format("; step %d: %.1f ms", st["step"].get<int>(), num(st["ms"]));
  md += ".\n\n";
  if (rel.contains("skipped_steps")) {  // reports written before the run's guards have none
    md += format("Guards: %d non-finite step(s) skipped, %d loss-spike rollback(s), %d corruption check(s) "
                 "(%.2f s) with %d mismatch(es).\n",
                 rel["skipped_steps"].get<int>(), rel["rollbacks"].get<int>(), rel["replay_checks"].get<int>(),
                 num(rel["replay_seconds"]), rel["replay_mismatches"].get<int>());
    for (const auto& e : rel["guard_events"]) md += "- " + text(e) + "\n";
    md += "\n";
  }

  md += "## Loss\n\n| | |\n|---|---|\n";
  md += loss["final_train"].is_null() ? "| final train loss | none logged |\n"
                                      : format("| final train loss | %.4f (step %d) |\n", num(loss["final_train"]),
                                            loss["final_train_step"].get<int>());
  md += loss["final_val"].is_null() ? "| final val loss | none (no data.val, or no validation step yet) |\n"
                                    : format("| final val loss | %.4f (step %d) |\n", num(loss["final_val"]),
                                          loss["final_val_step"].get<int>());
  md += "\n";
  const json& plots = r["plots"];
  for (const auto& f : plots.value("files", json::array())) md += "![" + text(f) + "](" + text(f) + ")\n\n";
  if (!plots.value("note", std::string()).empty()) md += plots["note"].get<std::string>() + "\n\n";

  md += trained_model_markdown(run, ck);
  md += "## Sample\n\n" + text(r["sample"]["note"]) + "\n\n";
  if (!text(r["sample"]["text"]).empty()) md += "```\n" + text(r["sample"]["text"]) + "\n```\n";
  return md;
}

json write_run_report(const RunSummary& s, const std::string& metrics_path, const SessionLog& sessions,
                      const std::string& gnuplot) {
  const std::vector<json> metrics = read_metrics(metrics_path);
  json report = build_report(s, metrics, sum_sessions(sessions.records()));
  const Plots plots = write_plots(s.cfg.run.out_dir, metrics, gnuplot);
  report["plots"] = {{"files", plots.files}, {"note", plots.note}};
  const fs::path dir(s.cfg.run.out_dir);
  // Samples of an undertrained byte-level model can be invalid UTF-8: replace, never throw.
  const std::string text = report.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  for (const auto& [name, content] : {std::pair{"report.json", text}, {"report.md", report_markdown(report)}}) {
    std::ofstream out(dir / name, std::ios::trunc);
    out << content;
    check(out.good(), "writing " + (dir / name).string() + " failed (disk full?)");
  }
  return report;
}

}  // namespace pt
