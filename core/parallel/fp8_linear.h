// FP8 linear layers (precision.fp8): a layer's product in FP8 with power-of-two scales, as
// torchtitan's Float8Linear recipes with round_scales_to_power_of_2 (core/common/fp8.h says why
// powers of two):
//   "tensorwise": one scale per tensor;
//   "rowwise":    one scale per row of each operand as the product takes it (K-major): per token
//                 and per output feature forward, per token and per input feature for dinp, per
//                 output and per input feature for dw. Finer scales, a little more accuracy,
//                 scale vectors instead of scalars (cuBLASLt's outer-vector scale mode);
//   "delayed":    one scale per tensor, from the tensor's amaxes of earlier steps
//                 (core/parallel/fp8_delayed.h, set_delayed): no amax pass or amax gather per
//                 product; the casts record the amaxes for the next steps.
//
//   forward:  out  = q4(x) @ q4(w)^T           (+ bias)
//   backward: dinp = qg(dout) @ q4(w)           dw += qg(dout)^T @ q4(x)      dbias += sum dout
// q4: e4m3 (weights and activations), qg: the gradient format (e5m2 by default, or e4m3), each
// scaled by amaxes taken at the time of the product (dynamic scaling: nothing carries from step
// to step, so checkpoints hold no FP8 state), or under delayed scaling by its history's.
// Products sum in fp32; outputs are in the compute dtype (weight gradients in theirs).
//
// Every dynamic scale covers the WHOLE of what it scales, whatever the layout: a rank that holds only
// part of a tensor (or of a row) gathers the other parts' amaxes (a max is exact and order-free)
// before it scales, so every layout quantises exactly as one rank running the same micro-batch
// would, and the layout parity tests hold with FP8 as they do without. The parts are:
//  - context parallel: each cp rank holds T / cp tokens of every sequence, so an amax that runs
//    over tokens (tensorwise, and rowwise for dw's per-feature rows) gathers over cp;
//  - tensor parallel: weights are split over tp (a column-parallel layer's rows, a row-parallel
//    layer's columns); so are a row-parallel layer's input features and a column-parallel
//    layer's output gradient's; a column-parallel input and a row-parallel output gradient are
//    whole on every tp rank (replicated, or gathered under sequence parallel). An amax that runs
//    over a split dimension gathers over tp.
// Data-parallel ranks run different micro-batches, which one rank runs one after another, each
// with its own scales: nothing gathers over dp. Each gather is one small all-gather per group.
//
// The operands are quantised in the layout the tensor cores take (both K-major), so backward
// quantises dout, w and x transposed; backward re-derives each scale from the same tensor as
// forward did (the weights do not change in between) instead of keeping forward's codes.
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "core/common/fp8.h"
#include "core/config/run_config.h"
#include "core/dist/comm.h"
#include "core/ops/ops.h"
#include "core/parallel/fp8_delayed.h"

