// FP8 products (precision.fp8 = tensorwise or rowwise) under every layout. Each rank's scales
// cover the whole of what they scale: amaxes are gathered over the ranks that hold the other
// parts (core/parallel/fp8_linear.h), so a layout quantises every value as one rank does:
//  - the layers: a layer whose tokens are split over cp equals the unsplit FP8 layer (tensorwise
//    and rowwise scales) within float reassociation (1e-6 + 1e-5 relative); the column -> GELU
//    -> row parallel MLP over tp is checked in FP8 beside fp32 in mpi_tensor_parallel.cpp;
//  - the trainer, run under mpirun with 2 and 4 ranks (every rank computes the one-rank FP8
//    reference itself, then trains under the layouts that fill the world):
//      2 ranks: dp2, tp2, tp2 + SP, cp2 ring, cp2 Ulysses, pp2; the Llama (GQA, SwiGLU) under
//               tp2 + SP; rowwise scales under tp2 + SP and cp2;
//      4 ranks: tp2 x cp2 + SP, dp2 x tp2 + SP with ZeRO-3, dp2 x cp2, tp2 x pp2, the Llama under
//               tp2 x cp2 + SP, rowwise scales under tp2 x cp2 + SP; recompute changes no bit;
//    a run saved at step 5 and resumed equals the straight run bit for bit (tp2 + SP, tp2 x cp2 + SP);
//    losses of each of 10 steps and the validation loss agree within 3e-5 relative, gradient
//    norms and final weights within 3e-3 (kFp8Bounds: mpi_trainer_parity.h says why not 1e-5).
// Delayed scaling (precision.fp8 = delayed, core/parallel/fp8_delayed.h): its first step is
// tensorwise's bit for bit; every rank of a stage ends each step with the same amax history;
// dp2, tp2 + SP, cp2, pp2 (2 ranks), dp2 x tp2 + SP with ZeRO-3, tp2 x cp2 + SP, tp2 x pp2 (4)
// train like one rank; a resumed run (a 3-step history, so it has wrapped) restores the history
// bit for bit and continues as the straight run did, also when the checkpoint was written under
// pp2 and read without; the memory plan counts its buffers; recompute changes no bit.
// Attention in FP8 (all,attention): it changes the one-rank run; dp2, tp2 + SP, cp2 Ulysses, pp2,
// delayed dp2, the Llama under tp2 + SP and cp2 Ulysses (2 ranks), tp2 x cp2 Ulysses + SP, dp2 x
// pp2, the Llama under dp2 x tp2 + SP (4) train like one rank; recompute changes no bit.
// The LM head in FP8 (precision.fp8_layers = all,lm_head): it changes the one-rank run (its
// products really are FP8's), and tp2 + SP, cp2, pp2, dp2 delayed, the Llama's untied head under
// tp2 + SP, rowwise under tp2 (2 ranks), tp2 x cp2 + SP, tp2 x pp2 delayed and the Llama under
// dp2 x tp2 + SP with ZeRO-3 (4 ranks) train like one rank (losses within kFp8HeadBounds); its
// delayed history is recorded alike on every rank, checkpointed and resumed (also from pp2),
// and its buffers are in the memory plan (tp2 + SP rowwise; pp4 delayed, every stage's plan).
// The routed experts in FP8 (all,experts; delayed scaling, core/model/moe_layer.h): step 1 runs
// them in fp32 (the run without expert FP8 bit for bit), then they move the run; dp2 with ep2,
// tp2 + SP, cp2, pp2 (2 ranks), dp2 x tp2 + SP with ep2, dp4 with ep4, tp2 x cp2 + SP (4) train
// like one rank for 5 steps (a routing flip parts them later: see the test); every rank holds
// every expert's history, checkpointed and resumed bit for bit; the memory plan holds.
// ZeRO-3 gathers the FP8 layers' weights as e4m3 codes (core/train/param_gather.h): the run is
// the bf16-gather run bit for bit (dp2, the Llama with its untied head in FP8 under dp2; dp2 x
// tp2 + SP, dp4), with well under half the bytes;
// each weight is cast with the whole weight's scale (a weight whose shards' parts lie 2^16 apart
// gathers to the whole's quantised values); its buffers are in the memory plan.
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "core/ckpt/checkpoint_reader.h"
#include "core/dist/local_comm.h"
#include "core/dist/process_groups.h"
#include "core/parallel/fp8_linear.h"
#include "core/plan/stage_memory.h"
#include "core/train/fp8_history_state.h"
#include "core/train/memory_plan.h"
#include "core/train/param_gather.h"
#include "cpu_test_support.h"
#include "mpi_trainer_parity.h"

