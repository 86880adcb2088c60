// common/vk: the compute context (instance, device, queue, one pipeline) and the MXFP4
// matmul dispatch. Device-level calls go through a per-context VolkDeviceTable, so two contexts
// on different devices never share function pointers.
#include "common/vk/vulkan_context.h"

#include <volk.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ops/ops.h"
#include "common/status/status.h"
#include "shaders/shaders.h"

namespace coli::vulkan {
namespace {

constexpr uint32_t kWorkgroupsPerDim = 65535;  // the minimum maxComputeWorkGroupCount[0] allows
constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;
constexpr int kBindings = 4;  // weights, scales, x, y

struct PushConstants {
  uint32_t rows;
  uint32_t cols;
  uint32_t batch;
};

constexpr int kSituBindings = 3;  // g, u, out
struct SituPushConstants {
  uint32_t n;
  float beta1;
  float beta2;
};

// The context's compute pipelines. The dense matmuls share mxfp4_matmul's bindings (weights,
// scales, x, y) and push constants (PushConstants).
enum Kernel {
  kMxfp4Kernel,      // shaders/mxfp4_matmul.comp
  kMxfp4IdotKernel,  // shaders/mxfp4_matmul_idot.comp (only with shaderInt64): 4 rows per group
  kSituKernel,       // shaders/situ_glu.comp: bindings g, u, out
  kDenseF32Kernel,   // shaders/dense_matmul.comp FORMAT 0
  kDenseInt8Kernel,  // ... FORMAT 1
  kDenseInt4Kernel,  // ... FORMAT 2
  // shaders/dense_matmul_idot.comp FORMAT 1 and 2 (only with shaderInt64): 4 rows per group.
  kDenseInt8IdotKernel,
  kDenseInt4IdotKernel,
  kKernelCount,
};

// The integer-dot kernels: int8 activations quantized on the host, shaderInt64, 4 rows per
// workgroup.
bool IsIdotKernel(int kernel) {
  return kernel == kMxfp4IdotKernel || kernel == kDenseInt8IdotKernel ||
         kernel == kDenseInt4IdotKernel;
}

absl::Status VkError(VkResult result, absl::string_view call) {
  if (result == VK_SUCCESS) return absl::OkStatus();
  const std::string text = absl::StrCat("Vulkan: ", call, " failed: ", VkResultName(result));
  switch (result) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      return absl::ResourceExhaustedError(text);
    case VK_TIMEOUT:
      return absl::DeadlineExceededError(text);
    default:
      return absl::InternalError(text);
  }
}

#define COLI_VK_RETURN_IF_ERROR(call) COLI_RETURN_IF_ERROR(VkError((call), #call))

// volkInitialize() once per process; its result is remembered.
VkResult InitializeLoader() {
  static const VkResult result = volkInitialize();
  return result;
}

int DeviceTypeRank(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

// The first queue family with compute, or -1.
int ComputeQueueFamily(VkPhysicalDevice device) {
  uint32_t n = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(device, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(device, &n, families.data());
  for (uint32_t i = 0; i < n; ++i) {
    if ((families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && families[i].queueCount > 0) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

}  // namespace

// A storage buffer: host-visible and host-coherent, mapped for its whole life, or (Placement
// kDeviceLocal) device-local and unmapped, reached only by transfers and shaders.
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  VkDeviceSize size = 0;       // bytes asked for (what descriptors may bind)
  VkDeviceSize allocated = 0;  // device memory behind it (VkMemoryRequirements::size)
};

enum class Placement { kHostMapped, kDeviceLocal };

// Every buffer of the context: a storage buffer that transfers may read and write.
VkBufferCreateInfo StorageBufferInfo(VkDeviceSize size) {
  VkBufferCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
  info.size = size;
  info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
               VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  return info;
}

// True when some memory type is device-local without being host-visible: a discrete GPU, whose
// host-visible memory is system RAM read over PCIe (or a small BAR window).
bool HasDeviceOnlyMemory(const VkPhysicalDeviceMemoryProperties& m) {
  for (uint32_t i = 0; i < m.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = m.memoryTypes[i].propertyFlags;
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && !(f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
      return true;
  }
  return false;
}

struct internal::VulkanState {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VolkDeviceTable vk{};
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  VkPhysicalDeviceProperties properties{};
  VkPhysicalDeviceMemoryProperties memory_properties{};
  int device_index = -1;
  std::string device_name;
  bool int64 = false;  // shaderInt64 enabled: the idot pipeline exists

  VkCommandPool command_pool = VK_NULL_HANDLE;
  VkCommandBuffer command_buffer = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  // One per Kernel.
  struct Pipeline {
    VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
    VkShaderModule shader = VK_NULL_HANDLE;
    VkPipeline pipeline = VK_NULL_HANDLE;
  };
  Pipeline pipelines[kKernelCount];
  std::atomic<int> fail_submissions{0};  // FailSubmissionsForTesting
  std::atomic<uint64_t> matmuls{0};  // matmul dispatches completed (VulkanContext::matmuls)

  // Staged residency (VulkanContextOptions): resident matrices in device-local memory, filled
  // from `staging` by vkCmdCopyBuffer on the upload command buffer, one fence per staging fill.
  bool staging_mode = false;
  VkDeviceSize staging_bytes = 0;
  std::atomic<uint64_t> resident_bytes{0};    // allocated bytes of live resident matrices
  std::atomic<uint64_t> upload_batches{0};    // staged submissions (fences) completed
  std::atomic<uint64_t> step_allocations{0};  // per-step buffers (re)allocated
  std::atomic<int> fail_allocations{0};       // FailAllocationsForTesting
  std::atomic<bool> fail_uploads_only{false};  // ... counting resident matrices' only

  // std::mutex rather than absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, which
  // then cannot see these locks (scripts/tsan.sh).
  std::mutex mu;  // serialises submissions: one command buffer, one descriptor set
  // Per-step buffers kept between calls (guarded by mu), grown only for a larger step:
  // activations x and outputs y (host-mapped), the chain's intermediates g, u, h (device-local
  // when staging, else host-mapped).
  Buffer step_x, step_g, step_u, step_h, step_y;
  VkDescriptorPool descriptor_pool = VK_NULL_HANDLE;  // guarded by mu; reset per submission
  uint32_t descriptor_sets = 0;                        // its capacity in sets

  std::mutex upload_mu;  // serialises uploads: staging buffer, upload command buffer and fence
  VkCommandPool upload_pool = VK_NULL_HANDLE;
  VkCommandBuffer upload_cb = VK_NULL_HANDLE;
  VkFence upload_fence = VK_NULL_HANDLE;
  Buffer staging;  // host-mapped, made at the first staged upload

  std::mutex queue_mu;  // vkQueueSubmit needs the queue externally synchronised

  ~VulkanState() {
    if (device != VK_NULL_HANDLE) {
      vk.vkDeviceWaitIdle(device);
      for (Buffer* b : {&step_x, &step_g, &step_u, &step_h, &step_y, &staging}) Free(*b);
      if (descriptor_pool) vk.vkDestroyDescriptorPool(device, descriptor_pool, nullptr);
      if (upload_fence) vk.vkDestroyFence(device, upload_fence, nullptr);
      if (upload_pool) vk.vkDestroyCommandPool(device, upload_pool, nullptr);
      for (Pipeline& p : pipelines) {
        if (p.pipeline) vk.vkDestroyPipeline(device, p.pipeline, nullptr);
        if (p.shader) vk.vkDestroyShaderModule(device, p.shader, nullptr);
        if (p.layout) vk.vkDestroyPipelineLayout(device, p.layout, nullptr);
        if (p.set_layout) vk.vkDestroyDescriptorSetLayout(device, p.set_layout, nullptr);
      }
      if (fence) vk.vkDestroyFence(device, fence, nullptr);
      if (command_pool) vk.vkDestroyCommandPool(device, command_pool, nullptr);
      vk.vkDestroyDevice(device, nullptr);
    }
    if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
  }

  void Free(Buffer& b) {
    if (b.mapped) vk.vkUnmapMemory(device, b.memory);
    if (b.buffer) vk.vkDestroyBuffer(device, b.buffer, nullptr);
    if (b.memory) vk.vkFreeMemory(device, b.memory, nullptr);
    b = Buffer{};
  }

  // check_range = false for buffers bound only in pieces (each piece checked by the caller).
  // kHostMapped: device-local and host-visible where the device has it (integrated GPUs,
  // lavapipe, resizable BAR), else any host-visible coherent type; mapped. kDeviceLocal: a
  // device-local type that is not host-visible (discrete VRAM) first, else any device-local
  // type, else any type; never mapped.
  absl::Status Allocate(VkDeviceSize size, absl::string_view what, Buffer& b,
                        bool check_range = true, Placement placement = Placement::kHostMapped,
                        bool resident = false) {
    if (check_range && size > properties.limits.maxStorageBufferRange) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Vulkan: ", what, " buffer of ", size,
                       " bytes exceeds the device's maxStorageBufferRange (",
                       properties.limits.maxStorageBufferRange, ") on ", device_name));
    }
    b.size = size;
    const VkBufferCreateInfo info = StorageBufferInfo(size);
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkCreateBuffer(device, &info, nullptr, &b.buffer), "vkCreateBuffer"), what));
    VkMemoryRequirements req;
    vk.vkGetBufferMemoryRequirements(device, b.buffer, &req);
    const uint32_t type = MemoryType(req.memoryTypeBits, placement);
    if (type == UINT32_MAX) {
      return absl::UnavailableError(
          absl::StrCat("Vulkan: ", device_name,
                       " has no host-visible coherent memory type for the ", what, " buffer"));
    }
    VkMemoryAllocateInfo alloc{};
    alloc.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = type;
    int pending = (resident || !fail_uploads_only.load()) ? fail_allocations.load() : 0;
    while (pending > 0 && !fail_allocations.compare_exchange_weak(pending, pending - 1)) {
    }
    if (pending > 0) {
      return Annotate(
          VkError(VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkAllocateMemory (FailAllocationsForTesting)"),
          what);
    }
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkAllocateMemory(device, &alloc, nullptr, &b.memory), "vkAllocateMemory"),
        what));
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkBindBufferMemory(device, b.buffer, b.memory, 0), "vkBindBufferMemory"), what));
    if (placement == Placement::kHostMapped) {
      COLI_RETURN_IF_ERROR(Annotate(
          VkError(vk.vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory"),
          what));
    }
    b.allocated = req.size;  // only a complete buffer counts (resident_bytes)
    return absl::OkStatus();
  }

  // The memory type for `placement` among `allowed` (a memoryTypeBits mask), or UINT32_MAX.
  uint32_t MemoryType(uint32_t allowed, Placement placement) const {
    const VkMemoryPropertyFlags host =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    struct Want {
      VkMemoryPropertyFlags required, forbidden;
    };
    std::vector<Want> wants;
    if (placement == Placement::kHostMapped) {
      wants = {{host | local, 0}, {host, 0}};
    } else {
      wants = {{local, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT}, {local, 0}, {0, 0}};
    }
    for (const Want& want : wants) {
      for (uint32_t i = 0; i < memory_properties.memoryTypeCount; ++i) {
        const VkMemoryPropertyFlags f = memory_properties.memoryTypes[i].propertyFlags;
        if ((allowed & (1u << i)) && (f & want.required) == want.required &&
            (f & want.forbidden) == 0) {
          return i;
        }
      }
    }
    return UINT32_MAX;
  }

  // Makes `b` hold at least `size` bytes, keeping it when it already does (a per-step buffer).
  // Grows by at least half again so a slowly growing step does not reallocate every call.
  absl::Status Ensure(Buffer& b, VkDeviceSize size, absl::string_view what, Placement placement) {
    if (b.buffer != VK_NULL_HANDLE && b.size >= size) return absl::OkStatus();
    const VkDeviceSize grown = std::max<VkDeviceSize>(size, b.size + b.size / 2);
    Free(b);
    step_allocations.fetch_add(1, std::memory_order_relaxed);
    absl::Status status = Allocate(grown, what, b, /*check_range=*/false, placement);
    if (!status.ok()) Free(b);
    return status;
  }

  // Placement of the chain's intermediates, which the host never reads.
  Placement InnerPlacement() const {
    return staging_mode ? Placement::kDeviceLocal : Placement::kHostMapped;
  }

  // Submits the recorded `cb` on the queue, waits for `f` and resets it. Any thread.
  absl::Status SubmitAndWait(VkCommandBuffer cb, VkFence f, absl::string_view what) {
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cb;
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      COLI_VK_RETURN_IF_ERROR(vk.vkQueueSubmit(queue, 1, &submit, f));
    }
    const VkResult waited = vk.vkWaitForFences(device, 1, &f, VK_TRUE, kFenceTimeoutNs);
    const VkResult reset = vk.vkResetFences(device, 1, &f);
    COLI_RETURN_IF_ERROR(VkError(waited, absl::StrCat("vkWaitForFences (", what, ")")));
    COLI_VK_RETURN_IF_ERROR(reset);
    return absl::OkStatus();
  }

  // One host -> device copy of a staged upload: `size` bytes from `src` into `dst` at 0.
  struct StagedCopy {
    const uint8_t* src;
    VkBuffer dst;
    VkDeviceSize size;
  };

  // Copies every piece through the staging buffer: fills it, records vkCmdCopyBuffer for each
  // piece (pieces larger than the buffer go in chunks), and per fill ends with a transfer ->
  // compute barrier, one submission and one fence wait. Serialised by upload_mu, independent of
  // `mu`, so an upload never waits for a step's submission to finish (nor a step for it).
  absl::Status UploadStaged(std::span<const StagedCopy> copies) {
    std::lock_guard<std::mutex> lock(upload_mu);
    if (staging.buffer == VK_NULL_HANDLE) {
      absl::Status status =
          Allocate(staging_bytes, "staging", staging, /*check_range=*/false, Placement::kHostMapped);
      if (!status.ok()) {
        Free(staging);
        return status;
      }
    }
    bool recording = false;
    VkDeviceSize used = 0;
    auto begin = [&]() -> absl::Status {
      COLI_VK_RETURN_IF_ERROR(vk.vkResetCommandBuffer(upload_cb, 0));
      VkCommandBufferBeginInfo info{};
      info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
      info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
      COLI_VK_RETURN_IF_ERROR(vk.vkBeginCommandBuffer(upload_cb, &info));
      recording = true;
      used = 0;
      return absl::OkStatus();
    };
    auto flush = [&]() -> absl::Status {
      recording = false;
      VkMemoryBarrier to_compute{};
      to_compute.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
      to_compute.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
      to_compute.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
      vk.vkCmdPipelineBarrier(upload_cb, VK_PIPELINE_STAGE_TRANSFER_BIT,
                              VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &to_compute, 0, nullptr,
                              0, nullptr);
      COLI_VK_RETURN_IF_ERROR(vk.vkEndCommandBuffer(upload_cb));
      COLI_RETURN_IF_ERROR(SubmitAndWait(upload_cb, upload_fence, "staged upload"));
      upload_batches.fetch_add(1, std::memory_order_relaxed);
      return absl::OkStatus();
    };
    constexpr VkDeviceSize kAlign = 256;  // staging offsets (optimalBufferCopyOffsetAlignment)
    absl::Status status;
    for (const StagedCopy& c : copies) {
      for (VkDeviceSize done = 0; done < c.size && status.ok();) {
        if (!recording) status = begin();
        if (!status.ok()) break;
        const VkDeviceSize room = staging_bytes - used;
        if (room == 0) {
          status = flush();
          continue;
        }
        const VkDeviceSize n = std::min(room, c.size - done);
        std::memcpy(static_cast<uint8_t*>(staging.mapped) + used, c.src + done, n);
        const VkBufferCopy region{used, done, n};
        vk.vkCmdCopyBuffer(upload_cb, staging.buffer, c.dst, 1, &region);
        done += n;
        used = std::min(staging_bytes, (used + n + kAlign - 1) / kAlign * kAlign);
      }
      if (!status.ok()) break;
    }
    if (status.ok() && recording) status = flush();
    if (!status.ok() && recording) vk.vkEndCommandBuffer(upload_cb);
    return status;
  }

  // Best wall time of `reps` submissions of one vkCmdCopyBuffer of `bytes` from `src` to `dst`
  // (the bench's probes). Serialised with uploads.
  absl::StatusOr<double> TimeCopy(const Buffer& src, const Buffer& dst, VkDeviceSize bytes,
                                  int reps) {
    std::lock_guard<std::mutex> lock(upload_mu);
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      COLI_VK_RETURN_IF_ERROR(vk.vkResetCommandBuffer(upload_cb, 0));
      VkCommandBufferBeginInfo info{};
      info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
      COLI_VK_RETURN_IF_ERROR(vk.vkBeginCommandBuffer(upload_cb, &info));
      const VkBufferCopy region{0, 0, bytes};
      vk.vkCmdCopyBuffer(upload_cb, src.buffer, dst.buffer, 1, &region);
      COLI_VK_RETURN_IF_ERROR(vk.vkEndCommandBuffer(upload_cb));
      const auto t0 = std::chrono::steady_clock::now();
      COLI_RETURN_IF_ERROR(SubmitAndWait(upload_cb, upload_fence, "copy probe"));
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0 || t < best) best = t;
    }
    return best;
  }

  // `requested`: a device index, -1 = the best one; `name` spells where it came from in errors.
  absl::Status PickDevice(int requested, const std::string& name) {
    uint32_t n = 0;
    COLI_VK_RETURN_IF_ERROR(vkEnumeratePhysicalDevices(instance, &n, nullptr));
    if (n == 0) {
      return absl::UnavailableError(
          "Vulkan: no physical device (install a driver, e.g. mesa-vulkan-drivers for lavapipe)");
    }
    std::vector<VkPhysicalDevice> devices(n);
    COLI_VK_RETURN_IF_ERROR(vkEnumeratePhysicalDevices(instance, &n, devices.data()));
    devices.resize(n);

    int chosen = -1;
    if (requested >= 0) {
      if (requested >= static_cast<int>(n)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": expected a device index in [0, ", n, ")"));
      }
      if (ComputeQueueFamily(devices[requested]) < 0) {
        return absl::UnavailableError(absl::StrCat("Vulkan: ", name, " has no compute queue"));
      }
      chosen = requested;
    } else {
      int best_rank = std::numeric_limits<int>::max();
      for (uint32_t i = 0; i < n; ++i) {
        if (ComputeQueueFamily(devices[i]) < 0) continue;
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(devices[i], &p);
        if (DeviceTypeRank(p.deviceType) < best_rank) {
          best_rank = DeviceTypeRank(p.deviceType);
          chosen = static_cast<int>(i);
        }
      }
      if (chosen < 0) {
        return absl::UnavailableError(
            absl::StrCat("Vulkan: none of the ", n, " physical devices has a compute queue"));
      }
    }
    physical = devices[chosen];
    device_index = chosen;
    queue_family = static_cast<uint32_t>(ComputeQueueFamily(physical));
    vkGetPhysicalDeviceProperties(physical, &properties);
    vkGetPhysicalDeviceMemoryProperties(physical, &memory_properties);
    device_name = properties.deviceName;
    return absl::OkStatus();
  }

  absl::Status CreateDevice(bool use_int64) {
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info{};
    queue_info.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    queue_info.queueFamilyIndex = queue_family;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    // shaderInt64 when the device has it: the idot shader's exact integer arithmetic.
    VkPhysicalDeviceFeatures available{};
    vkGetPhysicalDeviceFeatures(physical, &available);
    VkPhysicalDeviceFeatures enabled{};
    int64 = use_int64 && available.shaderInt64 == VK_TRUE;
    enabled.shaderInt64 = int64 ? VK_TRUE : VK_FALSE;
    VkDeviceCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    info.queueCreateInfoCount = 1;
    info.pQueueCreateInfos = &queue_info;
    info.pEnabledFeatures = &enabled;
    COLI_VK_RETURN_IF_ERROR(vkCreateDevice(physical, &info, nullptr, &device));
    volkLoadDeviceTable(&vk, device);
    vk.vkGetDeviceQueue(device, queue_family, 0, &queue);

    VkCommandPoolCreateInfo pool_info{};
    pool_info.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pool_info.queueFamilyIndex = queue_family;
    COLI_VK_RETURN_IF_ERROR(vk.vkCreateCommandPool(device, &pool_info, nullptr, &command_pool));
    VkCommandBufferAllocateInfo cb_info{};
    cb_info.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cb_info.commandPool = command_pool;
    cb_info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cb_info.commandBufferCount = 1;
    COLI_VK_RETURN_IF_ERROR(vk.vkAllocateCommandBuffers(device, &cb_info, &command_buffer));
    VkFenceCreateInfo fence_info{};
    fence_info.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    COLI_VK_RETURN_IF_ERROR(vk.vkCreateFence(device, &fence_info, nullptr, &fence));
    // The uploads' own pool, command buffer and fence (command pools are externally
    // synchronised, so uploads cannot share the step's).
    COLI_VK_RETURN_IF_ERROR(vk.vkCreateCommandPool(device, &pool_info, nullptr, &upload_pool));
    cb_info.commandPool = upload_pool;
    COLI_VK_RETURN_IF_ERROR(vk.vkAllocateCommandBuffers(device, &cb_info, &upload_cb));
    COLI_VK_RETURN_IF_ERROR(vk.vkCreateFence(device, &fence_info, nullptr, &upload_fence));
    return absl::OkStatus();
  }

  // A compute pipeline over `bindings` storage buffers with `push_bytes` of push constants.
  absl::Status CreateComputePipeline(int bindings_count, uint32_t push_bytes,
                                     std::span<const uint32_t> code, absl::string_view name,
                                     VkDescriptorSetLayout* set_layout_out,
                                     VkPipelineLayout* layout_out, VkShaderModule* shader_out,
                                     VkPipeline* pipeline_out) {
    std::vector<VkDescriptorSetLayoutBinding> bindings(bindings_count);
    for (int i = 0; i < bindings_count; ++i) {
      bindings[i] = VkDescriptorSetLayoutBinding{};
      bindings[i].binding = static_cast<uint32_t>(i);
      bindings[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      bindings[i].descriptorCount = 1;
      bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo set_info{};
    set_info.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    set_info.bindingCount = static_cast<uint32_t>(bindings_count);
    set_info.pBindings = bindings.data();
    COLI_VK_RETURN_IF_ERROR(
        vk.vkCreateDescriptorSetLayout(device, &set_info, nullptr, set_layout_out));

    VkPushConstantRange push{};
    push.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    push.size = push_bytes;
    VkPipelineLayoutCreateInfo layout_info{};
    layout_info.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    layout_info.setLayoutCount = 1;
    layout_info.pSetLayouts = set_layout_out;
    layout_info.pushConstantRangeCount = 1;
    layout_info.pPushConstantRanges = &push;
    COLI_VK_RETURN_IF_ERROR(
        vk.vkCreatePipelineLayout(device, &layout_info, nullptr, layout_out));

    VkShaderModuleCreateInfo module_info{};
    module_info.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    module_info.codeSize = code.size_bytes();
    module_info.pCode = code.data();
    COLI_RETURN_IF_ERROR(
        Annotate(VkError(vk.vkCreateShaderModule(device, &module_info, nullptr, shader_out),
                         "vkCreateShaderModule"),
                 absl::StrCat("shader ", name)));

    VkComputePipelineCreateInfo pipe_info{};
    pipe_info.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    pipe_info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    pipe_info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    pipe_info.stage.module = *shader_out;
    pipe_info.stage.pName = "main";
    pipe_info.layout = *layout_out;
    return Annotate(VkError(vk.vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &pipe_info,
                                                        nullptr, pipeline_out),
                            "vkCreateComputePipelines"),
                    absl::StrCat("shader ", name));
  }

  absl::Status CreatePipeline() {
    struct Spec {
      Kernel kernel;
      int bindings;
      uint32_t push_bytes;
      std::span<const uint32_t> code;
      const char* name;
    };
    const Spec specs[] = {
        {kMxfp4Kernel, kBindings, sizeof(PushConstants), shaders::Mxfp4MatmulSpirv(),
         "mxfp4_matmul"},
        {kMxfp4IdotKernel, kBindings, sizeof(PushConstants), shaders::Mxfp4MatmulIdotSpirv(),
         "mxfp4_matmul_idot"},
        {kSituKernel, kSituBindings, sizeof(SituPushConstants), shaders::SituGluSpirv(),
         "situ_glu"},
        {kDenseF32Kernel, kBindings, sizeof(PushConstants), shaders::DenseMatmulF32Spirv(),
         "dense_matmul (f32)"},
        {kDenseInt8Kernel, kBindings, sizeof(PushConstants), shaders::DenseMatmulInt8Spirv(),
         "dense_matmul (int8)"},
        {kDenseInt4Kernel, kBindings, sizeof(PushConstants), shaders::DenseMatmulInt4Spirv(),
         "dense_matmul (int4g64)"},
        {kDenseInt8IdotKernel, kBindings, sizeof(PushConstants),
         shaders::DenseMatmulIdotInt8Spirv(), "dense_matmul_idot (int8)"},
        {kDenseInt4IdotKernel, kBindings, sizeof(PushConstants),
         shaders::DenseMatmulIdotInt4Spirv(), "dense_matmul_idot (int4g64)"},
    };
    for (const Spec& spec : specs) {
      if (IsIdotKernel(spec.kernel) && !int64) continue;
      Pipeline& p = pipelines[spec.kernel];
      COLI_RETURN_IF_ERROR(CreateComputePipeline(spec.bindings, spec.push_bytes, spec.code,
                                                 spec.name, &p.set_layout, &p.layout, &p.shader,
                                                 &p.pipeline));
    }
    return absl::OkStatus();
  }

  // One dispatch of a recorded chain: a pipeline, its buffers (bound at an offset) and push
  // constants. Dispatches of one `phase` run without barriers between them; a barrier (shader
  // write -> shader read) separates consecutive phases.
  struct Segment {
    VkBuffer buffer;
    VkDeviceSize offset;
    VkDeviceSize range;
  };
  struct Dispatch {
    Kernel kernel = kMxfp4Kernel;
    int phase = 0;
    Segment segments[kBindings]{};
    uint32_t push[3]{};
    uint32_t groups_x = 1, groups_y = 1;
    bool is_matmul() const { return kernel != kSituKernel; }
  };

  // Records every dispatch in one command buffer, submits it once and waits for the fence.
  // Caller holds `mu`.
  absl::Status RunDispatches(std::span<const Dispatch> dispatches, absl::string_view what) {
    if (dispatches.empty()) return absl::OkStatus();
    // One descriptor pool kept between submissions (reset each time), grown for a larger one.
    const uint32_t sets = static_cast<uint32_t>(dispatches.size());
    if (descriptor_pool != VK_NULL_HANDLE && descriptor_sets < sets) {
      vk.vkDestroyDescriptorPool(device, descriptor_pool, nullptr);
      descriptor_pool = VK_NULL_HANDLE;
    }
    if (descriptor_pool == VK_NULL_HANDLE) {
      const uint32_t capacity = std::max(sets, descriptor_sets + descriptor_sets / 2);
      VkDescriptorPoolSize pool_size{};
      pool_size.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      pool_size.descriptorCount = capacity * kBindings;
      VkDescriptorPoolCreateInfo pool_info{};
      pool_info.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
      pool_info.maxSets = capacity;
      pool_info.poolSizeCount = 1;
      pool_info.pPoolSizes = &pool_size;
      descriptor_sets = 0;
      COLI_VK_RETURN_IF_ERROR(
          vk.vkCreateDescriptorPool(device, &pool_info, nullptr, &descriptor_pool));
      descriptor_sets = capacity;
    } else {
      COLI_VK_RETURN_IF_ERROR(vk.vkResetDescriptorPool(device, descriptor_pool, 0));
    }
    return RecordAndSubmit(descriptor_pool, dispatches, what);
  }

  absl::Status RecordAndSubmit(VkDescriptorPool pool, std::span<const Dispatch> dispatches,
                               absl::string_view what) {
    std::vector<VkDescriptorSetLayout> layouts(dispatches.size());
    for (size_t i = 0; i < dispatches.size(); ++i)
      layouts[i] = pipelines[dispatches[i].kernel].set_layout;
    std::vector<VkDescriptorSet> sets(dispatches.size());
    VkDescriptorSetAllocateInfo ds_info{};
    ds_info.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    ds_info.descriptorPool = pool;
    ds_info.descriptorSetCount = static_cast<uint32_t>(sets.size());
    ds_info.pSetLayouts = layouts.data();
    COLI_VK_RETURN_IF_ERROR(vk.vkAllocateDescriptorSets(device, &ds_info, sets.data()));
    std::vector<VkDescriptorBufferInfo> infos;
    std::vector<VkWriteDescriptorSet> writes;
    infos.reserve(dispatches.size() * kBindings);
    for (const Dispatch& d : dispatches) {
      if (d.groups_y > properties.limits.maxComputeWorkGroupCount[1]) {
        return absl::InvalidArgumentError(
            absl::StrCat("Vulkan: ", d.push[0], " rows need ", d.groups_y,
                         " workgroup rows, more than the device's maxComputeWorkGroupCount[1]"));
      }
    }
    for (size_t i = 0; i < dispatches.size(); ++i) {
      const int n = dispatches[i].kernel == kSituKernel ? kSituBindings : kBindings;
      for (int b = 0; b < n; ++b) {
        const Segment& seg = dispatches[i].segments[b];
        infos.push_back(VkDescriptorBufferInfo{seg.buffer, seg.offset, seg.range});
        VkWriteDescriptorSet w{};
        w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w.dstSet = sets[i];
        w.dstBinding = static_cast<uint32_t>(b);
        w.descriptorCount = 1;
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &infos.back();
        writes.push_back(w);
      }
    }
    vk.vkUpdateDescriptorSets(device, static_cast<uint32_t>(writes.size()), writes.data(), 0,
                              nullptr);

    COLI_VK_RETURN_IF_ERROR(vk.vkResetCommandBuffer(command_buffer, 0));
    VkCommandBufferBeginInfo begin{};
    begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    COLI_VK_RETURN_IF_ERROR(vk.vkBeginCommandBuffer(command_buffer, &begin));
    VkMemoryBarrier between{};
    between.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    between.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    between.dstAccessMask = VK_ACCESS_SHADER_READ_BIT;
    for (size_t i = 0; i < dispatches.size(); ++i) {
      const Dispatch& d = dispatches[i];
      if (i > 0 && d.phase != dispatches[i - 1].phase) {
        vk.vkCmdPipelineBarrier(command_buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &between, 0, nullptr,
                                0, nullptr);
      }
      const VkPipelineLayout layout = pipelines[d.kernel].layout;
      vk.vkCmdBindPipeline(command_buffer, VK_PIPELINE_BIND_POINT_COMPUTE,
                           pipelines[d.kernel].pipeline);
      vk.vkCmdBindDescriptorSets(command_buffer, VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1,
                                 &sets[i], 0, nullptr);
      vk.vkCmdPushConstants(command_buffer, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(d.push),
                            d.push);
      vk.vkCmdDispatch(command_buffer, d.groups_x, d.groups_y, 1);
    }
    VkMemoryBarrier to_host{};
    to_host.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    to_host.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    to_host.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vk.vkCmdPipelineBarrier(command_buffer, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                            VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &to_host, 0, nullptr, 0, nullptr);
    COLI_VK_RETURN_IF_ERROR(vk.vkEndCommandBuffer(command_buffer));
    int pending = fail_submissions.load();
    while (pending > 0 && !fail_submissions.compare_exchange_weak(pending, pending - 1)) {
    }
    if (pending > 0) {
      return VkError(VK_ERROR_DEVICE_LOST,
                     absl::StrCat("vkQueueSubmit (", what, ", FailSubmissionsForTesting)"));
    }
    COLI_RETURN_IF_ERROR(SubmitAndWait(command_buffer, fence, what));
    uint64_t n_matmuls = 0;
    for (const Dispatch& d : dispatches) n_matmuls += d.is_matmul() ? 1 : 0;
    matmuls.fetch_add(n_matmuls, std::memory_order_relaxed);
    return absl::OkStatus();
  }
};

