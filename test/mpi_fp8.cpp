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
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "core/dist/local_comm.h"
#include "core/dist/process_groups.h"
#include "core/parallel/fp8_linear.h"
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

const RunResult& reference(const std::string& arch = "gpt2", const std::string& recipe = "tensorwise") {
  static const RunResult gpt2 = train(fp8(1, 1, 1), World{}, data().dir);
  static const RunResult llama = train(llama_fp8(1, 1, 1), World{}, data().dir);
  static const RunResult rowwise = train(fp8(1, 1, 1).with_fp8("rowwise"), World{}, data().dir);
  if (recipe == "rowwise") return rowwise;
  return arch == "gpt2" ? gpt2 : llama;
}

void check(const Layout& l, const World& world) {
  REQUIRE((l.arch == "gpt2" || l.fp8 == "tensorwise"));  // the references this file has
  check_trains_like(l, world, data().dir, reference(l.arch, l.fp8));
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
    whole.forward(ry, ref.f32(x), false, ref.f32(wt), Tensor{}, N, IC, OC);
    whole.backward(rdx, rdw, Tensor{}, ref.f32(dy), false, ref.f32(x), false, ref.f32(wt), N, IC, OC);

    Fp8Linear part(ops, one, cp.get(), Fp8Format::e4m3, rowwise);
    Buffers bufs(ops);
    const Tensor tx = bufs.f32(rows_of(x, IC, r * Nl, Nl)), tw = bufs.f32(wt), tdy = bufs.f32(rows_of(dy, OC, r * Nl, Nl));
    Tensor y = bufs.zeros(size_t(Nl) * OC), dx = bufs.zeros(size_t(Nl) * IC), dw = bufs.zeros(wt.size());
    part.forward(y, tx, false, tw, Tensor{}, Nl, IC, OC);
    part.backward(dx, dw, Tensor{}, tdy, false, tx, false, tw, Nl, IC, OC);
    // Relative only: the first rank's dx is 2^-16 of the rest.
    require_close(bufs.read(y), rows_of(ref.read(ry), OC, r * Nl, Nl), 0.0, 1e-5, "y");
    require_close(bufs.read(dx), rows_of(ref.read(rdx), IC, r * Nl, Nl), 0.0, 1e-5, "dx");
    // dW is this rank's tokens' share; summed over the cp ranks it is the whole.
    cp->all_reduce(dw);
    require_close(bufs.read(dw), ref.read(rdw), 1e-6, 1e-5, "dw summed over cp");
  }
}

TEST_CASE("FP8 changes the one-rank run by the formats' rounding, and it still trains", "[mpi][fp8]") {
  const RunResult& with_fp8 = reference();
  const RunResult without = train(grid(1, 1, 1), World{}, data().dir);
  REQUIRE(with_fp8.steps.size() == without.steps.size());
  // Step 1's loss is the initial weights' in both (the FP8 forward rounds it a little); later
  // steps differ by more than float order (so FP8 really ran) and far less than the loss itself.
  const double first = std::fabs(with_fp8.steps[0].loss - without.steps[0].loss) / without.steps[0].loss;
  const double last = std::fabs(with_fp8.steps.back().loss - without.steps.back().loss) / without.steps.back().loss;
  CHECK(first < 1e-2);
  CHECK(last > 1e-6);
  CHECK(last < 5e-2);
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
  const RunResult r = collect(t, kSteps - 5);
  for (size_t s = 0; s < r.steps.size(); s++) {
    INFO("step " << s + 6);
    CHECK(r.steps[s].loss == straight.steps[s + 5].loss);
    CHECK(r.steps[s].grad_norm == straight.steps[s + 5].grad_norm);
  }
  CHECK(r.weights == straight.weights);
  CHECK(r.val_loss == straight.val_loss);
}

TEST_CASE("activation recompute changes no bit under FP8 (tp2 x cp2)", "[mpi][fp8][recompute]") {
  const World world = whole_world();
  if (world.size != 4) return;
  check_recompute_is_bitwise(fp8(1, 2, 2).with_sp(), world, data().dir, 3);
}