using namespace pt;
using namespace pt::test;

namespace {

const SharedShards& data() {
  static const SharedShards d("mpi_fp8", 9, 20000, 3000, kVocab);
  return d;
}

Layout fp8(int dp, int tp, int cp, int pp = 1) { return grid(dp, tp, cp, pp).with_fp8(); }
// The Llama at the learning rate mpi_llama.cpp explains (Adam amplifies float-order noise at 1e-2).
Layout llama_fp8(int dp, int tp, int cp) {
  return fp8(dp, tp, cp).with([](Layout& l) { l.arch = "llama", l.lr = 3e-3; });
}

Layout delayed(int dp, int tp, int cp, int pp = 1) { return fp8(dp, tp, cp, pp).with_fp8("delayed"); }

Layout with_head(const Layout& l) { return l.with([](Layout& x) { x.fp8_layers = "all,lm_head"; }); }

// Attention in FP8 too (core/common/fp8_attention.h).
Layout with_attention(const Layout& l) { return l.with([](Layout& x) { x.fp8_layers = "all,attention"; }); }

// mpi_moe.cpp's model (the Llama with 4 routed experts, top 2, in every block) under delayed
// scaling with its routed experts in FP8 too.
Layout moe_fp8(int dp, int tp, int cp, int pp = 1) {
  return delayed(dp, tp, cp, pp).with([](Layout& l) {
    l.arch = "llama", l.lr = 3e-3, l.experts = 4, l.top_k = 2;
    l.fp8_layers = "all,experts";
  });
}

// The amax histories a whole-model checkpoint of `l` holds: each block's four layers (two in a
// sparse block without shared experts: it has no dense MLP), the LM head's, each routed
// expert's up and down.
size_t history_count(const Layout& l) {
  const bool head = l.fp8_layers.find("lm_head") != std::string::npos;
  const bool experts = l.fp8_layers.find("experts") != std::string::npos;
  const bool dense_mlp = l.experts == 0 || l.shared > 0;
  return 8 * (dense_mlp ? kFp8BlockLayers : 2) + (head ? 1 : 0) + (experts ? 8 * l.experts * 2 : 0);
}

// The one-rank run of `l`'s model and FP8 recipe (each computed once per process).
const RunResult& reference(const Layout& l) {
  static std::map<std::string, RunResult> runs;
  const Layout one = one_rank(l);
  const std::string key = one.describe() + ", history " + std::to_string(one.fp8_history);
  auto it = runs.find(key);
  if (it == runs.end()) it = runs.emplace(key, train(one, World{}, data().dir)).first;
  return it->second;
}

void check(const Layout& l, const World& world) { check_trains_like(l, world, data().dir, reference(l)); }

// Every amax history this rank holds, by checkpoint name, oldest step first: what its checkpoint
// would save (Fp8HistoryState over the trainer's chunks).
std::map<std::string, std::vector<float>> histories(Trainer& t, const Layout& l) {
  std::vector<DecoderStage*> chunks;
  PipelineExecutor& ex = t.pipeline();
  for (size_t c = 0; c < ex.chunks().size(); c++) {
    REQUIRE(ex.chunk(static_cast<int>(c)).fp8_delayed() != nullptr);
    chunks.push_back(&ex.chunk(static_cast<int>(c)));
  }
  Fp8HistoryState state(chunks, fp8_recipe(parity_config(l, data().dir).precision));
  std::map<std::string, std::vector<float>> out;
  for (const ckpt::ExtraState::Entry& e : state.save_entries()) out[e.name] = e.values;
  REQUIRE(out.size() == state.names().size());  // every site has recorded
  return out;
}

// Trains `saver` for 5 steps (its checkpoints under data().dir / `name`) and saves: the
// checkpoint's path, and the histories the saving ranks held.
std::pair<std::string, std::map<std::string, std::vector<float>>> save_after_5(Layout saver, const std::string& name,
                                                                               const World& world) {
  saver.checkpoints = (data().dir / name).string();
  CpuOps ops;
  Trainer t(parity_config(saver, data().dir), world, ops);
  for (int s = 0; s < 5; s++) t.step();
  const std::string saved = t.save_checkpoint();
  return {saved, histories(t, saver)};
}

// `r`, which started after `first` steps, is `straight`'s run from there bit for bit: each
// step's loss and gradient norm, the final weights and the validation loss.
void check_same_run(const RunResult& r, const RunResult& straight, size_t first = 0) {
  for (size_t s = 0; s < r.steps.size(); s++) {
    INFO("step " << first + s + 1);
    CHECK(r.steps[s].loss == straight.steps[first + s].loss);
    CHECK(r.steps[s].grad_norm == straight.steps[first + s].grad_norm);
  }
  CHECK(r.weights == straight.weights);
  CHECK(r.val_loss == straight.val_loss);
}

// The histories of every rank of the world, concatenated in name order (the same length on each).
std::vector<float> flat(const std::map<std::string, std::vector<float>>& h) {
  std::vector<float> out;
  for (const auto& [name, v] : h) out.insert(out.end(), v.begin(), v.end());
  return out;
}

}  // namespace