VulkanContext::VulkanContext(std::unique_ptr<internal::VulkanState> state)
    : state_(std::move(state)) {}
VulkanContext::~VulkanContext() = default;

const std::string& VulkanContext::device_name() const { return state_->device_name; }
int VulkanContext::device_index() const { return state_->device_index; }

absl::StatusOr<std::unique_ptr<VulkanContext>> VulkanContext::Create() {
  return Create(VulkanContextOptions{});
}

absl::StatusOr<std::unique_ptr<VulkanContext>> VulkanContext::Create(
    const VulkanContextOptions& options) {
  bool force_staging = options.force_staging.value_or(false);
  if (const char* env = std::getenv("COLI_VK_STAGING");
      !options.force_staging.has_value() && env != nullptr && *env != '\0') {
    if (std::strcmp(env, "1") == 0) {
      force_staging = true;
    } else if (std::strcmp(env, "0") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("COLI_VK_STAGING='", env, "': expected 0 or 1"));
    }
  }
  int device_index = -1;  // the best one
  std::string device_name;
  if (options.device_index.has_value()) {
    device_index = *options.device_index;
    device_name = absl::StrCat("COLI_VK_DEVICE='", device_index, "'");
    if (device_index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(device_name, ": expected a device index, 0 or more"));
    }
  } else if (const char* env = std::getenv("COLI_VK_DEVICE"); env != nullptr && *env != '\0') {
    device_name = absl::StrCat("COLI_VK_DEVICE='", env, "'");
    if (!absl::SimpleAtoi(env, &device_index) || device_index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(device_name, ": expected a device index, 0 or more"));
    }
  }
  if (options.staging_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "VulkanContextOptions.staging_bytes = ", options.staging_bytes, ": expected >= 4096"));
  }
  if (const VkResult r = InitializeLoader(); r != VK_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("Vulkan: no loader (libvulkan.so.1 could not be loaded: ", VkResultName(r),
                     "); install libvulkan1 and a driver, e.g. mesa-vulkan-drivers"));
  }
  auto state = std::make_unique<internal::VulkanState>();
  VkApplicationInfo app{};
  app.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO;
  app.pApplicationName = "coli";
  app.pEngineName = "coli";
  app.apiVersion = VK_API_VERSION_1_0;
  VkInstanceCreateInfo info{};
  info.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
  info.pApplicationInfo = &app;
  if (const VkResult r = vkCreateInstance(&info, nullptr, &state->instance); r != VK_SUCCESS) {
    state->instance = VK_NULL_HANDLE;
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER) {
      return absl::UnavailableError(
          "Vulkan: vkCreateInstance found no driver (VK_ERROR_INCOMPATIBLE_DRIVER); install one, "
          "e.g. mesa-vulkan-drivers for lavapipe");
    }
    return VkError(r, "vkCreateInstance");
  }
  volkLoadInstanceOnly(state->instance);
  COLI_RETURN_IF_ERROR(state->PickDevice(device_index, device_name));
  COLI_RETURN_IF_ERROR(Annotate(state->CreateDevice(options.use_int64), state->device_name));
  COLI_RETURN_IF_ERROR(Annotate(state->CreatePipeline(), state->device_name));
  state->staging_mode = force_staging || HasDeviceOnlyMemory(state->memory_properties);
  state->staging_bytes = options.staging_bytes;
  return std::unique_ptr<VulkanContext>(new VulkanContext(std::move(state)));
}

