#include "plugins/kimi_k3/vk_dense.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/status/status.h"

namespace coli::k3 {

absl::StatusOr<bool> VkDenseOnDevice(int mode, bool discrete_gpu) {
  switch (mode) {
    case kVkDenseAuto:
      return discrete_gpu;
    case kVkDenseCpu:
      return false;
    case kVkDenseDevice:
      return true;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("COLI_VK_DENSE=", mode, ": expected auto (-1), 1 or 0"));
  }
}

struct VkDenseExperts::Layer {
  const void* sources[3] = {};  // the CPU views' data the device copies came from
  std::vector<std::unique_ptr<vulkan::DeviceDenseMatrix>> m;  // gate, up, down
  uint64_t bytes = 0;
};

VkDenseExperts::VkDenseExperts(vulkan::VulkanContext* vk, float beta1, float beta2)
    : vk_(vk), beta1_(beta1), beta2_(beta2) {}

VkDenseExperts::~VkDenseExperts() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();  // not started yet: dropped
  }
  cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
}

bool VkDenseExperts::Takes(int layer, int n) const {
  // Every pass, whatever its row count: the device's sums differ from the CPU's in their last
  // bits, so a row must land on the same side however passes are cut. With a cap, a prompt
  // prefilled in other chunks (K3_CHUNK, a checkpoint or prefix cache restore point), a
  // speculative verify chunk or a batch of more rows changed the answer.
  if (n < 1) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.disabled) return false;
  return !stats_.uploads_stopped || layers_.count(layer) > 0;
}

void VkDenseExperts::DisableLocked(const absl::Status& status) {
  if (!stats_.disabled) {
    COLI_LOG(kError) << "Vulkan dense path disabled, the shared experts stay on the CPU: "
                     << status;
  }
  stats_.disabled = true;
  stats_.failures += 1;
  layers_.clear();
  stats_.matrices = 0;
  stats_.bytes = 0;
}

absl::StatusOr<VkDenseExperts::Layer*> VkDenseExperts::Upload(
    int layer, const kernels::MatrixView (&views)[3]) {
  const std::string what = absl::StrCat("Vulkan shared experts of layer ", layer);
  absl::StatusOr<std::vector<std::unique_ptr<vulkan::DeviceDenseMatrix>>> uploaded =
      vk_->UploadDenseBatch(views);
  std::lock_guard<std::mutex> lock(mu_);
  if (!uploaded.ok()) {
    const absl::Status status = Annotate(uploaded.status(), what);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      if (!stats_.uploads_stopped) {
        COLI_LOG(kWarning) << "Vulkan dense: device memory full on " << vk_->device_name()
                           << " with " << stats_.matrices << " dense matrices (" << stats_.bytes
                           << " B); the shared experts of the layers not uploaded stay on the "
                           << "CPU (" << status << ")";
      }
      stats_.uploads_stopped = true;
      stats_.failures += 1;
    } else {
      DisableLocked(status);
    }
    return status;
  }
  if (stats_.disabled) {
    return absl::FailedPreconditionError(what + ": the dense path was turned off meanwhile");
  }
  auto l = std::make_unique<Layer>();
  for (int i = 0; i < 3; ++i) l->sources[i] = views[i].data;
  l->m = std::move(uploaded).value();
  for (const auto& m : l->m) l->bytes += m->device_bytes();
  stats_.matrices += 3;
  stats_.bytes += l->bytes;
  Layer* out = l.get();
  layers_[layer] = std::move(l);
  return out;
}

absl::Status VkDenseExperts::Compute(int layer, const kernels::MatrixView& gate,
                                     const kernels::MatrixView& up, const kernels::MatrixView& down,
                                     const float* x, int n, bool idot, float* y) {
  const std::string what = absl::StrCat("Vulkan shared experts of layer ", layer);
  Layer* resident = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A Prefetch of this layer in flight finishes first (it uploads the same views).
    cv_.wait(lock, [&] { return pending_.count(layer) == 0; });
    if (stats_.disabled) return absl::FailedPreconditionError(what + ": the dense path is off");
    auto it = layers_.find(layer);
    if (it != layers_.end() &&
        (it->second->sources[0] != gate.data || it->second->sources[1] != up.data ||
         it->second->sources[2] != down.data)) {
      // The model's matrices moved (not expected for one model): upload again.
      stats_.matrices -= 3;
      stats_.bytes -= it->second->bytes;
      layers_.erase(it);
      it = layers_.end();
    }
    if (it != layers_.end()) resident = it->second.get();
    if (resident == nullptr && stats_.uploads_stopped) {
      return absl::ResourceExhaustedError(what + ": device memory full, not uploaded");
    }
  }
  if (resident == nullptr) {
    // Only the serialised MoE calls reach here and no Prefetch of this layer is pending, so no
    // other upload of this layer runs now.
    const kernels::MatrixView views[3] = {gate, up, down};
    COLI_ASSIGN_OR_RETURN(resident, Upload(layer, views));
  }
  const absl::Status status = Annotate(
      vk_->DenseGlu(*resident->m[0], *resident->m[1], *resident->m[2], x, n, beta1_, beta2_, y,
                    idot ? vulkan::MatmulNumerics::kIdot : vulkan::MatmulNumerics::kFloat),
      what);
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) {
    DisableLocked(status);
    return status;
  }
  stats_.calls += 1;
  return absl::OkStatus();
}

void VkDenseExperts::Prefetch(int layer, const kernels::MatrixView& gate,
                              const kernels::MatrixView& up, const kernels::MatrixView& down) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.disabled || stats_.uploads_stopped || stop_ || layers_.count(layer) > 0 ||
        pending_.count(layer) > 0) {
      return;
    }
    pending_.insert(layer);
    queue_.push_back(Queued{layer, {gate, up, down}});
    if (!uploader_.joinable()) uploader_ = std::thread([this] { UploadLoop(); });
  }
  cv_.notify_all();
}

void VkDenseExperts::UploadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    const Queued q = queue_.front();
    queue_.pop_front();
    if (!stats_.disabled && !stats_.uploads_stopped) {
      lock.unlock();
      // Errors are recorded (and logged) by Upload; the layer's next device call retries or
      // leaves it to the CPU by the same rules.
      (void)Upload(q.layer, q.views);
      lock.lock();
    }
    pending_.erase(q.layer);
    cv_.notify_all();
  }
}

void VkDenseExperts::WaitForUploads() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.empty(); });
}

VkDenseStats VkDenseExperts::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace coli::k3
