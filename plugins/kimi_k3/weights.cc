#include "plugins/kimi_k3/weights.h"

#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

using kernels::QuantizedMatrix;
using kernels::WeightFormat;
using st::DType;

// Loads one tensor family into its destination; jobs touch disjoint fields.
using Job = std::function<absl::Status()>;

class Loader {
 public:
  explicit Loader(st::Snapshot& snap) : snap_(snap) {}

  // BF16 [rows, cols] → a resident matrix in `format`.
  absl::Status Matrix(const std::string& name, int64_t rows, int64_t cols, WeightFormat format,
                      Linear* out) {
    const int64_t shape[] = {rows, cols};
    COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snap_.Expect(name, DType::kBF16, shape));
    std::vector<uint16_t> raw(t->numel());
    COLI_RETURN_IF_ERROR(snap_.Read(*t, raw.data()));
    auto q = QuantizedMatrix::FromBf16(raw.data(), rows, cols, format);
    if (!q.ok()) return Annotate(q.status(), absl::StrCat("tensor '", name, "'"));
    out->m = std::move(q).value();
    return absl::OkStatus();
  }

  // Any tensor of `dtype` and `shape` as f32 values.
  absl::Status Vector(const std::string& name, DType dtype, std::vector<int64_t> shape,
                      std::vector<float>* out) {
    COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snap_.Expect(name, dtype, shape));
    COLI_ASSIGN_OR_RETURN(*out, snap_.ReadAsF32(*t));
    for (float v : *out)
      if (!std::isfinite(v))
        return absl::DataLossError(absl::StrCat("tensor '", name, "': non-finite value"));
    return absl::OkStatus();
  }

  // res_norm.weight [D] ⊙ res_proj.weight [1, D]; both BF16 so the product is exact in f32.
  absl::Status ResScore(const std::string& norm, const std::string& proj, int64_t d,
                        std::vector<float>* out) {
    std::vector<float> n, p;
    COLI_RETURN_IF_ERROR(Vector(norm, DType::kBF16, {d}, &n));
    COLI_RETURN_IF_ERROR(Vector(proj, DType::kBF16, {1, d}, &p));
    out->resize(d);
    for (int64_t i = 0; i < d; ++i) (*out)[i] = n[i] * p[i];
    return absl::OkStatus();
  }

 private:
  st::Snapshot& snap_;
};

absl::Status RunJobs(std::vector<Job>& jobs, int threads, const Weights::Progress& progress) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first_error;
  int done = 0;
  const int total = static_cast<int>(jobs.size());
  auto worker = [&] {
    while (true) {
      const size_t j = next.fetch_add(1);
      if (j >= jobs.size()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.ok()) return;
      }
      absl::Status s = jobs[j]();
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first_error.ok()) first_error = s;
      ++done;
      if (s.ok() && progress) progress(done, total);
    }
  };
  threads = std::max(1, std::min<int>(threads, total));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return first_error;
}

}  // namespace

absl::StatusOr<WeightFormat> FormatForBits(int bits, int64_t cols, const char* what) {
  switch (bits) {
    case 32: return WeightFormat::kF32;
    case 8: return WeightFormat::kInt8Row;
    case 4: return cols % 64 == 0 ? WeightFormat::kInt4G64 : WeightFormat::kInt8Row;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, "=", bits, " is not supported (use 4, 8 or 32)"));
  }
}

absl::StatusOr<std::string> DetectPrefix(const st::Snapshot& snapshot) {
  const std::string probe = "model.layers.0.input_layernorm.weight";
  if (snapshot.Contains("language_model." + probe)) return std::string("language_model.");
  if (snapshot.Contains(probe)) return std::string();
  return absl::NotFoundError(absl::StrCat("tensor 'language_model.", probe, "' (or '", probe,
                                          "'): not in the snapshot; is this a Kimi K3 checkpoint?"));
}

std::string Weights::LayerPrefix(int layer) const {
  return absl::StrCat(prefix_, "model.layers.", layer, ".");
}