// A resident matrix's device buffers (both kinds of resident matrix): weight bytes and f32
// scales (none for a dense f32 matrix), counted in resident_bytes while they live.
struct ResidentBuffers {
  internal::VulkanState* state = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Buffer weights;
  Buffer scales;
  ~ResidentBuffers() {
    state->resident_bytes.fetch_sub(weights.allocated + scales.allocated,
                                    std::memory_order_relaxed);
    state->Free(weights);
    state->Free(scales);
  }
  // Allocates `b` (`bytes` > 0) as a resident buffer in `placement` and counts it.
  absl::Status Allocate(Buffer& b, VkDeviceSize bytes, absl::string_view what,
                        Placement placement) {
    COLI_RETURN_IF_ERROR(state->Allocate(bytes, what, b, true, placement, /*resident=*/true));
    state->resident_bytes.fetch_add(b.allocated, std::memory_order_relaxed);
    return absl::OkStatus();
  }
};

struct DeviceMxfp4Matrix::Impl : ResidentBuffers {};
struct DeviceDenseMatrix::Impl : ResidentBuffers {
  kernels::WeightFormat format = kernels::WeightFormat::kF32;
};

// Fills a resident buffer with `n` bytes from `src`: straight into mapped memory, or (staged)
// queued as a copy for UploadStaged; `src` must then live until the copies are done.
void FillResident(const Buffer& b, const void* src, size_t n,
                  std::vector<internal::VulkanState::StagedCopy>* copies) {
  if (n == 0) return;
  if (b.mapped != nullptr) {
    std::memcpy(b.mapped, src, n);
  } else {
    copies->push_back({static_cast<const uint8_t*>(src), b.buffer, n});
  }
}