TEST_CASE("an FP8 layer whose tokens are split over cp equals the unsplit FP8 layer", "[mpi][fp8][cp]") {
  const World w = whole_world();
  CpuOps ops;
  const auto cp = make_group_comm(everyone(w.size), w, ops);
  LocalComm one(w.rank, ops);
  const int P = cp->size(), r = cp->rank();
  const int N = 4 * P, Nl = N / P, IC = 16, OC = 8;
  std::vector<float> x = random_floats(size_t(N) * IC, 31), wt = random_floats(size_t(OC) * IC, 32),
                     dy = random_floats(size_t(N) * OC, 33);
  // As in mpi_tensor_parallel.cpp's FP8 MLP: power-of-two scales round a part alike under its
  // own scale and the whole's except at the format's edges, so the first rank's tokens have
  // inputs 2^16 times and output gradients 2^-16 times the others' (the weight gradient feels
  // both): the whole's scales put a part of x and of dy among e4m3's subnormals (gradients in
  // e4m3: e5m2's range is too wide), and a scale gathered over the wrong group shows.
  for (size_t i = 0; i < size_t(Nl) * IC; i++) x[i] *= 65536.0f;
  for (size_t i = 0; i < size_t(Nl) * OC; i++) dy[i] /= 65536.0f;
  for (bool rowwise : {false, true}) {
    INFO((rowwise ? "rowwise" : "tensorwise"));
    Buffers ref(ops);
    Fp8Linear whole(ops, one, nullptr, Fp8Format::e4m3, rowwise);
    Tensor ry = ref.zeros(size_t(N) * OC), rdx = ref.zeros(size_t(N) * IC), rdw = ref.zeros(wt.size());
    whole.forward(ry, ref.f32(x), false, ref.f32(wt), Tensor{}, N, IC, OC, Fp8Site{0});
    whole.backward(rdx, rdw, Tensor{}, ref.f32(dy), false, ref.f32(x), false, ref.f32(wt), N, IC, OC, Fp8Site{0});

    Fp8Linear part(ops, one, cp.get(), Fp8Format::e4m3, rowwise);
    Buffers bufs(ops);
    const Tensor tx = bufs.f32(rows_of(x, IC, r * Nl, Nl)), tw = bufs.f32(wt), tdy = bufs.f32(rows_of(dy, OC, r * Nl, Nl));
    Tensor y = bufs.zeros(size_t(Nl) * OC), dx = bufs.zeros(size_t(Nl) * IC), dw = bufs.zeros(wt.size());
    part.forward(y, tx, false, tw, Tensor{}, Nl, IC, OC, Fp8Site{0});
    part.backward(dx, dw, Tensor{}, tdy, false, tx, false, tw, Nl, IC, OC, Fp8Site{0});
    // Relative only: the first rank's dx is 2^-16 of the rest.
    require_close(bufs.read(y), rows_of(ref.read(ry), OC, r * Nl, Nl), 0.0, 1e-5, "y");
    require_close(bufs.read(dx), rows_of(ref.read(rdx), IC, r * Nl, Nl), 0.0, 1e-5, "dx");
    // dW is this rank's tokens' share; summed over the cp ranks it is the whole.
    cp->all_reduce(dw);
    require_close(bufs.read(dw), ref.read(rdw), 1e-6, 1e-5, "dw summed over cp");
  }
}

