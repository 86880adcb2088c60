// common/vk: a small Vulkan compute context (volk, no layers) and the MXFP4 matmul on it,
// the foundation of the Vulkan expert tier.
//
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<VulkanContext> vk, VulkanContext::Create());
//   std::vector<float> y(batch * w.rows);
//   COLI_RETURN_IF_ERROR(vk->Mxfp4Matmul(w, x, batch, y.data()));  // w: MatrixView, kMxfp4
//
//   // Resident weights: upload once, dispatch many times.
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMxfp4Matrix> dw, vk->UploadMxfp4(w));
//   COLI_RETURN_IF_ERROR(vk->Mxfp4Matmul(*dw, x, batch, y.data()));
//
// The MXFP4 bytes go to the device as they sit in RAM (e2m1 nibbles, low nibble = even column);
// only the UE8M0 group exponents are widened on upload to the f32 scales the shader reads
// (kernels::E8m0ToF32: float bits s << 23). By default activations stay f32, so the result is the
// CPU's exact-float MXFP4 kernel (MatmulOptions{.idot = false}) up to summation order;
// MatmulNumerics::kIdot gives the CPU's integer-dot kernel (the K3_IDOT=1 default) bit for bit.
//
// Residency. Where the device has device-local memory that is not host-visible (a discrete
// GPU), resident matrices live there and are filled through one reusable host-visible staging
// buffer (vkCmdCopyBuffer, a transfer -> compute barrier, one fence per staging fill) on the
// uploading thread, independent of the step's lock. Elsewhere (integrated GPUs, lavapipe) they
// are written straight into mapped memory. COLI_VK_STAGING=1 (or
// VulkanContextOptions::force_staging) forces the staged path, so lavapipe exercises it.
// Per-step buffers (activations, intermediates, outputs) are kept in the context and grown only
// for a larger step.
//
// Device choice: the first physical device with a compute queue, discrete GPUs before
// integrated, virtual and CPU (lavapipe) ones; COLI_VK_DEVICE=N takes device N of the
// enumeration instead. Errors are absl::Status naming the call and its VkResult; nothing aborts.
#ifndef COLI_COMMON_VULKAN_VULKAN_CONTEXT_H_
#define COLI_COMMON_VULKAN_VULKAN_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"

namespace coli::vulkan {

class VulkanContext;
namespace internal {
struct VulkanState;  // instance, device, pipeline (vulkan_context.cc)
}  // namespace internal

// An MXFP4 matrix resident in device memory (made by VulkanContext::UploadMxfp4): the e2m1 bytes
// as they were, the E8M0 exponents widened to f32. Must be destroyed before its context; usable
// only with that context.
class DeviceMxfp4Matrix {
 public:
  ~DeviceMxfp4Matrix();
  DeviceMxfp4Matrix(const DeviceMxfp4Matrix&) = delete;
  DeviceMxfp4Matrix& operator=(const DeviceMxfp4Matrix&) = delete;

  int64_t rows() const;
  int64_t cols() const;
  // Device memory held (allocation sizes): at least rows*cols/2 weight bytes plus 4 bytes per
  // 32-column group.
  size_t device_bytes() const;