DeviceMxfp4Matrix::DeviceMxfp4Matrix(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceMxfp4Matrix::~DeviceMxfp4Matrix() = default;
int64_t DeviceMxfp4Matrix::rows() const { return impl_->rows; }
int64_t DeviceMxfp4Matrix::cols() const { return impl_->cols; }
size_t DeviceMxfp4Matrix::device_bytes() const {
  return impl_->weights.allocated + impl_->scales.allocated;
}

namespace {

constexpr uint64_t kMaxIndex = std::numeric_limits<uint32_t>::max();

absl::Status CheckMxfp4View(const kernels::MatrixView& w) {
  if (w.format != kernels::WeightFormat::kMxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Vulkan Mxfp4Matmul: expected an mxfp4 matrix, got ", kernels::WeightFormatName(w.format)));
  }
  COLI_RETURN_IF_ERROR(Annotate(kernels::ValidateView(w), "Vulkan Mxfp4Matmul"));
  // The shader indexes weight words (rows*cols/8) with 32-bit uints.
  const uint64_t rows = static_cast<uint64_t>(w.rows);
  const uint64_t cols = static_cast<uint64_t>(w.cols);
  if (rows > kMaxIndex || cols > kMaxIndex || rows * cols / 8 > kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat("Vulkan Mxfp4Matmul: matrix [", rows, ", ", cols,
                                                   "] exceeds the shader's 32-bit indices"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Workgroups for `rows` matmul rows (one workgroup per row, spilling into y past 65535).
void MatmulGroups(uint32_t rows, uint32_t* x, uint32_t* y) {
  *x = rows < kWorkgroupsPerDim ? rows : kWorkgroupsPerDim;
  *y = (rows + *x - 1) / *x;
}

// Workgroups of a matmul `kernel` over `rows` rows (the idot shaders compute 4 rows per group).
void KernelGroups(int kernel, uint32_t rows, uint32_t* x, uint32_t* y) {
  const uint64_t groups = IsIdotKernel(kernel) ? (uint64_t{rows} + 3) / 4 : rows;
  MatmulGroups(static_cast<uint32_t>(groups), x, y);
}

uint32_t SituGroups(uint64_t n) {
  const uint64_t groups = (n + 63) / 64;
  return static_cast<uint32_t>(groups < kWorkgroupsPerDim ? groups : kWorkgroupsPerDim);
}

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMxfp4Matrix>> VulkanContext::UploadMxfp4(
    const kernels::MatrixView& w) {
  COLI_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<DeviceMxfp4Matrix>> one,
                        UploadMxfp4Batch(std::span(&w, 1)));
  return std::move(one[0]);
}

absl::StatusOr<std::vector<std::unique_ptr<DeviceMxfp4Matrix>>> VulkanContext::UploadMxfp4Batch(
    std::span<const kernels::MatrixView> views) {
  for (const kernels::MatrixView& w : views) COLI_RETURN_IF_ERROR(CheckMxfp4View(w));
  internal::VulkanState& s = *state_;
  const Placement placement = s.staging_mode ? Placement::kDeviceLocal : Placement::kHostMapped;
  std::vector<std::unique_ptr<DeviceMxfp4Matrix>> out;
  // The E8M0 exponents widened to f32, exactly as the CPU decodes (staged path: kept here until
  // the copies are done).
  std::vector<std::vector<float>> widened;
  std::vector<internal::VulkanState::StagedCopy> copies;
  for (const kernels::MatrixView& w : views) {
    auto impl = std::make_unique<DeviceMxfp4Matrix::Impl>();
    impl->state = &s;
    impl->rows = w.rows;
    impl->cols = w.cols;
    DeviceMxfp4Matrix::Impl& m = *impl;
    out.push_back(std::unique_ptr<DeviceMxfp4Matrix>(new DeviceMxfp4Matrix(std::move(impl))));
    if (w.rows == 0) continue;
    const kernels::MatrixBytes bytes = kernels::FormatBytes(w.format, w.rows, w.cols);
    COLI_RETURN_IF_ERROR(m.Allocate(m.weights, bytes.data, "mxfp4 weights", placement));
    COLI_RETURN_IF_ERROR(
        m.Allocate(m.scales, bytes.scales * sizeof(float), "mxfp4 scales", placement));
    const uint8_t* e8m0 = static_cast<const uint8_t*>(w.scales);
    // The e2m1 bytes as they are.
    FillResident(m.weights, w.data, bytes.data, &copies);
    if (placement == Placement::kHostMapped) {
      float* scales = static_cast<float*>(m.scales.mapped);
      for (size_t i = 0; i < bytes.scales; ++i) scales[i] = kernels::E8m0ToF32(e8m0[i]);
      continue;
    }
    std::vector<float>& f = widened.emplace_back(bytes.scales);
    for (size_t i = 0; i < bytes.scales; ++i) f[i] = kernels::E8m0ToF32(e8m0[i]);
    FillResident(m.scales, f.data(), bytes.scales * sizeof(float), &copies);
  }
  if (!copies.empty()) COLI_RETURN_IF_ERROR(Annotate(s.UploadStaged(copies), s.device_name));
  return out;
}

bool VulkanContext::staging() const { return state_->staging_mode; }

uint64_t VulkanContext::resident_bytes() const {
  return state_->resident_bytes.load(std::memory_order_relaxed);
}

uint64_t VulkanContext::upload_batches() const {
  return state_->upload_batches.load(std::memory_order_relaxed);
}

uint64_t VulkanContext::step_allocations() const {
  return state_->step_allocations.load(std::memory_order_relaxed);
}

void VulkanContext::FailAllocationsForTesting(int n, bool uploads_only) {
  state_->fail_uploads_only.store(uploads_only);
  state_->fail_allocations.store(n);
}

absl::StatusOr<uint64_t> VulkanContext::Mxfp4DeviceBytes(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Vulkan Mxfp4DeviceBytes: bad mxfp4 shape [", rows, ", ", cols, "]"));
  }
  if (rows == 0) return 0;
  internal::VulkanState& s = *state_;
  const kernels::MatrixBytes bytes = kernels::FormatBytes(kernels::WeightFormat::kMxfp4, rows, cols);
  uint64_t total = 0;
  for (const VkDeviceSize size : {static_cast<VkDeviceSize>(bytes.data),
                                  static_cast<VkDeviceSize>(bytes.scales * sizeof(float))}) {
    const VkBufferCreateInfo info = StorageBufferInfo(size);
    VkBuffer buffer = VK_NULL_HANDLE;
    COLI_RETURN_IF_ERROR(
        VkError(s.vk.vkCreateBuffer(s.device, &info, nullptr, &buffer), "vkCreateBuffer"));
    VkMemoryRequirements req;
    s.vk.vkGetBufferMemoryRequirements(s.device, buffer, &req);
    s.vk.vkDestroyBuffer(s.device, buffer, nullptr);
    total += req.size;
  }
  return total;
}

absl::StatusOr<double> VulkanContext::TimeCopy(CopyKind kind, uint64_t bytes, int reps) {
  if (bytes == 0 || reps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Vulkan TimeCopy: bytes ", bytes, " and reps ", reps, " must be positive"));
  }
  internal::VulkanState& s = *state_;
  Buffer src, dst;
  auto release = [&] {
    s.Free(src);
    s.Free(dst);
  };
  const Placement src_placement =
      kind == CopyKind::kHostToDevice ? Placement::kHostMapped : Placement::kDeviceLocal;
  absl::Status status = s.Allocate(bytes, "copy probe source", src, false, src_placement);
  if (status.ok()) {
    status = s.Allocate(bytes, "copy probe destination", dst, false, Placement::kDeviceLocal);
  }
  if (!status.ok()) {
    release();
    return status;
  }
  if (src.mapped != nullptr) std::memset(src.mapped, 0x5a, bytes);
  absl::StatusOr<double> best = s.TimeCopy(src, dst, bytes, reps);
  release();
  return best;
}

absl::Status VulkanContext::Mxfp4Matmul(const kernels::MatrixView& w, const float* x, int64_t batch,
                                        float* y, MatmulNumerics numerics) {
  COLI_RETURN_IF_ERROR(CheckMxfp4View(w));
  if (batch <= 0 || w.rows == 0) {
    // Nothing to upload; the resident overload gives the batch checks their one wording.
    if (batch < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Vulkan Mxfp4Matmul: negative batch ", batch));
    }
    return absl::OkStatus();
  }
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMxfp4Matrix> resident, UploadMxfp4(w));
  return Mxfp4Matmul(*resident, x, batch, y, numerics);
}

namespace {

// The CPU's activation groups of an idot kernel: 32 columns for MXFP4 (whose kernels scale by
// 0.5·xscale, the e2m1 values being doubled), 64 for int8 and int4-g64.
int IdotGroup(int kernel) { return kernel == kMxfp4IdotKernel ? 32 : 64; }

// Words per batch row of an idot shader's activations: ceil(cols/4) words of int8 codes, then
// one f32 scale per group.
uint64_t IdotRowWords(uint64_t cols, int group) {
  return (cols + 3) / 4 + (cols + group - 1) / group;
}

// The idot shader's activations for `batch` host f32 rows of `cols`: each row quantized by the
// CPU's own routine (kernels::QuantizeActivationsInt8Groups, the kernel's group) and, for
// MXFP4, the group scales halved in f32 as the CPU's kernels do (0.5f·xscale), so the device
// sees exactly the codes and scales the CPU's Matmul(idot = true) computes with. A non-finite
// value is INVALID_ARGUMENT naming the batch row, as the CPU refuses it.
absl::Status QuantizeForIdot(int kernel, const float* x, int64_t batch, int64_t cols,
                             absl::string_view name, std::vector<uint32_t>* out) {
  const int group = IdotGroup(kernel);
  const float scale_factor = kernel == kMxfp4IdotKernel ? 0.5f : 1.0f;
  const int64_t code_words = (cols + 3) / 4;
  const int64_t groups = (cols + group - 1) / group;
  const int64_t stride = static_cast<int64_t>(IdotRowWords(static_cast<uint64_t>(cols), group));
  out->assign(static_cast<size_t>(batch * stride), 0u);
  std::vector<float> scales(static_cast<size_t>(groups));
  for (int64_t b = 0; b < batch; ++b) {
    uint32_t* row = out->data() + b * stride;
    // Byte c of the row is column c (the shader reads the words little-endian); the bytes past
    // cols stay zero.
    const absl::Status quantized = kernels::QuantizeActivationsInt8Groups(
        std::span<const float>(x + b * cols, static_cast<size_t>(cols)), group,
        reinterpret_cast<int8_t*>(row), scales.data());
    if (!quantized.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": activations, batch row ", b, ": ", quantized.message()));
    }
    for (int64_t g = 0; g < groups; ++g) {
      row[code_words + g] = FloatBits(scale_factor * scales[g]);
    }
  }
  return absl::OkStatus();
}

// What a matmul `kernel` reads as activations for `batch` host f32 rows of `cols`: the idot
// words (QuantizeForIdot), or the f32 values as they are.
absl::Status EncodeActivations(int kernel, const float* x, int64_t batch, int64_t cols,
                               absl::string_view name, std::vector<uint32_t>* out) {
  if (IsIdotKernel(kernel)) return QuantizeForIdot(kernel, x, batch, cols, name, out);
  out->resize(static_cast<size_t>(batch * cols));
  std::memcpy(out->data(), x, out->size() * sizeof(float));
  return absl::OkStatus();
}

// True when kernels `a` and `b` read the same activation words for the same input.
bool SameActivations(int a, int b) {
  if (IsIdotKernel(a) != IsIdotKernel(b)) return false;
  return !IsIdotKernel(a) || IdotGroup(a) == IdotGroup(b);
}

absl::Status IdotUnsupported(const internal::VulkanState& s, absl::string_view name) {
  return absl::UnimplementedError(absl::StrCat(
      name, ": ", s.device_name,
      " has no shaderInt64, which the integer-dot (K3_IDOT=1) kernel needs to reproduce the "
      "CPU's bits; use K3_IDOT=0 (f32 activations) on this device"));
}

// y = W·x for `batch` host f32 rows of a resident matrix, one dispatch of `kernel` (the matmul
// shaders share bindings and push constants; an idot kernel gets its activations quantized
// here). `name` ("Vulkan Mxfp4Matmul") heads the errors.
absl::Status RunResidentMatmul(internal::VulkanState& s, const ResidentBuffers& w, Kernel kernel,
                               const float* x, int64_t batch, float* y, absl::string_view name) {
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": negative batch ", batch));
  }
  if (batch == 0 || w.rows == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": null activation or output pointer"));
  }
  const bool idot = IsIdotKernel(kernel);
  if (idot && !s.int64) return IdotUnsupported(s, name);
  // The shaders index x (mxfp4: in vec4s, batch*cols/4; idot: words) and y (batch*rows) with
  // 32-bit uints.
  const uint64_t rows = static_cast<uint64_t>(w.rows);
  const uint64_t cols = static_cast<uint64_t>(w.cols);
  const uint64_t b = static_cast<uint64_t>(batch);
  const uint64_t x_units = idot                     ? b * IdotRowWords(cols, IdotGroup(kernel))
                           : kernel == kMxfp4Kernel ? b * cols / 4
                                                    : b * cols;
  if (b > kMaxIndex || x_units > kMaxIndex || b * rows > kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": shape [", rows, ", ", cols,
                                                   "] x batch ", b,
                                                   " exceeds the shader's 32-bit indices"));
  }
  std::vector<uint32_t> codes;
  if (idot) COLI_RETURN_IF_ERROR(QuantizeForIdot(kernel, x, batch, w.cols, name, &codes));
  const void* activations = idot ? static_cast<const void*>(codes.data()) : x;
  const VkDeviceSize x_bytes = idot ? codes.size() * sizeof(uint32_t) : b * cols * sizeof(float);
  const VkDeviceSize y_bytes = b * rows * sizeof(float);
  for (const VkDeviceSize bytes : {x_bytes, y_bytes}) {
    if (bytes > s.properties.limits.maxStorageBufferRange) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name, ": an activation or output buffer of ", bytes,
                       " bytes exceeds the device's maxStorageBufferRange (",
                       s.properties.limits.maxStorageBufferRange, ") on ", s.device_name));
    }
  }
  std::lock_guard<std::mutex> lock(s.mu);
  // The activation and output buffers, kept between calls.
  Buffer& in = s.step_x;
  Buffer& out = s.step_y;
  absl::Status status = s.Ensure(in, x_bytes, "activations", Placement::kHostMapped);
  if (status.ok()) status = s.Ensure(out, y_bytes, "outputs", Placement::kHostMapped);
  if (!status.ok()) return status;
  std::memcpy(in.mapped, activations, x_bytes);
  internal::VulkanState::Dispatch d;
  d.kernel = kernel;
  // A dense f32 matrix has no scales: its shader never reads binding 1.
  const Buffer& scales = w.scales.buffer != VK_NULL_HANDLE ? w.scales : w.weights;
  d.segments[0] = {w.weights.buffer, 0, w.weights.size};
  d.segments[1] = {scales.buffer, 0, scales.size};
  d.segments[2] = {in.buffer, 0, x_bytes};
  d.segments[3] = {out.buffer, 0, y_bytes};
  d.push[0] = static_cast<uint32_t>(rows);
  d.push[1] = static_cast<uint32_t>(cols);
  d.push[2] = static_cast<uint32_t>(b);
  KernelGroups(kernel, d.push[0], &d.groups_x, &d.groups_y);
  status = Annotate(s.RunDispatches(std::span(&d, 1), absl::StrCat(name, " dispatch")),
                    s.device_name);
  if (status.ok()) std::memcpy(y, out.mapped, y_bytes);
  return status;
}

}  // namespace