TEST_CASE("FP8 changes the one-rank run by the formats' rounding, and it still trains", "[mpi][fp8]") {
  const RunResult& with_fp8 = reference(fp8(1, 1, 1));
  const RunResult without = train(grid(1, 1, 1), World{}, data().dir);
  REQUIRE(with_fp8.steps.size() == without.steps.size());
  // Step 1's loss is the initial weights' in both (the FP8 forward rounds it a little); later
  // steps differ by more than float order (so FP8 really ran) and far less than the loss itself.
  const double first = std::fabs(with_fp8.steps[0].loss - without.steps[0].loss) / without.steps[0].loss;
  const double last = std::fabs(with_fp8.steps.back().loss - without.steps.back().loss) / without.steps.back().loss;
  CHECK(first < 1e-2);
  CHECK(last > 1e-6);
  CHECK(last < 5e-2);
  // The LM head in FP8 too (precision.fp8_layers = all,lm_head) changes it again: its products
  // really run in FP8.
  const RunResult& head = reference(with_head(fp8(1, 1, 1)));
  const double head_gap = std::fabs(head.steps.back().loss - with_fp8.steps.back().loss) / with_fp8.steps.back().loss;
  CHECK(head_gap > 1e-6);
  CHECK(head_gap < 5e-2);
  // So does attention in FP8 (precision.fp8_layers = all,attention).
  const RunResult& attention = reference(with_attention(fp8(1, 1, 1)));
  const double attention_gap =
      std::fabs(attention.steps.back().loss - with_fp8.steps.back().loss) / with_fp8.steps.back().loss;
  CHECK(attention_gap > 1e-6);
  CHECK(attention_gap < 5e-2);
}

// Attention in FP8 scales each sequence's heads on their own, and every layout but ring attention
// holds a sequence's heads whole, so each quantises as one rank does (ring is a ConfigError).
TEST_CASE("attention in FP8 trains like one rank: dp, tp + SP, Ulysses, pp, GQA; recompute changes no bit",
          "[mpi][fp8][attention]") {
  const World world = whole_world();
  if (world.size == 2)
    for (const Layout& l : {fp8(2, 1, 1), fp8(1, 2, 1).with_sp(), fp8(1, 1, 2).with_ulysses(), fp8(1, 1, 1, 2),
                            delayed(2, 1, 1), llama_fp8(1, 2, 1).with_sp(), llama_fp8(1, 1, 2).with_ulysses()})
      check(with_attention(l), world);
  if (world.size == 4) {
    for (const Layout& l : {fp8(1, 2, 2).with_sp().with_ulysses(), fp8(2, 1, 1, 2), llama_fp8(2, 2, 1).with_sp()})
      check(with_attention(l), world);
    check_recompute_is_bitwise(with_attention(fp8(1, 2, 2).with_sp().with_ulysses()), world, data().dir, 3);
  }
}

TEST_CASE("the LM head in FP8 trains like one rank: tp (vocabulary rows), cp, pp, dp, ZeRO-3", "[mpi][fp8][head]") {
  const World world = whole_world();
  if (world.size == 2)
    for (const Layout& l : {fp8(1, 2, 1).with_sp(), fp8(1, 1, 2), fp8(1, 1, 1, 2), delayed(2, 1, 1),
                            llama_fp8(1, 2, 1).with_sp(), fp8(1, 2, 1).with_fp8("rowwise")})
      check(with_head(l), world);
  if (world.size == 4)
    for (const Layout& l : {fp8(1, 2, 2).with_sp(), delayed(1, 2, 1, 2), llama_fp8(2, 2, 1).with_sp().with_zero(3)})
      check(with_head(l), world);
}

TEST_CASE("FP8 over two ranks trains like one rank: dp, tp, sp, cp, pp", "[mpi][fp8]") {
  const World world = whole_world();
  if (world.size != 2) return;
  for (const Layout& l : {fp8(2, 1, 1), fp8(1, 2, 1), fp8(1, 2, 1).with_sp(), fp8(1, 1, 2),
                          fp8(1, 1, 2).with_ulysses(), fp8(1, 1, 1, 2)})
    check(l, world);
  check(llama_fp8(1, 2, 1).with_sp(), world);
  for (const Layout& l : {fp8(1, 2, 1).with_sp().with_fp8("rowwise"), fp8(1, 1, 2).with_fp8("rowwise")})
    check(l, world);
}

