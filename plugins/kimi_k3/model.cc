#include "plugins/kimi_k3/model.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ops/ops.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/attn_res.h"
#include "plugins/kimi_k3/container.h"
#include "plugins/kimi_k3/dense_mlp.h"
#include "plugins/kimi_k3/session.h"

namespace coli::k3 {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Adds the elapsed time since `start` to *slot on destruction.
class ScopedTimer {
 public:
  explicit ScopedTimer(double* slot) : slot_(slot), start_(Now()) {}
  ~ScopedTimer() {
    if (slot_) *slot_ += Now() - start_;
  }

 private:
  double* slot_;
  double start_;
};

absl::Status ValidateOptions(const ModelOptions& o) {
  for (auto [bits, name] : {std::pair{o.bits, "K3_BITS"}, std::pair{o.mla_bits, "K3_MLA_BITS"},
                            std::pair{o.head_bits, "K3_HEAD_BITS"}})
    if (bits != 4 && bits != 8 && bits != 32)
      return absl::InvalidArgumentError(absl::StrCat(name, "=", bits, ": use 4, 8 or 32"));
  if (o.chunk < 1 || o.chunk > 512)
    return absl::InvalidArgumentError(absl::StrCat("K3_CHUNK=", o.chunk, ": use 1…512"));
  // The streaming expert store's range (expert_store.h): checked here too, so a bad value is
  // refused before the tensors load, not after (minutes on the full model).
  if (o.load_threads < 1 || o.load_threads > kMaxLoadThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("K3_LOAD_THREADS=", o.load_threads, ": use 1…", kMaxLoadThreads));
  }
  // Written as !(in range) so that nan is refused too.
  if (!(o.topp >= 0 && o.topp <= 1))
    return absl::InvalidArgumentError(absl::StrCat("K3_TOPP=", o.topp, ": use 0…1"));
  if (!(o.expert_gb >= 0) || std::isinf(o.expert_gb)) {
    return absl::InvalidArgumentError(
        absl::StrCat("K3_EXPERT_GB=", o.expert_gb, ": use a finite budget in GB, 0 or more"));
  }
  if (!(o.mla_latent_norm_eps > 0) || std::isinf(o.mla_latent_norm_eps)) {
    return absl::InvalidArgumentError(absl::StrCat("K3_MLA_NORM_EPS=", o.mla_latent_norm_eps,
                                                   ": use a positive, finite epsilon"));
  }
  if (o.threads < 0 || o.threads > kMaxComputeThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("COLI_THREADS=", o.threads, ": use 0…", kMaxComputeThreads, " (0 = all)"));
  }
  if (o.layers < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("K3_LAYERS=", o.layers, ": use 0 or more (-1 = the whole stack)"));
  }
  return absl::OkStatus();
}