absl::Status VulkanContext::Mxfp4Matmul(const DeviceMxfp4Matrix& w, const float* x, int64_t batch,
                                        float* y, MatmulNumerics numerics) {
  if (w.impl_->state != state_.get()) {
    return absl::InvalidArgumentError(
        "Vulkan Mxfp4Matmul: the matrix was uploaded by another VulkanContext");
  }
  return RunResidentMatmul(*state_, *w.impl_,
                           numerics == MatmulNumerics::kIdot ? kMxfp4IdotKernel : kMxfp4Kernel, x,
                           batch, y, "Vulkan Mxfp4Matmul");
}

bool VulkanContext::supports_idot() const { return state_->int64; }

uint64_t VulkanContext::matmuls() const {
  return state_->matmuls.load(std::memory_order_relaxed);
}


absl::Status VulkanContext::SituGlu(const float* g, const float* u, int64_t n, float beta1,
                                    float beta2, float* out) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Vulkan SituGlu: negative n ", n));
  if (n == 0) return absl::OkStatus();
  if (g == nullptr || u == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("Vulkan SituGlu: null input or output pointer");
  }
  if (static_cast<uint64_t>(n) > kMaxIndex) {
    return absl::InvalidArgumentError(
        absl::StrCat("Vulkan SituGlu: n = ", n, " exceeds the shader's 32-bit indices"));
  }
  internal::VulkanState& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const VkDeviceSize bytes = static_cast<VkDeviceSize>(n) * sizeof(float);
  Buffer io[3];
  auto release = [&] {
    for (Buffer& buf : io) s.Free(buf);
  };
  absl::Status status;
  const char* names[3] = {"situ gate", "situ up", "situ output"};
  for (int i = 0; i < 3 && status.ok(); ++i) status = s.Allocate(bytes, names[i], io[i]);
  if (!status.ok()) {
    release();
    return status;
  }
  std::memcpy(io[0].mapped, g, bytes);
  std::memcpy(io[1].mapped, u, bytes);
  internal::VulkanState::Dispatch d;
  d.kernel = kSituKernel;
  for (int i = 0; i < 3; ++i) d.segments[i] = {io[i].buffer, 0, bytes};
  d.push[0] = static_cast<uint32_t>(n);
  d.push[1] = FloatBits(beta1);
  d.push[2] = FloatBits(beta2);
  d.groups_x = SituGroups(static_cast<uint64_t>(n));
  status = Annotate(s.RunDispatches(std::span(&d, 1), "situ_glu dispatch"), s.device_name);
  if (status.ok()) std::memcpy(out, io[2].mapped, bytes);
  release();
  return status;
}

