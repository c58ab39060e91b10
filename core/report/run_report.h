// The run report: report.json and report.md in the run directory (run.out_dir), written by rank
// 0 when a session ends cleanly (the run finished, or a signal stopped it after a checkpoint).
// It records what a reader needs to interpret the run: the hardware (GPU model and count, nodes,
// interconnect as detected), the parallel layout and memory per rank, the effective batch,
// sequence length, precision and checkpoint cadence, throughput (tokens/s, TFLOP/s per GPU, MFU
// and the formula behind it), where the time went (compute, communication, pipeline bubble, data
// wait, checkpoint writes, validation, samples), stalls and restarts, the final train and
// validation loss, a text sample, and plots of loss and throughput (report_plots.h).
//
// Sources: the RunSummary of the session (run_summary.h), metrics.jsonl (losses and throughput:
// the report's numbers are computed from its records, so the two always agree), and
// sessions.jsonl (session_log.h: restarts, crashes, and the time of every session). report.md is
// rendered from report.json, so the two always agree too.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/report/run_summary.h"
#include "core/report/session_log.h"

namespace pt {

// The records of a metrics.jsonl file (unparsable lines skipped).
std::vector<nlohmann::json> read_metrics(const std::string& path);

// report.json's content (without "plots", which write_run_report adds).
nlohmann::json build_report(const RunSummary& s, const std::vector<nlohmann::json>& metrics,
                            const SessionTotals& sessions);

// report.md from report.json's content.
std::string report_markdown(const nlohmann::json& report);

// Reads the metrics and the session log, draws the plots, writes report.json and report.md into
// s.cfg.run.out_dir, and returns the report's content. gnuplot: as for write_plots.
nlohmann::json write_run_report(const RunSummary& s, const std::string& metrics_path, const SessionLog& sessions,
                                const std::string& gnuplot = "gnuplot");

}  // namespace pt
