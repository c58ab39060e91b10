// The rules that involve several keys, and the derived values. Each key's own rule (ranges,
// allowed names) was already checked from the table in config_keys.cpp, so every value here
// is at least 1 where a size is meant; products are still computed saturating in int64 so a
// silly config gives a message, not an overflow.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/common/error.h"
#include "core/config/config_keys.h"
#include "core/parallel/fp8_linear.h"

namespace pt::config {
namespace {

template <class... A>
std::string cat(const A&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

[[noreturn]] void fail(const std::string& msg) { throw ConfigError(msg); }

int64_t mul(int64_t a, int64_t b) {
  constexpr int64_t max = std::numeric_limits<int64_t>::max();
  return (a != 0 && b > max / a) ? max : a * b;
}

// A derived key may be given (a resolved config is read back), but then it must agree:
// a stale value would silently mean something else than the keys it is derived from.
void check_derived(const std::string& key, int64_t given, int64_t derived, const std::string& how) {
  if (given != 0 && given != derived)
    fail(cat(key, "=", given, " does not match the derived value ", derived, " (", how,
             "); remove the key or set it to 0 to derive it"));
}

// The Llama-family keys: checked against the architecture, then resolved to the values the
// model is built with, so the resolved config says exactly what was trained.
void check_architecture(ModelSection& m) {
  const bool llama = m.is_llama();
  // A key the architecture has no use for is an error: silently ignoring it would train another
  // model than the one the user described. GPT-2's own values are accepted (a resolved GPT-2
  // config reads back).
  const auto gpt2_fixed = [&](const char* key, bool given, const std::string& gpt2_value) {
    if (!llama && given)
      fail(cat("model.", key, " does not apply to model.arch=\"gpt2\" (", gpt2_value,
               "); remove it, or use model.arch=\"llama\""));
  };
  gpt2_fixed("n_kv_heads", m.n_kv_heads != 0 && m.n_kv_heads != m.n_heads, "GPT-2 is multi-head: n_kv_heads = n_heads");
  gpt2_fixed("ffn_hidden", m.ffn_hidden != 0 && m.ffn_hidden != 4 * m.d_model, "GPT-2's MLP is 4*d_model wide");
  gpt2_fixed("ffn_multiple_of", m.ffn_multiple_of != 0, "it rounds Llama's MLP width");
  gpt2_fixed("ffn_dim_multiplier", m.ffn_dim_multiplier != 0, "it scales Llama's MLP width");
  gpt2_fixed("norm_eps", m.norm_eps != 0 && m.norm_eps != 1e-5, "GPT-2's LayerNorm eps is 1e-5");
  gpt2_fixed("rope_theta", m.rope_theta != 0, "GPT-2 learns its positions");
  gpt2_fixed("tie_embeddings", m.tie_embeddings == false, "GPT-2's LM head is its token embedding");
  if (m.n_kv_heads != 0 && m.n_heads % m.n_kv_heads != 0)
    fail(cat("model.n_kv_heads=", m.n_kv_heads, " must divide model.n_heads=", m.n_heads,
             " (each key/value head serves n_heads/n_kv_heads query heads)"));
  if (llama && m.head_dim() % 2 != 0)
    fail(cat("model.d_model/n_heads = ", m.d_model, "/", m.n_heads, " = ", m.head_dim(),
             " must be even for RoPE (it rotates pairs of dimensions)"));
  // Resolve: what the model is built with.
  m.n_kv_heads = m.kv_heads();
  m.ffn_hidden = m.ffn_width();
  m.norm_eps = m.eps();
  m.tie_embeddings = m.tied();
  if (llama) {
    if (m.ffn_multiple_of == 0) m.ffn_multiple_of = 256;
    if (m.ffn_dim_multiplier == 0) m.ffn_dim_multiplier = 1.0;
    m.rope_theta = m.rope_base();
  }
}

// Mixture of experts (the moe section): Mixtral's sparse block is a Llama block whose MLP is a
// set of SwiGLU experts, so it needs the Llama architecture.
void check_moe(ModelSection& m) {
  MoeSection& e = m.moe;
  if (!e.enabled()) return;
  if (!m.is_llama())
    fail(cat("moe.n_experts=", e.n_experts, " needs model.arch=\"llama\" (the experts are SwiGLU MLPs in a Llama ",
             "block, as in Mixtral); model.arch=\"", m.arch, "\""));
  if (e.top_k > e.n_experts)
    fail(cat("moe.top_k=", e.top_k, " must be <= moe.n_experts=", e.n_experts));
  if (e.every > m.n_layers)
    fail(cat("moe.every=", e.every, " must be <= model.n_layers=", m.n_layers,
             " (block l is sparse when (l + 1) % every == 0; no block would be)"));
  if (e.expert_hidden == 0) e.expert_hidden = m.ffn_width();
}

void check_model(RunConfig& c) {
  auto& m = c.model;
  if (m.d_model % m.n_heads != 0)
    fail(cat("model.d_model=", m.d_model, " must be divisible by model.n_heads=", m.n_heads));
  int64_t padded = mul((int64_t(m.vocab_size) + m.pad_vocab_multiple - 1) / m.pad_vocab_multiple, m.pad_vocab_multiple);
  if (padded > std::numeric_limits<int>::max())
    fail(cat("model.pad_vocab_multiple=", m.pad_vocab_multiple, " pads model.vocab_size=", m.vocab_size,
             " to ", padded, ", beyond a 32-bit integer"));
  check_derived("model.padded_vocab", m.padded_vocab, padded,
                cat("model.vocab_size=", m.vocab_size, " rounded up to a multiple of model.pad_vocab_multiple=",
                    m.pad_vocab_multiple));
  m.padded_vocab = int(padded);
  check_architecture(m);
  check_moe(m);
  if (c.batch.seq_len > m.max_seq_len)
    fail(cat("batch.seq_len=", c.batch.seq_len, " must be <= model.max_seq_len=", m.max_seq_len));
}

// dp*tp*pp*cp must tile the world exactly; dp=-1 takes whatever tp*pp*cp leaves.
void resolve_dp(RunConfig& c) {
  auto& p = c.parallel;
  if (c.world_size < 1) fail(cat("the world size ", c.world_size, " must be >= 1"));
  int64_t model_ranks = mul(mul(p.tp, p.pp), p.cp);
  if (p.dp == -1) {
    if (c.world_size % model_ranks != 0)
      fail(cat("parallel.dp=-1 cannot be derived: the world size ", c.world_size,
               " is not divisible by parallel.tp*pp*cp = ", p.tp, "*", p.pp, "*", p.cp, " = ", model_ranks));
    p.dp = int(c.world_size / model_ranks);
  }
  int64_t ranks = mul(p.dp, model_ranks);
  if (ranks != c.world_size)
    fail(cat("parallel.dp*tp*pp*cp = ", p.dp, "*", p.tp, "*", p.pp, "*", p.cp, " = ", ranks,
             " must equal the world size ", c.world_size));
  // Expert parallel: the routed experts are split over groups of ep data-parallel ranks.
  if (p.ep > 1 && !c.model.moe.enabled())
    fail(cat("parallel.ep=", p.ep, " needs experts to split: set moe.n_experts (or parallel.ep=1)"));
  if (p.dp % p.ep != 0)
    fail(cat("parallel.ep=", p.ep, " must divide parallel.dp=", p.dp,
             " (expert parallel groups are made of data-parallel ranks)"));
  if (c.model.moe.enabled() && c.model.moe.n_experts % p.ep != 0)
    fail(cat("parallel.ep=", p.ep, " must divide moe.n_experts=", c.model.moe.n_experts,
             " (each expert-parallel rank runs n_experts/ep experts)"));
  // HSDP: the dp replicas form dp_replicate groups of dp/dp_replicate ranks that shard ZeRO state.
  if (p.dp % p.dp_replicate != 0)
    fail(cat("parallel.dp_replicate=", p.dp_replicate, " must divide parallel.dp=", p.dp,
             " (HSDP: dp = dp_replicate * dp_shard, ZeRO shards over the dp_shard ranks)"));
  // An ep group lies inside one HSDP replica, so the experts' replicas are the dense part's.
  if (p.ep > 1 && p.dp_replicate > 1 && (p.dp / p.dp_replicate) % p.ep != 0)
    fail(cat("parallel.ep=", p.ep, " must divide dp_shard = parallel.dp/parallel.dp_replicate = ",
             p.dp / p.dp_replicate, " (an expert-parallel group lies within one HSDP replica)"));
}

// Megatron-style splits: heads, the MLP width and the vocabulary are cut across TP ranks,
// and with sequence parallelism so is the sequence between the TP regions.
void check_tensor_parallel(const RunConfig& c) {
  const auto& p = c.parallel;
  const auto& m = c.model;
  if (m.n_heads % p.tp != 0) fail(cat("parallel.tp=", p.tp, " must divide model.n_heads=", m.n_heads));
  // Each tp rank holds whole key/value heads (a head split over ranks would need their scores
  // summed); with fewer K/V heads than ranks Megatron replicates them, which picotrain does not.
  if (m.kv_heads() % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide model.n_kv_heads=", m.kv_heads(),
             " (each tensor-parallel rank holds whole key/value heads)"));
  // GPT-2's MLP width 4*d_model is split already when tp | n_heads | d_model; Llama's need not be.
  if (m.ffn_width() % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide the MLP width model.ffn_hidden=", m.ffn_width()));
  const int64_t shared_width = mul(m.moe.n_shared_experts, m.moe.expert_hidden);
  if (m.moe.enabled() && shared_width % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide the shared experts' width moe.n_shared_experts*expert_hidden = ",
             m.moe.n_shared_experts, "*", m.moe.expert_hidden, " = ", shared_width,
             " (they are one tensor-parallel SwiGLU; the routed experts are not split by tp)"));
  if (m.padded_vocab % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide model.padded_vocab=", m.padded_vocab,
             " (choose model.pad_vocab_multiple as a multiple of tp)"));
  if (p.sequence_parallel && c.batch.seq_len % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide batch.seq_len=", c.batch.seq_len,
             " when parallel.sequence_parallel=true"));
  // Under context parallel a rank holds seq_len/cp tokens of each sequence; sequence parallel
  // splits those micro_batch_size * seq_len/cp tokens over tp.
  if (p.sequence_parallel && p.cp > 1 && c.batch.seq_len % p.cp == 0 &&
      (int64_t(c.batch.micro_batch_size) * (c.batch.seq_len / p.cp)) % p.tp != 0)
    fail(cat("parallel.tp=", p.tp, " must divide the ", int64_t(c.batch.micro_batch_size) * (c.batch.seq_len / p.cp),
             " tokens a context-parallel rank holds per micro-batch (batch.micro_batch_size x batch.seq_len / "
             "parallel.cp) when parallel.sequence_parallel=true"));
}