namespace {

// One matrix of a GLU chain: its resident buffers and the pipeline that reads its format.
struct ChainMatrix {
  const ResidentBuffers* m = nullptr;
  Kernel kernel = kMxfp4Kernel;
};
// y[r, :] = down · SiTU(gate · x[r, :], up · x[r, :]) for r < rows (host f32 x, y).
struct GluJob {
  ChainMatrix gate, up, down;
  const float* x = nullptr;
  int64_t rows = 0;
  float* y = nullptr;
};

// The pipeline of a dense format under `numerics`, or an error naming the format. f32 has no
// integer path (the CPU's Matmul keeps its f32 kernel under idot): the f32 shader either way.
absl::StatusOr<Kernel> DenseKernel(kernels::WeightFormat format, MatmulNumerics numerics,
                                   absl::string_view what) {
  const bool idot = numerics == MatmulNumerics::kIdot;
  switch (format) {
    case kernels::WeightFormat::kF32:
      return kDenseF32Kernel;
    case kernels::WeightFormat::kInt8Row:
      return idot ? kDenseInt8IdotKernel : kDenseInt8Kernel;
    case kernels::WeightFormat::kInt4G64:
      return idot ? kDenseInt4IdotKernel : kDenseInt4Kernel;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": expected an f32, int8 or int4g64 matrix, got ",
                       kernels::WeightFormatName(format)));
  }
}

// Every job's gate and up matmuls, SiTU-GLU and down matmul in ONE command buffer (barriers only
// between the three phases), then each job's y read back. `which(j)` names job j in errors.
// Checks one GLU job: false when it has nothing to compute (rows, I or H zero).
absl::StatusOr<bool> CheckGluJob(const GluJob& job, const std::string& which) {
  const ResidentBuffers &gate = *job.gate.m, &up = *job.up.m, &down = *job.down.m;
  const int64_t inter = gate.rows, hidden = gate.cols;
  if (up.rows != inter || up.cols != hidden || down.rows != hidden || down.cols != inter) {
    return absl::InvalidArgumentError(
        absl::StrCat(which, ": shapes gate [", inter, ", ", hidden, "], up [", up.rows, ", ",
                     up.cols, "], down [", down.rows, ", ", down.cols,
                     "] do not form a GLU block (expected up [I, H] and down [H, I])"));
  }
  if (job.rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": negative rows ", job.rows));
  }
  if (job.rows == 0 || inter == 0 || hidden == 0) return false;
  if (job.x == nullptr || job.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": null activation or output"));
  }
  const uint64_t r = static_cast<uint64_t>(job.rows);
  // The f32 activations and outputs; the idot shaders' activation words are bounded by the
  // chain's segment check (at most maxStorageBufferRange bytes).
  if (r * static_cast<uint64_t>(inter) > kMaxIndex ||
      r * static_cast<uint64_t>(hidden) > kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat(which, ": ", r, " rows of [", inter, ", ",
                                                   hidden, "] exceed the shaders' 32-bit indices"));
  }
  return true;
}

