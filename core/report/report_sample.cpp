#include "core/report/report_sample.h"

#include <memory>

#include <nlohmann/json.hpp>

#include "core/model/kv_cache_decoder.h"
#include "core/model/model_tokenizer.h"
#include "core/model/sample_run.h"

namespace pt {

ReportSample sample_for_report(const RunConfig& cfg, const float* weights, Ops& ops) {
  ReportSample r;
  const std::string name = run_tokenizer_name(cfg);
  if (name.empty()) {
    r.note = "no sample: model.vocab_size=" + std::to_string(cfg.model.vocab_size) +
             " is none of " + vocabularies_with_a_tokenizer() + " and data.tokenizer is not set";
    return r;
  }
  std::shared_ptr<const Tokenizer> tok;
  try {
    tok = shared_tokenizer(name);
  } catch (const std::exception& e) {
    r.note = std::string("no sample: ") + e.what();
    return r;
  }
  KvCacheDecoder decoder(cfg.model, weights, ops);
  return report_sample(cfg, sample_training_text(cfg, decoder, *tok));
}

ReportSample report_sample(const RunConfig& cfg, const TrainingSample& sample) {
  ReportSample r;
  // An undertrained model (the byte tokenizer above all) writes bytes that are not UTF-8; the
  // report is text, so they become U+FFFD (nlohmann's replacing dump does exactly that).
  r.text = nlohmann::json::parse(
               nlohmann::json(sample.text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
               .get<std::string>();
  r.note = std::to_string(sample.tokens) + " tokens after the prompt \"" + cfg.logging.sample_prompt + "\" (" +
           sample.tokenizer + " tokenizer, " + sample.settings + ")";
  return r;
}

}  // namespace pt