TEST_CASE("FP8 over four ranks trains like one rank: tp x cp, dp x tp with ZeRO-3, tp x pp", "[mpi][fp8]") {
  const World world = whole_world();
  if (world.size != 4) return;
  for (const Layout& l : {fp8(1, 2, 2).with_sp(), fp8(2, 2, 1).with_sp().with_zero(3), fp8(2, 1, 2), fp8(1, 2, 1, 2)})
    check(l, world);
  check(llama_fp8(1, 2, 2).with_sp(), world);
  check(fp8(1, 2, 2).with_sp().with_fp8("rowwise"), world);
}

TEST_CASE("the FP8 buffers are in the memory plan: it equals what the stages allocate", "[mpi][fp8][memory]") {
  const World world = whole_world();
  if (world.size == 2) check_activation_memory(fp8(1, 2, 1).with_sp(), world, data().dir);
  if (world.size == 4) check_activation_memory(fp8(1, 2, 2).with_sp(), world, data().dir);
}

TEST_CASE("FP8 resumes bit-exactly: dynamic scaling keeps no state between steps", "[mpi][fp8][ckpt]") {
  const World world = whole_world();
  const Layout l = world.size == 2 ? fp8(1, 2, 1).with_sp() : fp8(1, 2, 2).with_sp();
  const RunResult straight = train(l, world, data().dir);
  Layout saver = l;
  saver.checkpoints = (data().dir / "fp8_resume").string();
  std::string saved;
  {
    CpuOps ops;
    Trainer t(parity_config(saver, data().dir), world, ops);
    for (int s = 0; s < 5; s++) t.step();
    saved = t.save_checkpoint();
  }
  Layout resumer = l;
  resumer.checkpoints = (data().dir / "fp8_resumed").string();
  resumer.resume = saved;
  CpuOps ops;
  Trainer t(parity_config(resumer, data().dir), world, ops);
  REQUIRE(t.steps_done() == 5);
  check_same_run(collect(t, kSteps - 5), straight, 5);
}

TEST_CASE("activation recompute changes no bit under FP8 (tp2 x cp2)", "[mpi][fp8][recompute]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_recompute_is_bitwise(fp8(1, 2, 2).with_sp(), world, data().dir, 3);
}

TEST_CASE("delayed FP8 scaling: step 1 is tensorwise's, then every rank keeps one history", "[mpi][fp8][delayed]") {
  const World world = whole_world();
  // One rank: the first step has no history and scales as tensorwise does, bit for bit.
  const RunResult& d = reference(delayed(1, 1, 1));
  const RunResult& t = reference(fp8(1, 1, 1));
  CHECK(d.steps[0].loss == t.steps[0].loss);
  CHECK(d.steps[0].grad_norm == t.steps[0].grad_norm);
  // Under data, tensor and context parallel every rank ends a step with the same histories, the
  // largest amaxes of every rank's micro-batches and parts; each layer's x, w and dout recorded.
  std::vector<Layout> layouts;
  if (world.size == 2)
    layouts = {delayed(2, 1, 1), delayed(1, 2, 1).with_sp(), with_head(delayed(1, 1, 2)), moe_fp8(2, 1, 1).with_ep(2)};
  if (world.size == 4) layouts = {delayed(2, 2, 1).with_sp(), with_head(delayed(1, 2, 2).with_sp())};
  for (const Layout& l : layouts) {
    INFO(l.describe());
    CpuOps ops;
    Trainer tr(parity_config(l, data().dir), world, ops);
    for (int s = 0; s < 3; s++) tr.step();
    const std::vector<float> mine = flat(histories(tr, l));
    REQUIRE(mine.size() == history_count(l) * 16 * 3);  // 16 steps of x, w, dout each
    for (const auto& [name, h] : histories(tr, l)) {  // the 3 newest rows of 16 recorded, the rest zero
      INFO(name);
      // A routed expert that no token chose in a step records nothing that step.
      const bool expert = name.find(".experts.") != std::string::npos;
      for (size_t i = 0; i < h.size(); i++)
        if (i / 3 >= 13) REQUIRE((expert ? h[i] >= 0.0f : h[i] > 0.0f));
        else REQUIRE(h[i] == 0.0f);
    }
    std::vector<float> all(mine.size() * world.size);
    MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, all.data(), static_cast<int>(mine.size()),
                  MPI_FLOAT, MPI_COMM_WORLD);
    for (int r = 1; r < world.size; r++) {
      INFO("rank " << r << " against rank 0");
      CHECK(std::equal(mine.begin(), mine.end(), all.begin() + r * mine.size()));
    }
  }
}

