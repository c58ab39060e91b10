// Checkpoints of a model with experts (the moe section): the manifest records the keys that shape
// it, so a checkpoint alone rebuilds the same model (convert, sample, resume), while a dense
// model's manifest keys, and so its model hash, are exactly what they were before experts; a
// resume under another moe shape is refused naming the key; training resumes bit for bit.
#include <catch2/catch.hpp>

#include <memory>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/manifest.h"
#include "core/cpu/cpu_ops.h"
#include "core/model/param_table.h"
#include "core/model/sample_run.h"

using namespace pt;
using namespace pt::test;
using namespace pt::ckpt;
using Catch::Matchers::Contains;
using json = nlohmann::json;

namespace {

// The fixture's 2 layers of d_model 32 as a Llama with kTinyMoe's experts: 4 of width 24 in
// every block, 2 per token, and a balancing-loss weight that is not the default.
const std::vector<std::string> kMoe = with({"model.arch=llama", "model.n_heads=4"}, kTinyMoe);

}  // namespace

TEST_CASE("the manifest's model keys: a dense model's as before, a model with experts adds its moe keys", "[ckpt]") {
  CkptFixture fx("ckpt_moe_keys");
  // The exact text (its checksum is the model hash) of dense models: what checkpoints written
  // before experts existed hold, so they still load.
  CHECK(model_shape_json(fx.config().model).dump() ==
        R"({"arch":"gpt2","d_model":32,"max_seq_len":64,"n_heads":2,"n_layers":2,"padded_vocab":256,)"
        R"("vocab_size":256})");
  CHECK(model_shape_json(fx.config({"model.arch=llama", "model.n_heads=4"}).model).dump() ==
        R"({"arch":"llama","d_model":32,"ffn_hidden":256,"max_seq_len":64,"n_heads":4,"n_kv_heads":4,)"
        R"("n_layers":2,"norm_eps":1e-05,"padded_vocab":256,"rope_theta":10000.0,"tie_embeddings":false,)"
        R"("vocab_size":256})");

  // Every block sparse: no block has the dense MLP of ffn_hidden, so it is no key.
  const json moe = model_shape_json(fx.config(kMoe).model);
  CHECK(moe["moe"] ==
        json{{"n_experts", 4}, {"top_k", 2}, {"expert_hidden", 24}, {"every", 1}, {"n_shared_experts", 0}});
  CHECK_FALSE(moe.contains("ffn_hidden"));
  CHECK_FALSE(moe["moe"].contains("aux_loss_coef"));  // the objective's weight, in the config
  // Every other block sparse, one shared expert; expert_hidden left to its default, ffn_hidden.
  const json mixed = model_shape_json(
      fx.config({"model.arch=llama", "model.n_heads=4", "model.ffn_hidden=40", "moe.n_experts=3", "moe.top_k=1",
                 "moe.every=2", "moe.n_shared_experts=1"})
          .model);
  CHECK(mixed["ffn_hidden"] == 40);
  CHECK(mixed["moe"] ==
        json{{"n_experts", 3}, {"top_k", 1}, {"expert_hidden", 40}, {"every", 2}, {"n_shared_experts", 1}});
}

TEST_CASE("a checkpoint with experts rebuilds its model; another moe shape is refused naming the key", "[ckpt]") {
  CkptFixture fx("ckpt_moe_shape");
  const World world;
  std::vector<float> trained;
  {
    CpuOps ops;
    Trainer t(fx.config(kMoe), world, ops);
    t.step();
    t.step();
    CHECK(t.save_checkpoint() == fx.step_dir(2));
    trained = master_weights(t);
  }
  const RunConfig cfg = fx.config(kMoe);

  SECTION("model_from_manifest: the same model, the balancing loss's weight from the config") {
    CheckpointReader r(fx.step_dir(2));
    CHECK(r.manifest().model == model_shape_json(cfg.model));
    const ModelSection back = model_from_manifest(r.manifest(), fx.step_dir(2));
    CHECK(back.arch == "llama");
    check_tiny_moe(back.moe);
    CHECK(model_shape_json(back) == model_shape_json(cfg.model));
    // Its table is the trained one's, tensor for tensor.
    const ParamTable a = build_param_table(back), b = build_param_table(cfg.model);
    REQUIRE(a.specs().size() == b.specs().size());
    for (size_t i = 0; i < a.specs().size(); i++) {
      CHECK(a.specs()[i].name == b.specs()[i].name);
      CHECK(a.specs()[i].global_shape == b.specs()[i].global_shape);
    }
    CHECK_NOTHROW(a.get("model.layers.1.block_sparse_moe.experts.3.w2.weight"));
  }

  SECTION("what sample reads: the model and its weights from the checkpoint alone") {
    const CheckpointWeights w = read_checkpoint_weights(fx.ckpt_dir());
    CHECK(w.dir == fx.step_dir(2));
    CHECK(model_shape_json(w.model) == model_shape_json(cfg.model));
    CHECK(same_bytes(w.weights, trained));
  }

  SECTION("resume: the same model loads; another moe shape, or none, is refused naming the key") {
    CpuOps ops;
    {
      Trainer t(fx.config(with(kMoe, {"checkpoint.resume=auto"})), world, ops);
      CHECK(t.steps_done() == 2);
      CHECK(same_bytes(master_weights(t), trained));
    }
    // The balancing loss's weight is no part of the shape: a run may change it.
    CHECK_NOTHROW(Trainer(fx.config(with(kMoe, {"checkpoint.resume=auto", "moe.aux_loss_coef=0.001"})), world, ops));
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"moe.top_k=1", "moe.top_k=1 but the checkpoint " + fx.step_dir(2) + " has 2"},
        {"moe.n_experts=3", "moe.n_experts=3 but the checkpoint"},
        {"moe.expert_hidden=16", "moe.expert_hidden=16 but the checkpoint"},
        {"moe.every=2", "moe.every=2 but the checkpoint"},
        {"moe.n_shared_experts=1", "moe.n_shared_experts=1 but the checkpoint"},
        {"moe.n_experts=0", "moe.n_experts=0 (a dense model) but the checkpoint " + fx.step_dir(2) +
                                " holds a model with experts"},
    };
    for (const auto& [set, want] : cases) {
      DYNAMIC_SECTION(set) {
        CHECK_THROWS_AS(Trainer(fx.config(with(kMoe, {"checkpoint.resume=auto", set})), world, ops), ConfigError);
        CHECK_THROWS_WITH(Trainer(fx.config(with(kMoe, {"checkpoint.resume=auto", set})), world, ops), Contains(want));
      }
    }
  }
}

TEST_CASE("a dense checkpoint is refused by a config with experts", "[ckpt]") {
  CkptFixture fx("ckpt_moe_dense");
  const World world;
  CpuOps ops;
  const std::vector<std::string> dense = {"model.arch=llama", "model.n_heads=4"};
  train_and_save(fx.config(dense), 1);
  CHECK_THROWS_WITH(Trainer(fx.config(with(kMoe, {"checkpoint.resume=auto"})), world, ops),
                    Contains("moe.n_experts=4 but the checkpoint " + fx.step_dir(1) + " holds a dense model"));
}

TEST_CASE("resume of a model with experts is bit-exact: 6 steps straight equal 3 + checkpoint + resume + 3",
          "[ckpt]") {
  CkptFixture fx("ckpt_moe_resume");
  const ResumeRuns runs = run_straight_and_resumed(fx, [] { return std::make_unique<CpuOps>(); }, 3, 6, kMoe);
  check_bit_exact_resume(runs, fx);
}