// K3_TRACE / K3_LOGITS name files each session writes: one that cannot be written is refused
// here, before the tensors load, instead of failing every request of a served model. Opened
// without truncating (a session truncates it when it starts), and without waiting on a FIFO.
absl::Status CheckOutputPaths(const ModelOptions& o) {
  const struct {
    const std::string& path;
    const char* name;
  } outputs[] = {{o.trace_path, "K3_TRACE"}, {o.logits_path, "K3_LOGITS"}};
  for (const auto& out : outputs) {
    if (out.path.empty()) continue;
    const int fd = ::open(out.path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::PermissionDeniedError(absl::StrCat(out.name, " '", out.path,
                                                      "': cannot open for writing: ",
                                                      std::strerror(errno)));
    }
    ::close(fd);
  }
  return absl::OkStatus();
}

}  // namespace

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const ModelOptions& options,
                                                   const Progress& progress,
                                                   ExpertSourceFactory experts) {
  COLI_RETURN_IF_ERROR(ValidateOptions(options));
  COLI_RETURN_IF_ERROR(CheckOutputPaths(options));
  auto model = std::unique_ptr<Model>(new Model());
  model->options_ = options;
  COLI_ASSIGN_OR_RETURN(model->cfg_, Config::LoadDir(dir));
  absl::StatusOr<std::unique_ptr<st::Snapshot>> snapshot = st::Snapshot::Open(
      dir, {.extra_dirs = options.extra_dirs, .verify_checksums = options.verify_checksums});
  if (snapshot.status().code() == absl::StatusCode::kNotFound && IsRepackContainer(dir)) {
    // k3-repack writes the index last: shards without it are a run that did not finish.
    return absl::NotFoundError(absl::StrCat(
        snapshot.status().message(), "; '", dir,
        "' holds k3-repack shards but no index: the repack has not finished (it was stopped, or "
        "is still running); run k3-repack <source> '",
        dir, "' again to complete it"));
  }
  COLI_ASSIGN_OR_RETURN(model->snapshot_, std::move(snapshot));
  absl::StatusOr<std::unique_ptr<Weights>> weights =
      Weights::Load(*model->snapshot_, model->cfg_, options, progress);
  if (weights.status().code() == absl::StatusCode::kNotFound && IsRepackContainer(dir)) {
    // A container lacking a tensor is almost always a repack that has not finished.
    return absl::NotFoundError(absl::StrCat(
        weights.status().message(), "; '", dir,
        "' is a k3-repack output that lacks it: the repack has not finished (or ran with "
        "--shards); run k3-repack <source> '",
        dir, "' again to complete it"));
  }
  COLI_ASSIGN_OR_RETURN(model->weights_, std::move(weights));
  const int layers = model->weights_->num_layers();
  if (experts) {
    COLI_ASSIGN_OR_RETURN(model->experts_, experts(*model->snapshot_, model->cfg_,
                                                   model->weights_->prefix(), layers));
  } else {
    COLI_ASSIGN_OR_RETURN(model->experts_,
                          PreadExpertSource::Create(*model->snapshot_, model->cfg_,
                                                    model->weights_->prefix(), layers));
  }
  // Every shard the model uses, as made by one k3-repack run (a plain checkpoint has no record).
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> shards;
  for (int s = 0; s < model->snapshot_->num_shards(); ++s) {
    if (!model->snapshot_->IsShardOpen(s)) continue;
    COLI_ASSIGN_OR_RETURN(auto metadata, model->snapshot_->ShardMetadata(s));
    shards.emplace_back(model->snapshot_->ShardPath(s), std::move(metadata));
  }
  COLI_RETURN_IF_ERROR(CheckOneRepack(shards));
  model->compute_.matmul.idot = options.idot;
  model->compute_.matmul.threads = options.threads;
  model->compute_.threads = options.threads;
  return model;
}

std::unique_ptr<Session> Model::NewSession() const { return std::make_unique<Session>(*this); }

SequenceState Model::NewState() const {
  SequenceState s;
  s.kda.resize(num_layers());
  s.mla.resize(num_layers());
  for (int i = 0; i < num_layers(); ++i) {
    if (cfg_.is_kda[i]) s.kda[i].Reset(cfg_.kda);
    else s.mla[i].Reset(cfg_.mla);
  }
  return s;
}

void Model::ResetState(SequenceState& s) const {
  if (s.kda.size() != static_cast<size_t>(num_layers()) ||
      s.mla.size() != static_cast<size_t>(num_layers())) {
    s = NewState();
    return;
  }
  for (int i = 0; i < num_layers(); ++i) {
    if (cfg_.is_kda[i]) {
      s.kda[i].Reset(cfg_.kda);  // assign() of the same size keeps the buffers
      s.mla[i] = MlaCache();
    } else {
      s.kda[i] = KdaState();
      s.mla[i] = MlaCache();
      s.mla[i].Reset(cfg_.mla);
    }
  }
}