void check_context_parallel(const RunConfig& c) {
  const auto& p = c.parallel;
  // Zigzag load balancing gives each CP rank one early and one late chunk of the sequence.
  if (p.cp > 1 && c.batch.seq_len % (int64_t(2) * p.cp) != 0)
    fail(cat("batch.seq_len=", c.batch.seq_len, " must be divisible by 2*parallel.cp=", int64_t(2) * p.cp,
             " (zigzag context parallelism splits the sequence into 2 chunks per rank)"));
  // Ulysses trades the sequence split for a head split over the tp*cp ranks.
  int64_t tp_cp = mul(p.tp, p.cp);
  if (p.cp_impl == "ulysses" && c.model.n_heads % tp_cp != 0)
    fail(cat("parallel.tp*cp = ", p.tp, "*", p.cp, " = ", tp_cp, " must divide model.n_heads=", c.model.n_heads,
             " when parallel.cp_impl=\"ulysses\""));
  if (p.cp_impl == "ulysses" && c.model.kv_heads() % tp_cp != 0)
    fail(cat("parallel.tp*cp = ", p.tp, "*", p.cp, " = ", tp_cp, " must divide model.n_kv_heads=",
             c.model.kv_heads(), " when parallel.cp_impl=\"ulysses\" (the all-to-all gives each rank whole K/V heads)"));
}