namespace pt {

// The layers precision.fp8_layers can put in FP8, in fp8_layer_names() order: a block's four
// linear layers, the LM head (the model's one), the routed experts of sparse blocks (their
// up and down projections; delayed scaling only, core/model/moe_layer.h says why), and the
// blocks' attention itself (its forward's products; core/common/fp8_attention.h: its own
// per-head dynamic scales under every recipe, so it has no site and no history).
enum class Fp8Layer { qkv, attn_out, mlp_up, mlp_down, lm_head, experts, attention };
constexpr int kFp8BlockLayers = 4;
constexpr int kFp8Layers = 7;

// Which layers run in FP8, and the gradients' format.
struct Fp8Recipe {
  // By Fp8Layer: qkv (attention's input projection), attn_out (its output projection), mlp_up
  // (the dense MLP's up and gate projection, or the shared experts'), mlp_down (its down
  // projection), lm_head (the LM head, with its chunked cross-entropy), experts (each routed
  // expert's up and down projections), attention (the blocks' attention forward).
  std::array<bool, kFp8Layers> layers{};
  Fp8Format grad = Fp8Format::e5m2;
  bool rowwise = false;  // the "rowwise" recipe
  bool delayed = false;  // the "delayed" recipe; neither: "tensorwise"
  int amax_history = 16;  // delayed: steps of amaxes kept (precision.fp8_amax_history)
  bool on(Fp8Layer layer) const { return layers[static_cast<size_t>(layer)]; }
  // Whether some block layer is in FP8.
  bool blocks() const {
    const auto end = layers.begin() + kFp8BlockLayers;
    return std::find(layers.begin(), end, true) != end;
  }
  bool any() const { return std::find(layers.begin(), layers.end(), true) != layers.end(); }
};

// A pipeline chunk's FP8 sites (the layers delayed scaling keeps amaxes for), numbered in this
// order: each block's four layers (kFp8BlockLayers a block, in Fp8Layer order, whether in FP8 or
// not), the LM head's when the chunk has it in FP8, then each sparse block's routed experts, two
// sites an expert (up, down), for every expert of the model (a rank under expert parallel runs
// some of them, but every rank of the stage merges the same sites).
struct Fp8Sites {
  int blocks = 0;      // the chunk's blocks
  bool head = false;   // the LM head has a site
  int sparse = 0;      // the chunk's sparse blocks whose experts have sites
  int experts = 0;     // routed experts a sparse block has
  int count() const { return lm_head() + (head ? 1 : 0) + sparse * experts * 2; }
  int block(int b, Fp8Layer layer) const { return b * kFp8BlockLayers + static_cast<int>(layer); }
  int lm_head() const { return blocks * kFp8BlockLayers; }
  // Sparse block s (of the chunk's, in order), expert e, its up or down projection.
  int expert(int s, int e, bool down) const {
    return lm_head() + (head ? 1 : 0) + (s * experts + e) * 2 + (down ? 1 : 0);
  }
};


// Which FP8 layer a product is, if any: `index` numbers a pipeline chunk's FP8 layers (delayed
// scaling keeps each one's amaxes, Fp8Delayed's sites); -1: the product runs in the compute dtype.
struct Fp8Site {
  int index = -1;
  bool on() const { return index >= 0; }
};

// The layer names precision.fp8_layers takes, in Fp8Layer order.
const std::vector<std::string>& fp8_layer_names();
// precision.fp8_layers: a comma-separated list of those names and "all" (a block's four linear
// layers), each layer at most once: "all" is the default, "all,lm_head,experts,attention" adds
// the LM head, the routed experts and attention.
// Throws ConfigError naming what is wrong. The recipe's layers set; grad left at its default.
Fp8Recipe parse_fp8_layers(const std::string& layers);
// The recipe of precision.fp8 ("off", "tensorwise", "rowwise", "delayed") / fp8_layers /
// fp8_grad_format / fp8_amax_history (no layer when fp8 is "off").
Fp8Recipe fp8_recipe(const std::string& fp8, const std::string& layers, const std::string& grad_format,
                     int amax_history = 16);
Fp8Recipe fp8_recipe(const PrecisionSection& precision);
// The names of the layers `r` puts in FP8, in fp8_layer_names() order, joined by `separator`.
std::string fp8_layer_list(const Fp8Recipe& r, const std::string& separator);

class Fp8Linear {
 public:
  // tp: the tensor-parallel group (a group of one without tp); cp: the context-parallel group,
  // nullptr without cp. Neither is owned.
  Fp8Linear(Ops& ops, Comm& tp, Comm* cp, Fp8Format grad_format, bool rowwise = false);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // A layer's shape as its product sees it: x [rows, in], w [out, in]; rows 0: the call's N
  // (the LM head's products take one chunk of rows at a time).
  struct Shape {
    size_t in = 0, out = 0, rows = 0;
  };
  // Bytes the FP8 scratch holds once every layer of `shapes` has run forward and backward over
  // its rows (N where not set): each operand's codes (one byte an element), plain and transposed, and its scales and
  // gathered amaxes, at the largest layer's size (they grow on first use). The memory plan
  // counts them.
  static size_t scratch_bytes(size_t N, const std::vector<Shape>& shapes, int tp, int cp, bool rowwise);
  // Allocates the scratch scratch_bytes(N, shapes, ...) counts now instead of on first use (for a
  // layer whose products' sizes vary from call to call, so that what it holds is its plan).
  void reserve(size_t N, const std::vector<Shape>& shapes);
  // The GPU's FP8 products (cuBLASLt) take dimensions that are multiples of 16: every layer's
  // in and out widths and the N tokens of a micro-batch on this rank (the weight gradient's
  // inner dimension). Throws ConfigError naming the one that is not, and the setting behind it.
  static void check_gpu_shapes(size_t N, const std::vector<Shape>& shapes);