absl::Status Model::Embed(std::span<const int32_t> tokens, float* out) const {
  for (size_t r = 0; r < tokens.size(); ++r)
    COLI_RETURN_IF_ERROR(weights_->EmbedRow(tokens[r], out + r * cfg_.hidden_size));
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const Row> rows, const float* x0, float* logits,
                            float* trace, Timings* timings,
                            const std::function<bool()>* interrupt) const {
  Timings scratch_timings;
  Timings& t = timings ? *timings : scratch_timings;
  const int n = static_cast<int>(rows.size());
  const int64_t D = cfg_.hidden_size;
  const int L = num_layers();
  const int B = cfg_.attn_res_block_size;
  const float eps = cfg_.rms_norm_eps;
  const size_t ND = static_cast<size_t>(n) * D;
  if (n == 0) return absl::OkStatus();
  // K3_MMAP: a shard truncated under the mapping would raise SIGBUS in the matmuls below and
  // one rewritten in place would feed them other bytes; the pass fails first, naming it.
  COLI_RETURN_IF_ERROR(weights_->CheckMappings());

  std::vector<KdaState*> kda_states(n);
  std::vector<MlaCache*> mla_caches(n);
  std::vector<int64_t> positions(n);
  for (int r = 0; r < n; ++r) positions[r] = rows[r].position;

  // AttnRes bookkeeping, per row (rows never interact): the closed block snapshots and the
  // running in-block sum `prefix`.
  std::vector<std::vector<float>> blocks;
  std::vector<const float*> block_ptrs;
  std::vector<float> prefix(x0, x0 + ND), mixed(ND), normed(ND), sub(ND);
  bool prefix_none = false;

  for (int i = 0; i < L; ++i) {
    // A long prefill chunk on the real model takes about a minute: a cancel lands within a layer.
    if (i > 0 && interrupt != nullptr && (*interrupt)()) {
      return absl::CancelledError(absl::StrCat("forward pass interrupted before layer ", i));
    }
    const LayerWeights& lw = weights_->layers[i];
    // Attention site: mix over [snapshots…, prefix], then close the block if one starts here.
    {
      ScopedTimer timer(&t.mix);
      if (block_ptrs.empty()) mixed = prefix;
      else AttnResMix(block_ptrs, prefix.data(), n, D, lw.attn_res_score.data(), eps, mixed.data());
      if (i % B == 0) {
        blocks.push_back(prefix);
        block_ptrs.clear();
        for (const auto& b : blocks) block_ptrs.push_back(b.data());
        prefix_none = true;
      }
      ops::RmsNormRows(mixed.data(), lw.input_norm.data(), n, D, eps, normed.data());
    }
    {
      ScopedTimer timer(&t.attention);
      if (lw.kda) {
        for (int r = 0; r < n; ++r) kda_states[r] = &rows[r].state->kda[i];
        COLI_RETURN_IF_ERROR(Annotate(
            KdaForward(cfg_, lw.kda_w, compute_, normed.data(), n, kda_states, sub.data()),
            absl::StrCat("layer ", i, " (KDA)")));
      } else {
        for (int r = 0; r < n; ++r) mla_caches[r] = &rows[r].state->mla[i];
        COLI_RETURN_IF_ERROR(Annotate(
            MlaForward(cfg_, lw.mla_w, options_.mla_latent_norm_eps, compute_, normed.data(), n,
                       mla_caches, positions, sub.data()),
            absl::StrCat("layer ", i, " (MLA)")));
      }
    }
    if (prefix_none) {
      prefix.swap(sub);
      prefix_none = false;
    } else {
      ops::Add(sub.data(), ND, prefix.data());
    }
    // FFN site.
    {
      ScopedTimer timer(&t.mix);
      AttnResMix(block_ptrs, prefix.data(), n, D, lw.mlp_res_score.data(), eps, mixed.data());
      ops::RmsNormRows(mixed.data(), lw.post_attention_norm.data(), n, D, eps, normed.data());
    }
    {
      ScopedTimer timer(&t.moe);
      if (lw.dense) {
        COLI_RETURN_IF_ERROR(Annotate(
            DenseMlpForward(cfg_, lw.dense_w, compute_, normed.data(), n, sub.data()),
            absl::StrCat("layer ", i, " (dense MLP)")));
      } else {
        COLI_RETURN_IF_ERROR(Annotate(
            LatentMoeForward(cfg_, lw.moe_w, i, *experts_, options_.topp, compute_, normed.data(),
                             n, sub.data(), &t.moe_stats),
            absl::StrCat("layer ", i, " (LatentMoE)")));
      }
    }
    ops::Add(sub.data(), ND, prefix.data());
    if (trace) {
      for (int r = 0; r < n; ++r)
        std::copy_n(prefix.data() + r * D, D, trace + (static_cast<size_t>(r) * L + i) * D);
    }
  }

  // Output site: mix, final norm, lm_head on the rows that want logits.
  ScopedTimer timer(&t.head);
  std::vector<int> wanted;
  for (int r = 0; r < n; ++r)
    if (rows[r].want_logits) wanted.push_back(r);
  if (wanted.empty()) return absl::OkStatus();
  const int m = static_cast<int>(wanted.size());
  std::vector<const float*> sel_blocks(block_ptrs.size());
  std::vector<std::vector<float>> sel_storage(block_ptrs.size(), std::vector<float>(m * D));
  std::vector<float> sel_prefix(m * D), out(m * D);
  for (size_t j = 0; j < block_ptrs.size(); ++j) {
    for (int k = 0; k < m; ++k)
      std::copy_n(block_ptrs[j] + wanted[k] * D, D, sel_storage[j].data() + k * D);
    sel_blocks[j] = sel_storage[j].data();
  }
  for (int k = 0; k < m; ++k) std::copy_n(prefix.data() + wanted[k] * D, D, sel_prefix.data() + k * D);
  AttnResMix(sel_blocks, sel_prefix.data(), m, D, weights_->output_res_score.data(), eps, out.data());
  ops::RmsNormRows(out.data(), weights_->final_norm.data(), m, D, eps, out.data());
  return MatMul(compute_, weights_->lm_head, out.data(), m, logits);
}

}  // namespace coli::k3