absl::Status RunGluChain(internal::VulkanState& s, std::span<const GluJob> jobs, float beta1,
                         float beta2, const std::function<std::string(size_t)>& which,
                         absl::string_view what) {
  // Checks, and the byte layout of the shared activation buffers: each job's segment starts at
  // a multiple of the device's storage-buffer offset alignment.
  const VkDeviceSize align =
      std::max<VkDeviceSize>(16, s.properties.limits.minStorageBufferOffsetAlignment);
  auto round_up = [&](VkDeviceSize v) { return (v + align - 1) / align * align; };
  struct Layout {
    VkDeviceSize x = 0, inner = 0, y = 0;  // offsets in the x / g,u,h / y buffers
    VkDeviceSize x_bytes = 0, inner_bytes = 0;
  };
  std::vector<Layout> layout(jobs.size());
  VkDeviceSize x_total = 0, inner_total = 0;
  bool any = false;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const GluJob& job = jobs[j];
    COLI_ASSIGN_OR_RETURN(const bool has_work, CheckGluJob(job, which(j)));
    if (!has_work) continue;
    const uint64_t r = static_cast<uint64_t>(job.rows);
    const int64_t inter = job.gate.m->rows, hidden = job.gate.m->cols;
    layout[j].x_bytes = r * static_cast<uint64_t>(hidden) * sizeof(float);
    layout[j].inner_bytes = r * static_cast<uint64_t>(inter) * sizeof(float);
    layout[j].x = x_total;
    layout[j].y = x_total;
    layout[j].inner = inner_total;
    x_total += round_up(layout[j].x_bytes);
    inner_total += round_up(layout[j].inner_bytes);
    for (VkDeviceSize seg : {layout[j].x_bytes, layout[j].inner_bytes}) {
      if (seg > s.properties.limits.maxStorageBufferRange) {
        return absl::ResourceExhaustedError(
            absl::StrCat(which(j), ": a segment of ", seg,
                         " bytes exceeds the device's maxStorageBufferRange (",
                         s.properties.limits.maxStorageBufferRange, ") on ", s.device_name));
      }
    }
    any = true;
  }
  if (!any) return absl::OkStatus();

  std::lock_guard<std::mutex> lock(s.mu);
  // Kept between calls, grown only for a larger step (VulkanState::Ensure). The intermediates
  // are never touched by the host: device-local when uploads are staged.
  Buffer &x = s.step_x, &g = s.step_g, &u = s.step_u, &h = s.step_h, &y = s.step_y;
  const Placement inner = s.InnerPlacement();
  absl::Status status = s.Ensure(x, x_total, "chain activations", Placement::kHostMapped);
  if (status.ok()) status = s.Ensure(g, inner_total, "chain gate", inner);
  if (status.ok()) status = s.Ensure(u, inner_total, "chain up", inner);
  if (status.ok()) status = s.Ensure(h, inner_total, "chain hidden", inner);
  if (status.ok()) status = s.Ensure(y, x_total, "chain outputs", Placement::kHostMapped);
  if (!status.ok()) return status;
  using Dispatch = internal::VulkanState::Dispatch;
  std::vector<Dispatch> dispatches;
  dispatches.reserve(jobs.size() * 4);
  auto matmul = [&](const ChainMatrix& w, int phase, const Buffer& in, VkDeviceSize in_off,
                    VkDeviceSize in_bytes, const Buffer& out, VkDeviceSize out_off,
                    VkDeviceSize out_bytes, int64_t rows) {
    Dispatch d;
    d.kernel = w.kernel;
    d.phase = phase;
    d.segments[0] = {w.m->weights.buffer, 0, w.m->weights.size};
    // A dense f32 matrix has no scales: its shader never reads binding 1.
    const Buffer& scales = w.m->scales.buffer != VK_NULL_HANDLE ? w.m->scales : w.m->weights;
    d.segments[1] = {scales.buffer, 0, scales.size};
    d.segments[2] = {in.buffer, in_off, in_bytes};
    d.segments[3] = {out.buffer, out_off, out_bytes};
    d.push[0] = static_cast<uint32_t>(w.m->rows);
    d.push[1] = static_cast<uint32_t>(w.m->cols);
    d.push[2] = static_cast<uint32_t>(rows);
    MatmulGroups(d.push[0], &d.groups_x, &d.groups_y);
    dispatches.push_back(d);
  };
  for (size_t j = 0; j < jobs.size(); ++j) {
    const GluJob& job = jobs[j];
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    std::memcpy(static_cast<uint8_t*>(x.mapped) + l.x, job.x, l.x_bytes);
    matmul(job.gate, 0, x, l.x, l.x_bytes, g, l.inner, l.inner_bytes, job.rows);
    matmul(job.up, 0, x, l.x, l.x_bytes, u, l.inner, l.inner_bytes, job.rows);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    Dispatch d;
    d.kernel = kSituKernel;
    d.phase = 1;
    d.segments[0] = {g.buffer, l.inner, l.inner_bytes};
    d.segments[1] = {u.buffer, l.inner, l.inner_bytes};
    d.segments[2] = {h.buffer, l.inner, l.inner_bytes};
    const uint64_t n = l.inner_bytes / sizeof(float);
    d.push[0] = static_cast<uint32_t>(n);
    d.push[1] = FloatBits(beta1);
    d.push[2] = FloatBits(beta2);
    d.groups_x = SituGroups(n);
    dispatches.push_back(d);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const GluJob& job = jobs[j];
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    matmul(job.down, 2, h, l.inner, l.inner_bytes, y, l.y, l.x_bytes, job.rows);
  }
  status = Annotate(s.RunDispatches(dispatches, what), s.device_name);
  if (status.ok()) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (layout[j].x_bytes == 0) continue;
      std::memcpy(jobs[j].y, static_cast<const uint8_t*>(y.mapped) + layout[j].y,
                  layout[j].x_bytes);
    }
  }
  return status;
}