TEST_CASE("delayed FP8 scaling over two and four ranks trains like one rank", "[mpi][fp8][delayed]") {
  const World world = whole_world();
  if (world.size == 2)
    for (const Layout& l : {delayed(2, 1, 1), delayed(1, 2, 1).with_sp(), delayed(1, 1, 2), delayed(1, 1, 1, 2)})
      check(l, world);
  if (world.size == 4)
    for (const Layout& l : {delayed(2, 2, 1).with_sp().with_zero(3), delayed(1, 2, 2).with_sp(), delayed(1, 2, 1, 2)})
      check(l, world);
}

TEST_CASE("delayed FP8 scaling resumes bit-exactly: checkpoints keep the amax histories", "[mpi][fp8][delayed][ckpt]") {
  const World world = whole_world();
  // A 3-step history has wrapped by step 5: its oldest row is not its first.
  // The LM head's history too, saved by the last stage under pp2.
  const Layout l = with_head(world.size == 2 ? delayed(1, 2, 1).with_sp() : delayed(1, 2, 2).with_sp())
                       .with([](Layout& x) { x.fp8_history = 3; });
  const RunResult straight = train(l, world, data().dir);
  // Saved under l, and (the same run) under pp2: layers named globally, read by any split.
  for (const Layout& saver_layout : {l, l.with([&](Layout& x) { x.tp = 1, x.sp = false, x.cp = 1, x.pp = 2, x.dp = world.size / 2; })}) {
    INFO("saved under " << saver_layout.describe());
    const auto [saved, at_save] = save_after_5(saver_layout, "fp8_delayed_" + std::to_string(saver_layout.pp), world);
    // The checkpoint holds each layer's history, [3 steps, x w dout], as the saving ranks had it.
    ckpt::CheckpointReader reader(saved);
    CHECK(reader.has("fp8_amax_history/lm_head"));
    for (const auto& [name, h] : at_save) {
      INFO(name);
      REQUIRE(reader.has(name));
      CHECK(reader.manifest().find(name)->shape == std::vector<int64_t>{3, 3});
      std::vector<float> v(9);
      reader.read(name, 0, 9, v.data());
      CHECK(v == h);
    }
    Layout resumer = l;
    resumer.checkpoints = (data().dir / ("fp8_delayed_resumed_" + std::to_string(saver_layout.pp))).string();
    resumer.resume = saved;
    CpuOps ops;
    Trainer t(parity_config(resumer, data().dir), world, ops);
    REQUIRE(t.steps_done() == 5);
    for (const auto& [name, h] : histories(t, resumer)) {
      INFO(name << " restored");
      std::vector<float> v(9);
      reader.read(name, 0, 9, v.data());
      CHECK(h == v);
    }
    if (saver_layout.pp != 1) continue;  // another layout's run differs in float order: the straight one is l's
    check_same_run(collect(t, kSteps - 5), straight, 5);
  }
}

TEST_CASE("delayed FP8 scaling: its buffers are in the memory plan, recompute changes no bit", "[mpi][fp8][delayed][memory]") {
  const World world = whole_world();
  if (world.size == 2) {
    check_activation_memory(delayed(2, 1, 1), world, data().dir);
    check_activation_memory(with_head(fp8(1, 2, 1).with_sp().with_fp8("rowwise")), world, data().dir);
  }
  if (world.size == 4) {
    check_activation_memory(with_head(delayed(1, 1, 1, 4)), world, data().dir);
    check_activation_memory(delayed(1, 2, 2).with_sp(), world, data().dir);
    check_recompute_is_bitwise(delayed(1, 2, 2).with_sp(), world, data().dir, 3);
  }
}

