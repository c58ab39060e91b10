// The run report's text sample: logging.sample_tokens tokens after logging.sample_prompt from the
// final weights, with the settings of the log's samples (seed run.seed, temperature 0.8, top-k
// 200; core/model/sample_run.h), so it is the text the log's last sample shows.
#pragma once
#include <string>

#include "core/config/run_config.h"
#include "core/model/sample_run.h"
#include "core/ops/ops.h"

namespace pt {

struct ReportSample {
  std::string text;  // the prompt and its continuation; "" when there is none
  std::string note;  // how it was sampled, or why there is no sample
};

// weights: the whole model's fp32 master weights in ParamTable order.
ReportSample sample_for_report(const RunConfig& cfg, const float* weights, Ops& ops);
// The report's form of a sample already taken (the log's last one, from the same weights).
ReportSample report_sample(const RunConfig& cfg, const TrainingSample& sample);

}  // namespace pt
