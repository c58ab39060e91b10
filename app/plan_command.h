// `picotrain plan`: its command-line options (CLI11) and the run that lays them over a --gpu
// profile and prints the plan (core/plan/plan.h does the planning).
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/plan/plan.h"

namespace pt::app {

// The options as given: run_plan lays the numbers set on the command line over --gpu's profile.
struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;  // --set
  int gpus = 0;
  std::string kernels;                 // --kernels: kernel_bench --json of the user's GPU
  std::string attention;               // --attention: bench/attention_sdpa.py's JSON
  std::string gpu = "h100-sxm";
  pt::PlanSearch search;
  std::string overlap = "picotrain";   // --overlap (pt::parse_overlap)
  bool search_all = false;             // --search-all: every PlanSearch dimension
  bool json = false;                   // --json
  pt::Hardware hw;                     // the hardware flags as given
  CLI::App* cmd = nullptr;             // the subcommand, to ask which flags were given
};

// Adds the `plan` subcommand to `app`, its options bound to `a`.
void add_plan_command(CLI::App& app, PlanArgs& a);

// Plans and prints (text or --json); throws ConfigError for bad options or a bad config.
int run_plan(const PlanArgs& a);

}  // namespace pt::app