absl::StatusOr<std::unique_ptr<Weights>> Weights::Load(st::Snapshot& snap, const Config& cfg,
                                                       const ModelOptions& opt,
                                                       const Progress& progress) {
  auto w = std::unique_ptr<Weights>(new Weights());
  COLI_ASSIGN_OR_RETURN(w->prefix_, DetectPrefix(snap));
  w->snapshot_ = &snap;
  const int64_t D = cfg.hidden_size;
  const int64_t V = cfg.vocab_size;
  w->hidden_ = D;
  w->vocab_ = V;
  const int L = opt.layers >= 0 ? std::min(opt.layers, cfg.num_layers) : cfg.num_layers;
  w->layers.resize(L);
  Loader ld(snap);
  std::vector<Job> jobs;
  auto matrix = [&](std::string name, int64_t rows, int64_t cols, int bits, const char* what,
                    Linear* dst) -> absl::Status {
    COLI_ASSIGN_OR_RETURN(WeightFormat f, FormatForBits(bits, cols, what));
    jobs.push_back([&ld, name, rows, cols, f, dst] { return ld.Matrix(name, rows, cols, f, dst); });
    return absl::OkStatus();
  };
  auto vec = [&](std::string name, DType dtype, std::vector<int64_t> shape, std::vector<float>* dst) {
    jobs.push_back([&ld, name, dtype, shape, dst] { return ld.Vector(name, dtype, shape, dst); });
  };

  for (int i = 0; i < L; ++i) {
    const std::string P = w->LayerPrefix(i);
    LayerWeights& lw = w->layers[i];
    lw.kda = cfg.is_kda[i];
    lw.dense = cfg.is_dense(i);
    vec(P + "input_layernorm.weight", DType::kBF16, {D}, &lw.input_norm);
    vec(P + "post_attention_layernorm.weight", DType::kBF16, {D}, &lw.post_attention_norm);
    jobs.push_back([&ld, &lw, P, D] {
      COLI_RETURN_IF_ERROR(ld.ResScore(P + "self_attention_res_norm.weight",
                                       P + "self_attention_res_proj.weight", D, &lw.attn_res_score));
      return ld.ResScore(P + "mlp_res_norm.weight", P + "mlp_res_proj.weight", D,
                         &lw.mlp_res_score);
    });
    const std::string A = P + "self_attn.";
    if (lw.kda) {
      // Spec §2.3 / §3.3. C = H·d channels; the decay bottleneck rank is head_dim (K3: 128).
      const int H = cfg.kda.num_heads, d = cfg.kda.head_dim, taps = cfg.kda.conv_size;
      const int64_t C = cfg.kda.channels();
      KdaWeights& k = lw.kda_w;
      COLI_RETURN_IF_ERROR(matrix(A + "q_proj.weight", C, D, opt.bits, "K3_BITS", &k.q_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "k_proj.weight", C, D, opt.bits, "K3_BITS", &k.k_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "v_proj.weight", C, D, opt.bits, "K3_BITS", &k.v_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "g_proj.weight", C, D, opt.bits, "K3_BITS", &k.g_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "o_proj.weight", D, C, opt.bits, "K3_BITS", &k.o_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "f_a_proj.weight", d, D, 32, "f32", &k.f_a_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "f_b_proj.weight", C, d, 32, "f32", &k.f_b_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "b_proj.weight", H, D, 32, "f32", &k.b_proj));
      vec(A + "q_conv1d.weight", DType::kF32, {C, 1, taps}, &k.q_conv);
      vec(A + "k_conv1d.weight", DType::kF32, {C, 1, taps}, &k.k_conv);
      vec(A + "v_conv1d.weight", DType::kF32, {C, 1, taps}, &k.v_conv);
      vec(A + "dt_bias", DType::kF32, {C}, &k.dt_bias);
      vec(A + "o_norm.weight", DType::kF32, {d}, &k.o_norm);
      jobs.push_back([&snap, &k, name = A + "A_log", H, d] {
        // DISAGREEMENT (spec §3.9), vendor behaviour: A_log is per head. The checkpoint stores
        // the [H] parameter zero-padded to [head_dim] (K3: 96 in 128); either length is
        // accepted and the first H entries are used.
        COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snap.Get(name));
        const bool ok_shape = t->shape.size() == 1 && (t->shape[0] == H || t->shape[0] == d);
        if (t->dtype != DType::kF32 || !ok_shape)
          return absl::DataLossError(absl::StrCat(
              "tensor '", name, "': expected F32 [", H, "] or [", d, "] (per-head A_log, ",
              "optionally zero-padded to head_dim), got ", st::DescribeTensor(t->dtype, t->shape)));
        COLI_ASSIGN_OR_RETURN(std::vector<float> a, snap.ReadAsF32(*t));
        for (size_t j = H; j < a.size(); ++j) {
          if (a[j] != 0.0f) {
            COLI_LOG(kWarning) << "tensor '" << name << "': padding entry " << j << " = " << a[j]
                               << " is not 0; using the first " << H << " entries per head";
          }
        }
        k.a_exp.resize(H);
        for (int h = 0; h < H; ++h) {
          if (!std::isfinite(a[h]))
            return absl::DataLossError(absl::StrCat("tensor '", name, "': non-finite value"));
          k.a_exp[h] = std::exp(a[h]);
        }
        return absl::OkStatus();
      });
    } else {
      // Spec §2.3 / §3.4.
      const MlaConfig& m = cfg.mla;
      const int H = m.num_heads, nope = m.qk_nope_head_dim, extra = m.qk_rope_head_dim,
                vd = m.v_head_dim, lat = m.kv_lora_rank, ql = m.q_lora_rank;
      MlaWeights& a = lw.mla_w;
      COLI_RETURN_IF_ERROR(matrix(A + "q_a_proj.weight", ql, D, opt.mla_bits, "K3_MLA_BITS", &a.q_a_proj));
      vec(A + "q_a_layernorm.weight", DType::kBF16, {ql}, &a.q_a_norm);
      COLI_RETURN_IF_ERROR(matrix(A + "q_b_proj.weight", int64_t{H} * (nope + extra), ql,
                                  opt.mla_bits, "K3_MLA_BITS", &a.q_b_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "kv_a_proj_with_mqa.weight", lat + extra, D, opt.mla_bits,
                                  "K3_MLA_BITS", &a.kv_a_proj));
      vec(A + "kv_a_layernorm.weight", DType::kBF16, {lat}, &a.kv_a_norm);
      COLI_RETURN_IF_ERROR(matrix(A + "g_proj.weight", int64_t{H} * vd, D, opt.mla_bits,
                                  "K3_MLA_BITS", &a.g_proj));
      COLI_RETURN_IF_ERROR(matrix(A + "o_proj.weight", D, int64_t{H} * vd, opt.mla_bits,
                                  "K3_MLA_BITS", &a.o_proj));
      // Both halves of kv_b are quantized per STORED row ([nope|vd, lat], spec §4.2/§4.3), the
      // layout a repacked container holds. The absorbed form needs K_hᵀ, so the K half is kept as
      // the exact dequantized values of that row quantization, transposed, in f32 (about 4x the
      // int8 bytes of the K half: ~0.6 GB on the full model, <2% of the resident set).
      COLI_ASSIGN_OR_RETURN(WeightFormat f_k, FormatForBits(opt.mla_bits, lat, "K3_MLA_BITS"));
      COLI_ASSIGN_OR_RETURN(WeightFormat f_v, FormatForBits(opt.mla_bits, lat, "K3_MLA_BITS"));
      jobs.push_back([&snap, &a, name = A + "kv_b_proj.weight", H, nope, vd, lat, f_k, f_v] {
        // kv_b rows per head: nope rows of K_h, then vd rows of V_h (spec §2.3).
        const int64_t shape[] = {int64_t{H} * (nope + vd), lat};
        COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snap.Expect(name, DType::kBF16, shape));
        COLI_ASSIGN_OR_RETURN(std::vector<float> kv, snap.ReadAsF32(*t));
        a.k_absorb.resize(H);
        a.v_up.resize(H);
        std::vector<float> kt(static_cast<size_t>(lat) * nope);
        std::vector<float> row(static_cast<size_t>(lat));
        for (int h = 0; h < H; ++h) {
          const float* K = kv.data() + static_cast<int64_t>(h) * (nope + vd) * lat;
          auto kq = QuantizedMatrix::FromF32(K, nope, lat, f_k);
          if (!kq.ok()) return Annotate(kq.status(), absl::StrCat("tensor '", name, "'"));
          const kernels::MatrixView kview = kq->view();
          for (int r = 0; r < nope; ++r) {
            kernels::DequantizeRow(kview, r, row.data());
            for (int c = 0; c < lat; ++c) kt[static_cast<int64_t>(c) * nope + r] = row[c];
          }
          auto kt_f32 = QuantizedMatrix::FromF32(kt.data(), lat, nope, WeightFormat::kF32);
          if (!kt_f32.ok()) return Annotate(kt_f32.status(), absl::StrCat("tensor '", name, "'"));
          a.k_absorb[h].m = std::move(kt_f32).value();
          auto vq = QuantizedMatrix::FromF32(K + int64_t{nope} * lat, vd, lat, f_v);
          if (!vq.ok()) return Annotate(vq.status(), absl::StrCat("tensor '", name, "'"));
          a.v_up[h].m = std::move(vq).value();
        }
        return absl::OkStatus();
      });
    }
    const std::string F = P + "mlp.";
    if (lw.dense) {
      DenseMlpWeights& d = lw.dense_w;
      const int64_t I = cfg.intermediate_size;
      COLI_RETURN_IF_ERROR(matrix(F + "gate_proj.weight", I, D, opt.bits, "K3_BITS", &d.gate_proj));
      COLI_RETURN_IF_ERROR(matrix(F + "up_proj.weight", I, D, opt.bits, "K3_BITS", &d.up_proj));
      COLI_RETURN_IF_ERROR(matrix(F + "down_proj.weight", D, I, opt.bits, "K3_BITS", &d.down_proj));
    } else {
      const std::string M = P + "block_sparse_moe.";
      const MoeConfig& mc = cfg.moe;
      MoeWeights& e = lw.moe_w;
      COLI_RETURN_IF_ERROR(matrix(M + "gate.weight", mc.num_experts, D, 32, "f32", &e.router));
      vec(M + "gate.e_score_correction_bias", DType::kF32, {mc.num_experts}, &e.correction_bias);
      COLI_RETURN_IF_ERROR(matrix(M + "routed_expert_down_proj.weight", mc.latent, D, opt.bits,
                                  "K3_BITS", &e.latent_down));
      if (mc.latent_norm)
        vec(M + "routed_expert_norm.weight", DType::kBF16, {mc.latent}, &e.latent_norm);
      COLI_RETURN_IF_ERROR(matrix(M + "routed_expert_up_proj.weight", D, mc.latent, opt.bits,
                                  "K3_BITS", &e.latent_up));
      e.has_shared = mc.num_shared_experts > 0;
      if (e.has_shared) {
        const int64_t S = mc.shared_intermediate();
        const std::string SE = M + "shared_experts.";
        COLI_RETURN_IF_ERROR(matrix(SE + "gate_proj.weight", S, D, opt.bits, "K3_BITS", &e.shared_gate));
        COLI_RETURN_IF_ERROR(matrix(SE + "up_proj.weight", S, D, opt.bits, "K3_BITS", &e.shared_up));
        COLI_RETURN_IF_ERROR(matrix(SE + "down_proj.weight", D, S, opt.bits, "K3_BITS", &e.shared_down));
      }
    }
  }

  // Globals (spec §2.3). The head is needed unless the stack is truncated (K3_LAYERS).
  const std::string G = w->prefix_ + "model.";
  vec(G + "norm.weight", DType::kBF16, {D}, &w->final_norm);
  Weights* W = w.get();
  jobs.push_back([&ld, W, G, D] {
    return ld.ResScore(G + "output_attn_res_norm.weight", G + "output_attn_res_proj.weight", D,
                       &W->output_res_score);
  });
  COLI_RETURN_IF_ERROR(matrix(w->prefix_ + "lm_head.weight", V, D, opt.head_bits, "K3_HEAD_BITS",
                              &w->lm_head));
  {
    const int64_t shape[] = {V, D};
    COLI_ASSIGN_OR_RETURN(w->embed_, snap.Expect(G + "embed_tokens.weight", DType::kBF16, shape));
    COLI_ASSIGN_OR_RETURN(w->embed_file_, snap.ShardFile(w->embed_->shard));
  }
  COLI_RETURN_IF_ERROR(RunJobs(jobs, opt.load_threads, progress));

  size_t bytes = w->lm_head.m.bytes();
  for (const LayerWeights& lw : w->layers) {
    for (const Linear* l : {&lw.kda_w.q_proj, &lw.kda_w.k_proj, &lw.kda_w.v_proj, &lw.kda_w.g_proj,
                            &lw.kda_w.o_proj, &lw.kda_w.f_a_proj, &lw.kda_w.f_b_proj,
                            &lw.kda_w.b_proj, &lw.mla_w.q_a_proj, &lw.mla_w.q_b_proj,
                            &lw.mla_w.kv_a_proj, &lw.mla_w.g_proj, &lw.mla_w.o_proj,
                            &lw.dense_w.gate_proj, &lw.dense_w.up_proj, &lw.dense_w.down_proj,
                            &lw.moe_w.router, &lw.moe_w.latent_down, &lw.moe_w.latent_up,
                            &lw.moe_w.shared_gate, &lw.moe_w.shared_up, &lw.moe_w.shared_down})
      bytes += l->m.bytes();
    for (const auto& l : lw.mla_w.k_absorb) bytes += l.m.bytes();
    for (const auto& l : lw.mla_w.v_up) bytes += l.m.bytes();
  }
  w->resident_bytes = bytes;
  return w;
}

absl::Status Weights::EmbedRow(int64_t token, float* out) const {
  if (token < 0 || token >= vocab_)
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", token, " outside the vocabulary [0, ", vocab_, ")"));
  std::vector<uint16_t> raw(hidden_);
  COLI_RETURN_IF_ERROR(embed_file_->ReadAt(embed_->file_offset + token * hidden_ * 2,
                                           hidden_ * 2, raw.data()));
  for (int64_t i = 0; i < hidden_; ++i) out[i] = kernels::Bf16ToF32(raw[i]);
  return absl::OkStatus();
}

}  // namespace coli::k3