void check_pipeline_parallel(const RunConfig& c) {
  const auto& p = c.parallel;
  int64_t chunks = mul(p.pp, p.pp_virtual_stages);
  if (p.pp_layers.empty() && c.model.n_layers % chunks != 0)
    fail(cat("model.n_layers=", c.model.n_layers, " must be divisible by parallel.pp*pp_virtual_stages = ", p.pp,
             "*", p.pp_virtual_stages, " = ", chunks, " (or list the blocks of each stage in parallel.pp_layers)"));
  // An explicit split: one entry per virtual stage (each >= 1, checked with the key), covering
  // every block exactly once. Virtual stage s is chunk s / pp of pipeline rank s % pp.
  if (!p.pp_layers.empty()) {
    const std::string given = key_value("parallel.pp_layers", json(p.pp_layers));
    if (static_cast<int64_t>(p.pp_layers.size()) != chunks)
      fail(cat(given, " has ", p.pp_layers.size(), " entries but needs one per virtual stage: parallel.pp*",
               "pp_virtual_stages = ", p.pp, "*", p.pp_virtual_stages, " = ", chunks));
    int64_t sum = 0;
    for (int n : p.pp_layers) sum += n;
    if (sum != c.model.n_layers)
      fail(cat(given, " sums to ", sum, " blocks but model.n_layers=", c.model.n_layers));
  }
  bool interleaved = p.pp_schedule == "interleaved";
  if (interleaved && p.pp < 2)
    fail(cat("parallel.pp=", p.pp, " must be >= 2 when parallel.pp_schedule=\"interleaved\""));
  if (interleaved && p.pp_virtual_stages < 2)
    fail(cat("parallel.pp_virtual_stages=", p.pp_virtual_stages,
             " must be >= 2 when parallel.pp_schedule=\"interleaved\""));
  if (!interleaved && p.pp_virtual_stages != 1)
    fail(cat("parallel.pp_virtual_stages=", p.pp_virtual_stages, " must be 1 when parallel.pp_schedule=\"",
             p.pp_schedule, "\" (only \"interleaved\" uses virtual stages)"));
}