TEST_CASE("routed experts in FP8 (delayed): step 1 in the compute dtype, then every layout trains like one rank",
          "[mpi][fp8][moe]") {
  const World world = whole_world();
  // One rank: step 1 records the experts' amaxes and runs them in fp32, so it is the run without
  // expert FP8 bit for bit; from step 2 their products are FP8's and the run moves.
  const RunResult& with = reference(moe_fp8(1, 1, 1));
  const RunResult& without = reference(moe_fp8(1, 1, 1).with([](Layout& l) { l.fp8_layers = "all"; }));
  CHECK(with.steps[0].loss == without.steps[0].loss);
  CHECK(with.steps[0].grad_norm == without.steps[0].grad_norm);
  const double gap = std::fabs(with.steps.back().loss - without.steps.back().loss) / without.steps.back().loss;
  CHECK(gap > 1e-6);
  CHECK(gap < 5e-2);
  // Expert parallel joins two ranks' rows in one product, sequence and context parallel split
  // them: the history's scales are the same for all. Five steps (four with FP8 experts): routing
  // is discrete, and once an FP8 rounding flip (kFp8Bounds says why they happen) moves a router
  // input across a near-tie, a token changes experts and the runs part by more than a flip
  // (measured: cp2 at step 7, the busiest expert's load one token off, 2026-11-28).
  std::vector<Layout> layouts;
  if (world.size == 2)
    layouts = {moe_fp8(2, 1, 1).with_ep(2), moe_fp8(1, 2, 1).with_sp(), moe_fp8(1, 1, 2), moe_fp8(1, 1, 1, 2)};
  if (world.size == 4)
    layouts = {moe_fp8(2, 2, 1).with_sp().with_ep(2), moe_fp8(4, 1, 1).with_ep(4), moe_fp8(1, 2, 2).with_sp()};
  for (const Layout& l : layouts) {
    INFO(l.describe());
    check_parity(train(l, world, data().dir, 5), reference(l), false, kFp8Bounds);
  }
}

TEST_CASE("routed experts in FP8: the histories resume bit-exactly, the memory plan holds", "[mpi][fp8][moe][ckpt]") {
  const World world = whole_world();
  const Layout l = world.size == 2 ? moe_fp8(2, 1, 1).with_ep(2) : moe_fp8(2, 2, 1).with_sp().with_ep(2);
  const RunResult straight = train(l, world, data().dir);
  const auto [saved, at_save] = save_after_5(l, "fp8_moe", world);
  // Every expert's history is saved, including the experts this rank does not run.
  ckpt::CheckpointReader reader(saved);
  CHECK(reader.has(Fp8HistoryState::expert_name(7, 3, true)));
  Layout resumer = l;
  resumer.checkpoints = (data().dir / "fp8_moe_resumed").string();
  resumer.resume = saved;
  CpuOps ops;
  Trainer t(parity_config(resumer, data().dir), world, ops);
  REQUIRE(t.steps_done() == 5);
  CHECK(histories(t, resumer) == at_save);
  check_same_run(collect(t, kSteps - 5), straight, 5);
  check_activation_memory(l, world, data().dir);
}

TEST_CASE("ZeRO-3 gathers FP8 weights in one byte: the same run bit for bit, far fewer bytes", "[mpi][fp8][zero]") {
  const World world = whole_world();
  std::vector<Layout> layouts;
  // The Llama's untied LM head in FP8 gathers in FP8 too.
  if (world.size == 2) layouts = {fp8(2, 1, 1).with_zero(3), with_head(llama_fp8(2, 1, 1).with_zero(3))};
  if (world.size == 4) layouts = {fp8(2, 2, 1).with_sp().with_zero(3), fp8(4, 1, 1).with_zero(3)};
  for (const Layout& l : layouts) {
    INFO(l.describe());
    const auto run = [&](bool fp8_gather, double* gathered_bytes) {
      CpuOps ops;
      Trainer t(parity_config(l.with([&](Layout& x) { x.fp8_gather = fp8_gather; }), data().dir), world, ops);
      const double before = t.comm_stats().bytes[static_cast<int>(CommKind::all_gather)];
      RunResult r = collect(t, kSteps);
      *gathered_bytes = t.comm_stats().bytes[static_cast<int>(CommKind::all_gather)] - before;
      return r;
    };
    double fp8_bytes = 0, plain_bytes = 0;
    const RunResult with = run(true, &fp8_bytes);  // in this order on every rank: each run is collective
    check_same_run(with, run(false, &plain_bytes));
    // The blocks' weights are most of what ZeRO-3 gathers (the embeddings, norms and biases stay
    // fp32 here): one byte instead of four takes the gathers well under half. (Under tp + SP the
    // tokens' all-gathers count too: bytes are checked without tp.)
    if (l.tp > 1) continue;
    INFO("all-gathered bytes: FP8 weights " << fp8_bytes << ", fp32 " << plain_bytes);
    CHECK(fp8_bytes < 0.5 * plain_bytes);
    CHECK(fp8_bytes > 0.25 * plain_bytes);  // a quarter is the floor: the weights alone, in one byte
  }
}