 private:
  friend class VulkanContext;
  struct Impl;
  explicit DeviceMxfp4Matrix(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A dense weight matrix resident in device memory (VulkanContext::UploadDense): f32, int8 per
// row or int4-g64 (kernels.h layouts), its bytes and f32 scales exactly as the CPU holds them —
// the formats Kimi K3 keeps its shared experts in (K3_BITS 32, 8, 4). Must be destroyed before
// its context; usable only with that context.
class DeviceDenseMatrix {
 public:
  ~DeviceDenseMatrix();
  DeviceDenseMatrix(const DeviceDenseMatrix&) = delete;
  DeviceDenseMatrix& operator=(const DeviceDenseMatrix&) = delete;

  int64_t rows() const;
  int64_t cols() const;
  kernels::WeightFormat format() const;
  // Device memory held (allocation sizes, alignment included).
  size_t device_bytes() const;

 private:
  friend class VulkanContext;
  struct Impl;
  explicit DeviceDenseMatrix(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One expert of a batched expert chain (VulkanContext::ExpertChain): a SiTU-GLU block
//   y[r, :] = down · SiTU(gate · x[r, :], up · x[r, :])   for r < rows
// with resident MXFP4 matrices gate, up [inter, hidden] and down [hidden, inter]; x and y are
// host f32 [rows, hidden] (borrowed for the call).
struct ExpertChainJob {
  const DeviceMxfp4Matrix* gate = nullptr;
  const DeviceMxfp4Matrix* up = nullptr;
  const DeviceMxfp4Matrix* down = nullptr;
  const float* x = nullptr;
  int64_t rows = 0;
  float* y = nullptr;
};

// How a matmul on the device treats its f32 activations (MXFP4, int8 and int4-g64 weights; f32
// weights have no integer path on the CPU either and always use f32 activations).
enum class MatmulNumerics {
  // f32 activations: the CPU's exact-float kernels (MatmulOptions{.idot = false}, K3_IDOT=0) up
  // to summation order.
  kFloat,
  // int8 activations per 32 (MXFP4) or 64 (int8, int4-g64) columns, quantized on the host by
  // the CPU's own routine (kernels::QuantizeActivationsInt8Groups): the CPU's
  // Matmul(idot = true) (K3_IDOT=1, the default) bit for bit (shaders/mxfp4_matmul_idot.comp and
  // dense_matmul_idot.comp do their floating-point steps in integers, shaders/idot_float.glsl, so
  // no driver's fma or subnormal handling can change them). Needs a device with shaderInt64
  // (supports_idot()); elsewhere refused (UNIMPLEMENTED). Non-finite activations are refused as
  // the CPU refuses them (INVALID_ARGUMENT naming the batch row).
  kIdot,
};

struct VulkanContextOptions {
  // Stage resident uploads into device-local memory even where every type is host-visible
  // (tests on lavapipe). Unset: COLI_VK_STAGING=1 in this process's environment sets it.
  std::optional<bool> force_staging;
  // The device: its index in the instance's enumeration. Unset: COLI_VK_DEVICE in this process's
  // environment, else the best one (discrete > integrated > virtual > CPU). A model family
  // passes what its own switch says (it travels from the client), so it wins over the host's
  // environment.
  std::optional<int> device_index;
  // Bytes of the staging buffer; larger uploads are copied in chunks. At least 4096.
  uint64_t staging_bytes = 32ull << 20;
  // Enable shaderInt64 (the idot kernel) where the device has it; false behaves as a device
  // without it (tests of that path).
  bool use_int64 = true;
};

// What VulkanContext::TimeCopy copies (coli bench vk).
enum class CopyKind {
  kHostToDevice,    // a host-visible buffer into device-local memory (the upload path's limit)
  kDeviceToDevice,  // device-local to device-local (reads and writes device memory)
};

class VulkanContext {
 public:
  // Loads the Vulkan loader, creates an instance (no layers), picks a device with a compute
  // queue and builds the MXFP4 matmul pipeline from the embedded SPIR-V. UNAVAILABLE when there
  // is no loader or no device with a compute queue; INVALID_ARGUMENT for a bad COLI_VK_DEVICE
  // or device_index;
  // INTERNAL (with the VkResult) when a Vulkan call fails.
  // COLI_VK_STAGING other than 0 or 1 is INVALID_ARGUMENT naming it.
  static absl::StatusOr<std::unique_ptr<VulkanContext>> Create();
  static absl::StatusOr<std::unique_ptr<VulkanContext>> Create(const VulkanContextOptions& options);
  ~VulkanContext();
  VulkanContext(const VulkanContext&) = delete;
  VulkanContext& operator=(const VulkanContext&) = delete;

  // The device's name as the driver reports it, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)".
  const std::string& device_name() const;
  // Its index in the instance's physical-device enumeration (what COLI_VK_DEVICE selects).
  int device_index() const;

  // y[b*rows + r] = sum_c W[r,c] * x[b*cols + c] for b in [0, batch), on the device, for an
  // MXFP4 view (kernels.h layout; cols % 32 == 0). Blocks until the result is in y. Refuses
  // another format, a malformed view, a negative batch, null x / y, or a shape whose indices
  // exceed 32 bits (INVALID_ARGUMENT); RESOURCE_EXHAUSTED when a buffer exceeds the device's
  // storage-buffer range or memory. batch == 0 or rows == 0 does nothing. Thread-safe (calls
  // are serialised).
  absl::Status Mxfp4Matmul(const kernels::MatrixView& w, const float* x, int64_t batch, float* y,
                           MatmulNumerics numerics = MatmulNumerics::kFloat);

  // Copies an MXFP4 view to the device (same refusals as Mxfp4Matmul for the view; rows may be
  // 0). staging(): device-local memory filled through the staging buffer; else memory that is
  // both device-local and host-visible if there is one, else host-visible. RESOURCE_EXHAUSTED
  // (VK_ERROR_OUT_OF_DEVICE_MEMORY) when the device is full; nothing stays allocated then.
  // Thread-safe; never waits for a running step (uploads have their own command buffer).
  absl::StatusOr<std::unique_ptr<DeviceMxfp4Matrix>> UploadMxfp4(const kernels::MatrixView& w);
  // Several matrices in as few staged submissions as the staging buffer allows (an expert's
  // three matrices: one fence). Same refusals; all or nothing.
  absl::StatusOr<std::vector<std::unique_ptr<DeviceMxfp4Matrix>>> UploadMxfp4Batch(
      std::span<const kernels::MatrixView> views);
  // Device memory (allocation sizes, alignment included) a resident [rows, cols] MXFP4 matrix
  // takes on this device: what a budget must count. INVALID_ARGUMENT for a bad shape.
  absl::StatusOr<uint64_t> Mxfp4DeviceBytes(int64_t rows, int64_t cols);

  // True when resident matrices are device-local and uploaded through the staging buffer.
  bool staging() const;
  // Device memory held by the live resident matrices (allocation sizes). Any thread.
  uint64_t resident_bytes() const;
  // Staged upload submissions (one fence each) completed so far. Any thread.
  uint64_t upload_batches() const;
  // Per-step buffers (re)allocated so far: grows only when a step is larger than those before.
  uint64_t step_allocations() const;
  // Test hook: the next `n` device allocations (only those of resident matrices when
  // `uploads_only`) fail as VK_ERROR_OUT_OF_DEVICE_MEMORY would.
  void FailAllocationsForTesting(int n, bool uploads_only = false);

  // Best wall time in seconds of `reps` submissions of one vkCmdCopyBuffer of `bytes` (buffers
  // allocated for the call; coli bench vk's device limits). INVALID_ARGUMENT for 0 bytes/reps.
  absl::StatusOr<double> TimeCopy(CopyKind kind, uint64_t bytes, int reps);

  // As Mxfp4Matmul above on a resident matrix; INVALID_ARGUMENT for a matrix uploaded by
  // another context.
  absl::Status Mxfp4Matmul(const DeviceMxfp4Matrix& w, const float* x, int64_t batch, float* y,
                           MatmulNumerics numerics = MatmulNumerics::kFloat);

  // True when the device can run MatmulNumerics::kIdot (it has shaderInt64).
  bool supports_idot() const;

  // out[i] = β1·tanh(g[i]/β1)·σ(g[i]) · β2·tanh(u[i]/β2) for i < n on the device
  // (shaders/situ_glu.comp; the chain's activation, exposed for its test). out may alias g or u.
  // INVALID_ARGUMENT for n < 0, null pointers (n > 0) or n over 32 bits; n == 0 does nothing.
  absl::Status SituGlu(const float* g, const float* u, int64_t n, float beta1, float beta2,
                       float* out);

  // kFloat: every job's gate and up matmuls, SiTU-GLU (β1, β2) and down matmul as ONE submission
  // (one command buffer, one fence; barriers only between the three phases), then each job's y
  // read back. Activations stay f32 throughout (the CPU's K3_IDOT=0 math up to summation order).
  // kIdot: the CPU's K3_IDOT=1 expert bit for bit, in two submissions: every job's gate and up
  // (idot), then on the host ops::SituGlu (the CPU's own, since the host libm's expf/tanhf bits
  // cannot be reproduced in a shader) and the int8 quantization of its output, then every job's
  // down (idot). INVALID_ARGUMENT for a matrix of another context, mismatched shapes (gate/up
  // [I, H], down [H, I]), negative rows, null pointers, indices over 32 bits, or (kIdot)
  // non-finite activations; jobs with rows == 0 are skipped. Thread-safe (serialised with the
  // other calls).
  absl::Status ExpertChain(std::span<const ExpertChainJob> jobs, float beta1, float beta2,
                           MatmulNumerics numerics = MatmulNumerics::kFloat);

  // Dense matrices (the shared experts, COLI_VK_DENSE). UploadDense copies an f32, int8 or
  // int4g64 view once (same residency as UploadMxfp4: staged into device-local memory when
  // staging(), else host-visible; counted in resident_bytes). INVALID_ARGUMENT for another
  // format, a malformed view (kernels::ValidateView) or more than 2^32-1 weight bytes/words;
  // RESOURCE_EXHAUSTED when the device is full (nothing stays allocated). Thread-safe.
  absl::StatusOr<std::unique_ptr<DeviceDenseMatrix>> UploadDense(const kernels::MatrixView& w);
  // Several in as few staged submissions as the staging buffer allows; all or nothing.
  absl::StatusOr<std::vector<std::unique_ptr<DeviceDenseMatrix>>> UploadDenseBatch(
      std::span<const kernels::MatrixView> views);
  // y[b*rows + r] = sum_c W[r,c] * x[b*cols + c] for b < batch on the device. kFloat
  // (shaders/dense_matmul.comp): the CPU's exact-float kernel (idot off) up to summation order.
  // kIdot: int8 and int4g64 matrices give the CPU's Matmul(idot = true) bit for bit
  // (shaders/dense_matmul_idot.comp; UNIMPLEMENTED without shaderInt64); an f32 matrix keeps the
  // f32 shader, as the CPU keeps its f32 kernel under idot (equal up to summation order).
  // Refusals as Mxfp4Matmul's; blocks until y is written.
  absl::Status DenseMatmul(const DeviceDenseMatrix& w, const float* x, int64_t batch, float* y,
                           MatmulNumerics numerics = MatmulNumerics::kFloat);
  // y[r, :] = down · SiTU(gate · x[r, :], up · x[r, :]) for r < rows: a SiTU-GLU block such as
  // Kimi K3's shared experts, gate/up [I, H], down [H, I], x and y host f32 [rows, H]. Formats
  // may differ per matrix. kFloat: one submission (gate and up, SiTU-GLU (β1, β2), down;
  // barriers between the phases). kIdot with an int8 or int4g64 matrix: the CPU's K3_IDOT=1
  // block (kernels::Matmul(idot) per matrix, ops::SituGlu) bit for bit where no matrix is f32,
  // as ExpertChain's kIdot: gate and up, SiTU-GLU on the host, down (two submissions); with only
  // f32 matrices kIdot is kFloat (the CPU has no integer path for them). INVALID_ARGUMENT for
  // mismatched shapes, a matrix of another context, negative rows, null pointers (rows > 0),
  // indices over 32 bits or (kIdot) non-finite activations; UNIMPLEMENTED for kIdot without
  // shaderInt64; rows == 0 does nothing.
  absl::Status DenseGlu(const DeviceDenseMatrix& gate, const DeviceDenseMatrix& up,
                        const DeviceDenseMatrix& down, const float* x, int64_t rows, float beta1,
                        float beta2, float* y, MatmulNumerics numerics = MatmulNumerics::kFloat);

  // True when the device is a discrete GPU (VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU): where
  // COLI_VK_DENSE=auto puts the shared experts on it.
  bool discrete_gpu() const;
  // Test hook: the next `n` step submissions (matmuls, chains, SiTU) fail as
  // VK_ERROR_DEVICE_LOST would (INTERNAL), before anything is submitted.
  void FailSubmissionsForTesting(int n);

  // Matmul dispatches completed on this context so far (3 per ExpertChain job and per DenseGlu
  // call, 1 per Mxfp4Matmul / DenseMatmul call with work). Any thread.
  uint64_t matmuls() const;

 private:
  explicit VulkanContext(std::unique_ptr<internal::VulkanState> state);
  std::unique_ptr<internal::VulkanState> state_;
};

// The name of a VkResult code ("VK_ERROR_DEVICE_LOST"), or "VkResult(<n>)" for an unknown one.
// Takes the raw int so this header needs no Vulkan include.
std::string VkResultName(int32_t result);

}  // namespace coli::vulkan

#endif  // COLI_COMMON_VULKAN_VULKAN_CONTEXT_H_