  // Delayed scaling: the products' scales come from `state` (not owned; tensorwise only), a
  // product's site from the call. nullptr: dynamic scaling again.
  void set_delayed(Fp8Delayed* state);
  // Delayed scaling without a product: records t [rows, cols]'s amax as the site's operand `o`
  // (a cast into the scratch, whose codes are dropped): for a layer that runs in the compute
  // dtype until its history exists (the routed experts, core/model/moe_layer.h).
  void record_only(Tensor t, int rows, int cols, Fp8Site site, Fp8Delayed::Operand o);

  // out [N, OC] = x [N, IC] @ w [OC, IC]^T + bias [OC] (may be null). x_split: x's columns are
  // this tp rank's share of the features (a row-parallel layer's input). site: the layer's
  // (delayed scaling's state; unused otherwise).
  void forward(Tensor out, Tensor x, bool x_split, Tensor w, Tensor bias, int N, int IC, int OC, Fp8Site site);
  // dinp [N, IC] = dout @ w (overwritten; may be null), dw += dout^T @ x (may be null),
  // dbias += the column sums of dout (may be null). dout_split: dout's columns are this tp
  // rank's share (a column-parallel layer's output gradient).
  void backward(Tensor dinp, Tensor dw, Tensor dbias, Tensor dout, bool dout_split, Tensor x, bool x_split,
                Tensor w, int N, int IC, int OC, Fp8Site site);

 private:
  enum Slot { kX, kW, kDout, kDoutT, kXT, kWT, kSlots };
  struct Quantized {
    Tensor codes, scale_inv;
  };
  // How this rank's part of a tensor [rows, cols] sits in the whole: which dimensions are split
  // over tp, and whether its rows (tokens) are split over cp.
  struct Split {
    bool rows_tp = false, cols_tp = false, rows_cp = false;
  };
  // The largest magnitudes of every part of what each scale covers: `count` blocks (one per
  // rank holding a part) of `len` floats (1 tensorwise, else one per row of the operand).
  struct Amaxes {
    Tensor values;
    int count = 0, len = 0;
  };
  // t [rows, cols]'s amaxes for the operand it makes (t, or t transposed), taken in `slot`'s
  // floats and gathered over the groups that split what each amax runs over.
  Amaxes gather_amax(Slot slot, Tensor t, int rows, int cols, bool transpose, Split split);
  // The amaxes the operand scales by: its history's under delayed scaling (once there is one),
  // else gather_amax's.
  Amaxes scale_amaxes(Slot slot, Fp8Site site, Fp8Delayed::Operand o, Tensor t, int rows, int cols, bool transpose,
                      Split split);
  // Where a cast records the operand's amax: the site's record under delayed scaling, else none.
  Tensor record(Fp8Site site, Fp8Delayed::Operand o) const;
  // t [rows, cols] quantised into `slot`'s codes (transposed when asked) with the scales of
  // `amax` (scale_inv: the slot's first floats), its amax maxed into `record` (may be null).
  Quantized quantize(Slot slot, Tensor t, int rows, int cols, bool transpose, Fp8Format f, const Amaxes& amax,
                     Tensor record);
  // What each slot holds at the largest of `shapes` (rows N where a shape sets none): its codes
  // (one byte each; the gradient format for kDout and kDoutT, e4m3 otherwise) and the length of
  // its rowwise scales (one per row of its operand: kX and kDout per token, kW and kDoutT per
  // output feature, kXT and kWT per input feature). scratch_bytes counts them, reserve allocates.
  struct SlotSize {
    size_t codes = 0, scales = 0;
    bool grad = false;
  };
  static std::array<SlotSize, kSlots> slot_sizes(size_t N, const std::vector<Shape>& shapes);
  // `slot`'s floats, grown to hold scales and gathered amaxes of `len` each: [scale_inv, padded
  // to 16 bytes][amaxes: cp x tp blocks of len].
  Tensor meta(Slot slot, int len);

  Ops& ops_;
  Comm& tp_;
  Comm* cp_;
  Fp8Format grad_;
  bool rowwise_;
  Fp8Delayed* delayed_ = nullptr;
  Tensor codes_[kSlots];
  Tensor meta_[kSlots];
};

}  // namespace pt