// The idot chain (ExpertChain and DenseGlu with MatmulNumerics::kIdot), the CPU's K3_IDOT=1
// block bit for bit: every job's gate and up as one submission; on the host ops::SituGlu — the
// CPU's own function, because its libm expf/tanhf bits cannot be reproduced in a shader; every
// job's down as a second submission. Each matmul reads the activations its kernel takes
// (EncodeActivations: the idot kernels' int8 codes per 32 or 64 columns, or f32 for a dense f32
// matrix, which has no integer path on the CPU either); gate and up share theirs when their
// kernels read the same. Both submissions hold the step lock, so the per-step buffers serve both.
absl::Status RunIdotChain(internal::VulkanState& s, std::span<const GluJob> jobs, float beta1,
                          float beta2, const std::function<std::string(size_t)>& which,
                          absl::string_view what) {
  struct Work {
    const GluJob* job = nullptr;
    std::string name;
    int64_t inter = 0, hidden = 0;
    // The activations of the current phase: gate's (phase 1) or down's (phase 2), and up's
    // when they differ from gate's (empty: up reads gate's).
    std::vector<uint32_t> in, in_up;
    std::vector<float> g, u;
    VkDeviceSize in_off = 0, in_up_off = 0, out = 0, out2 = 0;  // segment offsets of the phase
  };
  std::vector<Work> work;
  for (size_t j = 0; j < jobs.size(); ++j) {
    COLI_ASSIGN_OR_RETURN(const bool has_work, CheckGluJob(jobs[j], which(j)));
    if (!has_work) continue;
    Work& w = work.emplace_back();
    w.job = &jobs[j];
    w.name = which(j);
    w.inter = jobs[j].gate.m->rows;
    w.hidden = jobs[j].gate.m->cols;
  }
  if (work.empty()) return absl::OkStatus();
  if (!s.int64) return IdotUnsupported(s, what);
  // The inputs are encoded before the lock: host work that no other step waits for.
  for (Work& w : work) {
    const GluJob& job = *w.job;
    COLI_RETURN_IF_ERROR(
        EncodeActivations(job.gate.kernel, job.x, job.rows, w.hidden, w.name, &w.in));
    if (!SameActivations(job.gate.kernel, job.up.kernel)) {
      COLI_RETURN_IF_ERROR(
          EncodeActivations(job.up.kernel, job.x, job.rows, w.hidden, w.name, &w.in_up));
    }
  }
  const VkDeviceSize align =
      std::max<VkDeviceSize>(16, s.properties.limits.minStorageBufferOffsetAlignment);
  auto round_up = [&](VkDeviceSize v) { return (v + align - 1) / align * align; };
  auto bytes_of = [](const std::vector<uint32_t>& v) -> VkDeviceSize {
    return v.size() * sizeof(uint32_t);
  };
  auto check_range = [&](const Work& w, VkDeviceSize bytes) -> absl::Status {
    if (bytes <= s.properties.limits.maxStorageBufferRange) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        w.name, ": a segment of ", bytes, " bytes exceeds the device's maxStorageBufferRange (",
        s.properties.limits.maxStorageBufferRange, ") on ", s.device_name));
  };
  using Dispatch = internal::VulkanState::Dispatch;
  auto matmul = [&](const ChainMatrix& cm, const Buffer& in, VkDeviceSize in_off,
                    VkDeviceSize in_bytes, const Buffer& out, VkDeviceSize out_off, int64_t rows) {
    const ResidentBuffers& m = *cm.m;
    Dispatch d;
    d.kernel = cm.kernel;
    d.segments[0] = {m.weights.buffer, 0, m.weights.size};
    // A dense f32 matrix has no scales: its shader never reads binding 1.
    const Buffer& scales = m.scales.buffer != VK_NULL_HANDLE ? m.scales : m.weights;
    d.segments[1] = {scales.buffer, 0, scales.size};
    d.segments[2] = {in.buffer, in_off, in_bytes};
    d.segments[3] = {out.buffer, out_off, static_cast<VkDeviceSize>(rows * m.rows) * 4};
    d.push[0] = static_cast<uint32_t>(m.rows);
    d.push[1] = static_cast<uint32_t>(m.cols);
    d.push[2] = static_cast<uint32_t>(rows);
    KernelGroups(cm.kernel, d.push[0], &d.groups_x, &d.groups_y);
    return d;
  };
  // Both phases read their activations from step_x and write host-read outputs to step_y.
  std::lock_guard<std::mutex> lock(s.mu);
  Buffer &x = s.step_x, &y = s.step_y;
  // Phase 1: gate and up of every job.
  VkDeviceSize x_total = 0, y_total = 0;
  for (Work& w : work) {
    const VkDeviceSize inner_bytes = static_cast<VkDeviceSize>(w.job->rows * w.inter) * 4;
    COLI_RETURN_IF_ERROR(check_range(w, bytes_of(w.in)));
    COLI_RETURN_IF_ERROR(check_range(w, bytes_of(w.in_up)));
    COLI_RETURN_IF_ERROR(check_range(w, inner_bytes));
    w.in_off = x_total;
    x_total += round_up(bytes_of(w.in));
    w.in_up_off = x_total;
    x_total += round_up(bytes_of(w.in_up));
    w.out = y_total;
    y_total += round_up(inner_bytes);
    w.out2 = y_total;
    y_total += round_up(inner_bytes);
  }
  absl::Status status = s.Ensure(x, x_total, "chain activations", Placement::kHostMapped);
  if (status.ok()) status = s.Ensure(y, y_total, "chain outputs", Placement::kHostMapped);
  if (!status.ok()) return status;
  std::vector<Dispatch> dispatches;
  for (const Work& w : work) {
    std::memcpy(static_cast<uint8_t*>(x.mapped) + w.in_off, w.in.data(), bytes_of(w.in));
    dispatches.push_back(matmul(w.job->gate, x, w.in_off, bytes_of(w.in), y, w.out, w.job->rows));
    if (w.in_up.empty()) {
      dispatches.push_back(matmul(w.job->up, x, w.in_off, bytes_of(w.in), y, w.out2, w.job->rows));
    } else {
      std::memcpy(static_cast<uint8_t*>(x.mapped) + w.in_up_off, w.in_up.data(), bytes_of(w.in_up));
      dispatches.push_back(
          matmul(w.job->up, x, w.in_up_off, bytes_of(w.in_up), y, w.out2, w.job->rows));
    }
  }
  COLI_RETURN_IF_ERROR(
      Annotate(s.RunDispatches(dispatches, absl::StrCat(what, " (gate, up)")), s.device_name));
  // SiTU-GLU and the down projection's activations, exactly as the CPU's block makes them.
  for (Work& w : work) {
    const int64_t n = w.job->rows * w.inter;
    w.g.resize(static_cast<size_t>(n));
    w.u.resize(static_cast<size_t>(n));
    std::memcpy(w.g.data(), static_cast<const uint8_t*>(y.mapped) + w.out, n * sizeof(float));
    std::memcpy(w.u.data(), static_cast<const uint8_t*>(y.mapped) + w.out2, n * sizeof(float));
    ops::SituGlu(w.g.data(), w.u.data(), n, beta1, beta2, w.g.data());
    COLI_RETURN_IF_ERROR(
        EncodeActivations(w.job->down.kernel, w.g.data(), w.job->rows, w.inter, w.name, &w.in));
  }
  // Phase 2: down of every job.
  x_total = 0;
  y_total = 0;
  for (Work& w : work) {
    const VkDeviceSize out_bytes = static_cast<VkDeviceSize>(w.job->rows * w.hidden) * 4;
    COLI_RETURN_IF_ERROR(check_range(w, bytes_of(w.in)));
    COLI_RETURN_IF_ERROR(check_range(w, out_bytes));
    w.in_off = x_total;
    x_total += round_up(bytes_of(w.in));
    w.out = y_total;
    y_total += round_up(out_bytes);
  }
  status = s.Ensure(x, x_total, "chain activations", Placement::kHostMapped);
  if (status.ok()) status = s.Ensure(y, y_total, "chain outputs", Placement::kHostMapped);
  if (!status.ok()) return status;
  dispatches.clear();
  for (const Work& w : work) {
    std::memcpy(static_cast<uint8_t*>(x.mapped) + w.in_off, w.in.data(), bytes_of(w.in));
    dispatches.push_back(matmul(w.job->down, x, w.in_off, bytes_of(w.in), y, w.out, w.job->rows));
  }
  COLI_RETURN_IF_ERROR(
      Annotate(s.RunDispatches(dispatches, absl::StrCat(what, " (down)")), s.device_name));
  for (const Work& w : work) {
    std::memcpy(w.job->y, static_cast<const uint8_t*>(y.mapped) + w.out,
                static_cast<size_t>(w.job->rows * w.hidden) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VulkanContext::ExpertChain(std::span<const ExpertChainJob> jobs, float beta1,
                                        float beta2, MatmulNumerics numerics) {
  internal::VulkanState& s = *state_;
  auto which = [](size_t j) { return absl::StrCat("Vulkan ExpertChain job ", j); };
  std::vector<GluJob> glu(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ExpertChainJob& job = jobs[j];
    if (job.gate == nullptr || job.up == nullptr || job.down == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(which(j), ": null matrix"));
    }
    for (const DeviceMxfp4Matrix* m : {job.gate, job.up, job.down}) {
      if (m->impl_->state != &s) {
        return absl::InvalidArgumentError(
            absl::StrCat(which(j), ": a matrix was uploaded by another VulkanContext"));
      }
    }
    const Kernel kernel = numerics == MatmulNumerics::kIdot ? kMxfp4IdotKernel : kMxfp4Kernel;
    glu[j] = {{job.gate->impl_.get(), kernel},
              {job.up->impl_.get(), kernel},
              {job.down->impl_.get(), kernel},
              job.x,
              job.rows,
              job.y};
  }
  if (numerics == MatmulNumerics::kIdot) {
    return RunIdotChain(s, glu, beta1, beta2, which, "expert chain (idot)");
  }
  return RunGluChain(s, glu, beta1, beta2, which, "expert chain");
}

absl::Status VulkanContext::DenseGlu(const DeviceDenseMatrix& gate, const DeviceDenseMatrix& up,
                                     const DeviceDenseMatrix& down, const float* x, int64_t rows,
                                     float beta1, float beta2, float* y, MatmulNumerics numerics) {
  internal::VulkanState& s = *state_;
  GluJob job;
  ChainMatrix* slots[3] = {&job.gate, &job.up, &job.down};
  const DeviceDenseMatrix* matrices[3] = {&gate, &up, &down};
  for (int i = 0; i < 3; ++i) {
    if (matrices[i]->impl_->state != &s) {
      return absl::InvalidArgumentError(
          "Vulkan DenseGlu: a matrix was uploaded by another VulkanContext");
    }
    COLI_ASSIGN_OR_RETURN(const Kernel kernel,
                          DenseKernel(matrices[i]->format(), numerics, "Vulkan DenseGlu"));
    *slots[i] = {matrices[i]->impl_.get(), kernel};
  }
  job.x = x;
  job.rows = rows;
  job.y = y;
  auto which = [](size_t) { return std::string("Vulkan DenseGlu"); };
  // Under kIdot, only f32 matrices (no integer path on the CPU either): the float chain.
  if (IsIdotKernel(job.gate.kernel) || IsIdotKernel(job.up.kernel) ||
      IsIdotKernel(job.down.kernel)) {
    return RunIdotChain(s, std::span(&job, 1), beta1, beta2, which, "dense GLU chain (idot)");
  }
  return RunGluChain(s, std::span(&job, 1), beta1, beta2, which, "dense GLU chain");
}

DeviceDenseMatrix::DeviceDenseMatrix(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceDenseMatrix::~DeviceDenseMatrix() = default;
int64_t DeviceDenseMatrix::rows() const { return impl_->rows; }
int64_t DeviceDenseMatrix::cols() const { return impl_->cols; }
kernels::WeightFormat DeviceDenseMatrix::format() const { return impl_->format; }
size_t DeviceDenseMatrix::device_bytes() const {
  return impl_->weights.allocated + impl_->scales.allocated;
}

absl::StatusOr<std::unique_ptr<DeviceDenseMatrix>> VulkanContext::UploadDense(
    const kernels::MatrixView& w) {
  COLI_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<DeviceDenseMatrix>> one,
                        UploadDenseBatch(std::span(&w, 1)));
  return std::move(one[0]);
}

absl::StatusOr<std::vector<std::unique_ptr<DeviceDenseMatrix>>> VulkanContext::UploadDenseBatch(
    std::span<const kernels::MatrixView> views) {
  for (const kernels::MatrixView& w : views) {
    COLI_RETURN_IF_ERROR(
        DenseKernel(w.format, MatmulNumerics::kFloat, "Vulkan UploadDense").status());
    COLI_RETURN_IF_ERROR(Annotate(kernels::ValidateView(w), "Vulkan UploadDense"));
    // The shaders index weight words and bytes (int8: rows*cols) with 32-bit uints.
    const uint64_t bytes = kernels::FormatBytes(w.format, w.rows, w.cols).data;
    if (bytes > kMaxIndex) {
      return absl::InvalidArgumentError(
          absl::StrCat("Vulkan UploadDense: ", kernels::WeightFormatName(w.format), " matrix [",
                       w.rows, ", ", w.cols, "] exceeds the shader's 32-bit indices"));
    }
  }
  internal::VulkanState& s = *state_;
  const Placement placement = s.staging_mode ? Placement::kDeviceLocal : Placement::kHostMapped;
  std::vector<std::unique_ptr<DeviceDenseMatrix>> out;
  std::vector<internal::VulkanState::StagedCopy> copies;
  for (const kernels::MatrixView& w : views) {
    auto impl = std::make_unique<DeviceDenseMatrix::Impl>();
    impl->state = &s;
    impl->rows = w.rows;
    impl->cols = w.cols;
    impl->format = w.format;
    DeviceDenseMatrix::Impl& m = *impl;
    out.push_back(std::unique_ptr<DeviceDenseMatrix>(new DeviceDenseMatrix(std::move(impl))));
    if (w.rows == 0) continue;
    // The bytes and f32 scales exactly as the CPU holds them. int8 rows need not end on a
    // word: the weight buffer is rounded up to whole words (the tail is never a column).
    const kernels::MatrixBytes bytes = kernels::FormatBytes(w.format, w.rows, w.cols);
    COLI_RETURN_IF_ERROR(
        m.Allocate(m.weights, (bytes.data + 3) / 4 * 4, "dense weights", placement));
    FillResident(m.weights, w.data, bytes.data, &copies);
    if (bytes.scales > 0) {
      COLI_RETURN_IF_ERROR(m.Allocate(m.scales, bytes.scales, "dense scales", placement));
      FillResident(m.scales, w.scales, bytes.scales, &copies);
    }
  }
  if (!copies.empty()) COLI_RETURN_IF_ERROR(Annotate(s.UploadStaged(copies), s.device_name));
  return out;
}

absl::Status VulkanContext::DenseMatmul(const DeviceDenseMatrix& w, const float* x, int64_t batch,
                                        float* y, MatmulNumerics numerics) {
  if (w.impl_->state != state_.get()) {
    return absl::InvalidArgumentError(
        "Vulkan DenseMatmul: the matrix was uploaded by another VulkanContext");
  }
  COLI_ASSIGN_OR_RETURN(const Kernel kernel,
                        DenseKernel(w.format(), numerics, "Vulkan DenseMatmul"));
  return RunResidentMatmul(*state_, *w.impl_, kernel, x, batch, y, "Vulkan DenseMatmul");
}

bool VulkanContext::discrete_gpu() const {
  return state_->properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
}

void VulkanContext::FailSubmissionsForTesting(int n) { state_->fail_submissions.store(n); }

std::string VkResultName(int32_t result) {
  switch (static_cast<VkResult>(result)) {
#define COLI_VK_CASE(code) \
  case code:               \
    return #code;
    COLI_VK_CASE(VK_SUCCESS)
    COLI_VK_CASE(VK_NOT_READY)
    COLI_VK_CASE(VK_TIMEOUT)
    COLI_VK_CASE(VK_EVENT_SET)
    COLI_VK_CASE(VK_EVENT_RESET)
    COLI_VK_CASE(VK_INCOMPLETE)
    COLI_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    COLI_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    COLI_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    COLI_VK_CASE(VK_ERROR_DEVICE_LOST)
    COLI_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    COLI_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    COLI_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    COLI_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    COLI_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    COLI_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    COLI_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    COLI_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    COLI_VK_CASE(VK_ERROR_UNKNOWN)
    COLI_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    COLI_VK_CASE(VK_ERROR_INVALID_EXTERNAL_HANDLE)
    COLI_VK_CASE(VK_ERROR_FRAGMENTATION)
    COLI_VK_CASE(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS)
    COLI_VK_CASE(VK_ERROR_INVALID_SHADER_NV)
#undef COLI_VK_CASE
    default:
      return absl::StrCat("VkResult(", result, ")");
  }
}

}  // namespace coli::vulkan