// One optimizer step consumes global_batch_tokens; each micro-step consumes
// micro_batch_size*seq_len tokens on each of the dp replicas (CP ranks share a sequence).
void resolve_batch(RunConfig& c) {
  auto& b = c.batch;
  int64_t per_micro_step = mul(mul(b.micro_batch_size, b.seq_len), c.parallel.dp);
  if (b.global_batch_tokens == 0) b.global_batch_tokens = per_micro_step;
  if (b.global_batch_tokens % per_micro_step != 0)
    fail(cat("batch.global_batch_tokens=", b.global_batch_tokens,
             " must be a multiple of batch.micro_batch_size*seq_len*parallel.dp = ", b.micro_batch_size, "*",
             b.seq_len, "*", c.parallel.dp, " = ", per_micro_step));
  int64_t accum = b.global_batch_tokens / per_micro_step;
  if (accum > std::numeric_limits<int>::max())
    fail(cat("batch.global_batch_tokens=", b.global_batch_tokens, " needs ", accum,
             " accumulation steps, beyond a 32-bit integer"));
  check_derived("batch.grad_accum_steps", b.grad_accum_steps, accum,
                cat("batch.global_batch_tokens / (micro_batch_size*seq_len*parallel.dp) = ", b.global_batch_tokens,
                    " / ", per_micro_step));
  b.grad_accum_steps = int(accum);
}

void check_schedule(const RunConfig& c) {
  const auto& s = c.schedule;
  if (s.warmup_steps > s.total_steps)
    fail(cat("schedule.warmup_steps=", s.warmup_steps, " must be <= schedule.total_steps=", s.total_steps));
}

// The routed experts in FP8 scale from delayed scaling's history only (core/model/moe_layer.h says
// why), and only a model with experts has them. Attention in FP8 quantises P under the running
// max of a sequence's keys in order, which ring attention's partial softmaxes cannot reproduce
// (core/common/fp8_attention.h).
void check_fp8(const RunConfig& c) {
  const auto& p = c.precision;
  if (p.fp8 == "off") return;
  const Fp8Recipe r = parse_fp8_layers(p.fp8_layers);
  if (r.on(Fp8Layer::attention) && c.parallel.cp > 1 && c.parallel.cp_impl == "ring")
    fail(cat("precision.fp8_layers=", p.fp8_layers, " names attention, which context parallelism runs only as "
             "parallel.cp_impl=\"ulysses\" (ring attention merges partial softmaxes, whose probabilities FP8 would "
             "quantise unlike one rank's): set cp_impl to ulysses, or leave attention out of fp8_layers"));
  if (!r.on(Fp8Layer::experts)) return;
  if (p.fp8 != "delayed")
    fail(cat("precision.fp8_layers=", p.fp8_layers, " names experts, which need precision.fp8=\"delayed\" (not \"",
             p.fp8, "\"): an expert's rows are other tokens under each layout, so only scales from the amax history "
             "(the largest over every rank) quantise alike under every layout"));
  if (!c.model.moe.enabled())
    fail(cat("precision.fp8_layers=", p.fp8_layers, " names experts, but the model has no routed experts "
             "(moe.n_experts is 0)"));
}

void resolve_paths(RunConfig& c) {
  namespace fs = std::filesystem;
  if (c.run.out_dir.empty()) c.run.out_dir = (fs::path("runs") / c.run.name).string();
  if (c.checkpoint.dir.empty()) c.checkpoint.dir = (fs::path(c.run.out_dir) / "checkpoints").string();
}

}  // namespace

void check_rules_and_derive(RunConfig& cfg) {
  // The model's shape and its splits first: they do not depend on how many ranks were started,
  // so `tp=3` with 12 heads is reported as that, not as a world-size mismatch.
  check_model(cfg);
  check_tensor_parallel(cfg);
  check_context_parallel(cfg);
  check_pipeline_parallel(cfg);
  resolve_dp(cfg);
  resolve_batch(cfg);
  check_schedule(cfg);
  check_fp8(cfg);
  resolve_paths(cfg);
}

}  // namespace pt::config
