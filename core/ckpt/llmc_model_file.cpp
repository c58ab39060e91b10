#include "core/ckpt/llmc_model_file.h"

#include <bit>
#include <cstring>
#include <filesystem>

#include "core/ckpt/checkpoint_reader.h"
#include "core/ckpt/durable_io.h"
#include "core/ckpt/imported_checkpoint.h"
#include "core/ckpt/vocab_padding.h"
#include "core/model/param_table.h"

namespace pt::ckpt {

namespace fs = std::filesystem;

std::vector<std::string> llmc_param_order(int n_layers) {
  static const char* per_layer[] = {"ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                                    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                                    "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  std::vector<std::string> order = {"wte", "wpe"};
  for (const char* t : per_layer)
    for (int l = 0; l < n_layers; l++) order.push_back("h." + std::to_string(l) + "." + t);
  order.push_back("ln_f.weight");
  order.push_back("ln_f.bias");
  return order;
}

uint16_t f32_to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds to nearest and breaks ties toward an even
  // result; a carry into the exponent is the correct rounding (up to infinity at the top).
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float bf16_to_f32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

namespace {

ModelSection model_from_header(const int32_t* h, const std::string& path) {
  ModelSection m;
  m.arch = "gpt2";
  m.max_seq_len = h[2];
  m.vocab_size = h[3];
  m.n_layers = h[4];
  m.n_heads = h[5];
  m.d_model = h[6];
  m.padded_vocab = h[7];
  if (m.max_seq_len < 1 || m.vocab_size < 1 || m.n_layers < 1 || m.n_heads < 1 || m.d_model < 1 ||
      m.d_model % m.n_heads != 0 || m.padded_vocab < m.vocab_size)
    throw RuntimeError(path + ": the llm.c header describes no valid GPT-2 (max_seq_len " +
                       std::to_string(h[2]) + ", vocab " + std::to_string(h[3]) + ", layers " + std::to_string(h[4]) +
                       ", heads " + std::to_string(h[5]) + ", channels " + std::to_string(h[6]) + ", padded vocab " +
                       std::to_string(h[7]) + ")");
  m.pad_vocab_multiple = pad_multiple_for(m.vocab_size, m.padded_vocab);
  return m;
}

}  // namespace

LlmcFileInfo read_llmc_header(const std::string& path) {
  const FileReader f(path);
  const uint64_t size = f.size();
  if (size < kLlmcHeaderBytes)
    throw RuntimeError(path + " is " + std::to_string(size) + " bytes, shorter than an llm.c header (1024 bytes)");
  int32_t h[256];
  f.read(0, h, sizeof h);
  if (h[0] != kLlmcModelMagic)
    throw RuntimeError(path + " is not an llm.c model file (magic " + std::to_string(h[0]) + ", expected " +
                       std::to_string(kLlmcModelMagic) + ")");
  LlmcFileInfo info;
  if (h[1] == kLlmcVersionF32) info.dtype = LlmcDtype::f32;
  else if (h[1] == kLlmcVersionBf16) info.dtype = LlmcDtype::bf16;
  else
    throw RuntimeError(path + ": llm.c model file version " + std::to_string(h[1]) +
                       " is not supported (3: fp32, 5: bf16)");
  info.model = model_from_header(h, path);
  const ParamTable table = build_param_table(info.model);
  const uint64_t want = kLlmcHeaderBytes + table.total_numel() * (info.dtype == LlmcDtype::f32 ? 4 : 2);
  if (size != want)
    throw RuntimeError(path + " is " + std::to_string(size) + " bytes; its header describes " +
                       std::to_string(table.total_numel()) + " parameters, i.e. " + std::to_string(want) + " bytes");
  return info;
}

std::string export_llmc(const std::string& checkpoint, const std::string& out_file, LlmcDtype dtype) {
  const std::string dir = resolve_checkpoint_path(checkpoint, "convert --from " + checkpoint);
  CheckpointReader r(dir);
  const ModelSection m = model_from_manifest(r.manifest(), dir);
  if (m.arch != "gpt2") throw ConfigError("convert: llm.c files hold GPT-2 models; " + dir + " is " + m.arch);
  const ParamTable table = build_param_table(m);

  int32_t h[256] = {};
  h[0] = kLlmcModelMagic;
  h[1] = dtype == LlmcDtype::f32 ? kLlmcVersionF32 : kLlmcVersionBf16;
  h[2] = m.max_seq_len;
  h[3] = m.vocab_size;
  h[4] = m.n_layers;
  h[5] = m.n_heads;
  h[6] = m.d_model;
  h[7] = m.padded_vocab;

  // Written to a temp name and renamed, so an interrupted export never leaves a short file
  // that llm.c would then refuse with a less helpful message.
  const std::string tmp = out_file + ".tmp";
  try {
    FileWriter out(tmp);
    out.write(h, sizeof h);
    std::vector<float> buf;
    std::vector<uint16_t> half;
    for (const auto& name : llmc_param_order(m.n_layers)) {
      const ParamSpec& p = table.get(name);
      buf.resize(p.numel);
      r.read_all("master/" + name, p.numel, buf.data());
      if (dtype == LlmcDtype::f32) {
        out.write(buf.data(), buf.size() * sizeof(float));
      } else {
        half.resize(p.numel);
        for (size_t i = 0; i < p.numel; i++) half[i] = f32_to_bf16(buf[i]);
        out.write(half.data(), half.size() * sizeof(uint16_t));
      }
    }
    out.sync_and_close();
    rename_path(tmp, out_file);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  return dir;
}

std::string import_llmc(const std::string& in_file, const std::string& out_dir) {
  const LlmcFileInfo info = read_llmc_header(in_file);
  refuse_nonempty_import_target(out_dir);

  const ParamTable table = build_param_table(info.model);
  std::vector<float> weights(table.total_numel());
  {
    const FileReader f(in_file);
    uint64_t offset = kLlmcHeaderBytes;
    std::vector<uint16_t> half;
    for (const auto& name : llmc_param_order(info.model.n_layers)) {
      const ParamSpec& p = table.get(name);
      float* dst = weights.data() + p.offset;
      if (info.dtype == LlmcDtype::f32) {
        f.read(offset, dst, p.numel * sizeof(float));
        offset += p.numel * sizeof(float);
      } else {
        half.resize(p.numel);
        f.read(offset, half.data(), p.numel * sizeof(uint16_t));
        offset += p.numel * sizeof(uint16_t);
        for (size_t i = 0; i < p.numel; i++) dst[i] = bf16_to_f32(half[i]);
      }
    }
  }

  return write_imported_checkpoint(out_dir, info.model, table, weights, in_file);
}

}  // namespace pt::ckpt