TEST_CASE("the FP8 gather casts each weight with the whole weight's scale, across its shards", "[mpi][fp8][zero]") {
  const World world = whole_world();
  const RunConfig cfg = parity_config(fp8(world.size, 1, 1).with_zero(3), data().dir);
  const ParamTable table = build_param_table(cfg.model);
  const ShardLayout layout(table, 3, world.size, world.rank, bucket_cap_elements(cfg.parallel.grad_bucket_mb));
  CpuOps ops;
  ParamStore store(table, layout, ops);
  std::vector<float> host = random_floats(table.total_numel(), 31);
  // Block 0's MLP up-projection spans two shards: the part the first of them holds is 2^-16 of
  // the rest, so that the whole weight's scale puts it among e4m3's subnormals and a scale of its
  // own would not.
  const Bucket& b = layout.bucket_of_layer(0);
  const size_t q = layout.piece_numel(b);
  const ParamSpec& up = table.get(describe_architecture(cfg.model).tensor_names(ParamRole::mlp_up, 0).at(0));
  const size_t first = up.offset - b.begin, last = first + up.numel;
  REQUIRE(first / q != (last - 1) / q);
  const size_t tiny_end = std::min(last, (first / q + 1) * q);
  for (size_t i = first; i < tiny_end; i++) host[b.begin + i] *= 1.0f / 65536;
  store.load_master(host.data());
  const auto shard = make_group_comm(everyone(world.size), world, ops);
  LocalComm one(0, ops);
  ParamGather gather(store, ops, *shard);
  const std::vector<bool> fp8 = fp8_gathered_params(table, cfg);
  gather.enable_fp8(fp8, one);
  gather.acquire(0);
  Buffers buf(ops);
  for (size_t i = 0; i < table.specs().size(); i++) {
    const ParamSpec& p = table.specs()[i];
    if (p.layer != 0) continue;
    INFO(p.name << (fp8[i] ? " (FP8)" : ""));
    const std::vector<float> want(host.begin() + p.offset, host.begin() + p.offset + p.numel);
    std::vector<float> got(p.numel);
    ops.download(got.data(), DType::f32, store.param(p), p.numel);
    if (!fp8[i]) {
      CHECK(got == want);  // norms and biases travel as they are
      continue;
    }
    float amax = 0;
    for (float v : want) amax = std::max(amax, std::fabs(v));
    const int k = fp8_scale_exponent(amax, Fp8Format::e4m3);
    size_t differs = 0;
    for (size_t e = 0; e < p.numel; e++) {
      const float quantised = std::ldexp(fp8_decode(fp8_encode(std::ldexp(want[e], k), Fp8Format::e4m3), Fp8Format::e4m3), -k);
      REQUIRE(got[e] == quantised);
      differs += got[e] != want[e];
    }
    CHECK(differs > p.numel / 2);  // really quantised
  }
  gather.release(0);
}

TEST_CASE("the FP8 gather's buffers are in the memory plan (ZeRO-3, dp over every rank)", "[mpi][fp8][zero][memory]") {
  const World world = whole_world();
  const RunConfig cfg = parity_config(fp8(world.size, 1, 1).with_zero(3), data().dir);
  const ParamTable table = build_param_table(cfg.model);
  const MemoryPlan plan = plan_stage_memory(cfg, table, DType::f32).at(0).plan;
  const ShardLayout layout(table, 3, world.size, world.rank, bucket_cap_elements(cfg.parallel.grad_bucket_mb));
  const size_t scratch = ParamGather::fp8_scratch_bytes(layout, table, fp8_gathered_params(table, cfg), DType::f32, 1);
  REQUIRE(scratch > 0);
  const size_t embeddings = sizeof(float) * layout.bucket_of_layer(layout.first_layer()).padded;
  CpuOps ops;
  {
    Trainer t(cfg, world, ops);
    t.step();
    // As mpi_zero.cpp's ZeRO-3 case: between steps only the gathered layers and the gradient
    // buffers are gone; the FP8 gather's buffers stay.
    const size_t working = plan.params_working - scratch + plan.grads_working - sizeof(float) * layout.largest_piece_numel();
    CHECK(ops.memory_use().live == plan.total() - working);
    CHECK(ops.memory_use().peak == plan.total() - embeddings);
  }
  CHECK(ops.memory_use().live == 0);
}
