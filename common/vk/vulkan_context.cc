// common/vk: the compute context (instance, device, queue, one pipeline) and the MXFP4
// matmul dispatch. Device-level calls go through a per-context VolkDeviceTable, so two contexts
// on different devices never share function pointers.
#include "common/vk/vulkan_context.h"

#include <volk.h>

#include <atomic>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// A host-visible, host-coherent storage buffer, mapped for its whole life.
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* mapped = nullptr;
  VkDeviceSize size = 0;
};

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

  VkCommandPool command_pool = VK_NULL_HANDLE;
  VkCommandBuffer command_buffer = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout = VK_NULL_HANDLE;
  VkShaderModule shader = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  // The SiTU-GLU pipeline (shaders/situ_glu.comp): bindings g, u, out.
  VkDescriptorSetLayout situ_set_layout = VK_NULL_HANDLE;
  VkPipelineLayout situ_pipeline_layout = VK_NULL_HANDLE;
  VkShaderModule situ_shader = VK_NULL_HANDLE;
  VkPipeline situ_pipeline = VK_NULL_HANDLE;
  std::atomic<uint64_t> matmuls{0};  // matmul dispatches completed (VulkanContext::matmuls)

  absl::Mutex mu;  // serialises submissions: one command buffer, one descriptor set

  ~VulkanState() {
    if (device != VK_NULL_HANDLE) {
      vk.vkDeviceWaitIdle(device);
      if (situ_pipeline) vk.vkDestroyPipeline(device, situ_pipeline, nullptr);
      if (situ_shader) vk.vkDestroyShaderModule(device, situ_shader, nullptr);
      if (situ_pipeline_layout) vk.vkDestroyPipelineLayout(device, situ_pipeline_layout, nullptr);
      if (situ_set_layout) vk.vkDestroyDescriptorSetLayout(device, situ_set_layout, nullptr);
      if (pipeline) vk.vkDestroyPipeline(device, pipeline, nullptr);
      if (shader) vk.vkDestroyShaderModule(device, shader, nullptr);
      if (pipeline_layout) vk.vkDestroyPipelineLayout(device, pipeline_layout, nullptr);
      if (set_layout) vk.vkDestroyDescriptorSetLayout(device, set_layout, nullptr);
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
  absl::Status Allocate(VkDeviceSize size, absl::string_view what, Buffer& b,
                        bool check_range = true) {
    if (check_range && size > properties.limits.maxStorageBufferRange) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Vulkan: ", what, " buffer of ", size,
                       " bytes exceeds the device's maxStorageBufferRange (",
                       properties.limits.maxStorageBufferRange, ") on ", device_name));
    }
    b.size = size;
    VkBufferCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    info.size = size;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkCreateBuffer(device, &info, nullptr, &b.buffer), "vkCreateBuffer"), what));
    VkMemoryRequirements req;
    vk.vkGetBufferMemoryRequirements(device, b.buffer, &req);
    const VkMemoryPropertyFlags want =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    // Device-local and host-visible where the device has it (integrated GPUs, lavapipe,
    // resizable BAR), else any host-visible coherent type.
    uint32_t type = UINT32_MAX;
    for (const VkMemoryPropertyFlags flags : {want | VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, want}) {
      for (uint32_t i = 0; i < memory_properties.memoryTypeCount && type == UINT32_MAX; ++i) {
        if ((req.memoryTypeBits & (1u << i)) &&
            (memory_properties.memoryTypes[i].propertyFlags & flags) == flags) {
          type = i;
        }
      }
    }
    if (type == UINT32_MAX) {
      return absl::UnavailableError(
          absl::StrCat("Vulkan: ", device_name,
                       " has no host-visible coherent memory type for the ", what, " buffer"));
    }
    VkMemoryAllocateInfo alloc{};
    alloc.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = type;
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkAllocateMemory(device, &alloc, nullptr, &b.memory), "vkAllocateMemory"),
        what));
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkBindBufferMemory(device, b.buffer, b.memory, 0), "vkBindBufferMemory"), what));
    COLI_RETURN_IF_ERROR(Annotate(
        VkError(vk.vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.mapped), "vkMapMemory"),
        what));
    return absl::OkStatus();
  }

  absl::Status PickDevice() {
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
    if (const char* env = std::getenv("COLI_VK_DEVICE"); env != nullptr && *env != '\0') {
      int index = -1;
      if (!absl::SimpleAtoi(env, &index) || index < 0 || index >= static_cast<int>(n)) {
        return absl::InvalidArgumentError(
            absl::StrCat("COLI_VK_DEVICE='", env, "': expected a device index in [0, ", n, ")"));
      }
      if (ComputeQueueFamily(devices[index]) < 0) {
        return absl::UnavailableError(
            absl::StrCat("Vulkan: COLI_VK_DEVICE=", index, " has no compute queue"));
      }
      chosen = index;
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

  absl::Status CreateDevice() {
    const float priority = 1.0f;
    VkDeviceQueueCreateInfo queue_info{};
    queue_info.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    queue_info.queueFamilyIndex = queue_family;
    queue_info.queueCount = 1;
    queue_info.pQueuePriorities = &priority;
    VkDeviceCreateInfo info{};
    info.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    info.queueCreateInfoCount = 1;
    info.pQueueCreateInfos = &queue_info;
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
    COLI_RETURN_IF_ERROR(CreateComputePipeline(kBindings, sizeof(PushConstants),
                                               shaders::Mxfp4MatmulSpirv(), "mxfp4_matmul",
                                               &set_layout, &pipeline_layout, &shader, &pipeline));
    COLI_RETURN_IF_ERROR(CreateComputePipeline(kSituBindings, sizeof(SituPushConstants),
                                               shaders::SituGluSpirv(), "situ_glu",
                                               &situ_set_layout, &situ_pipeline_layout,
                                               &situ_shader, &situ_pipeline));
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
    bool situ = false;  // situ_glu pipeline, else mxfp4_matmul
    int phase = 0;
    Segment segments[kBindings]{};
    uint32_t push[3]{};
    uint32_t groups_x = 1, groups_y = 1;
    bool is_matmul() const { return !situ; }
  };

  // Records every dispatch in one command buffer, submits it once and waits for the fence.
  // Caller holds `mu`.
  absl::Status RunDispatches(std::span<const Dispatch> dispatches, absl::string_view what) {
    if (dispatches.empty()) return absl::OkStatus();
    VkDescriptorPool pool = VK_NULL_HANDLE;
    VkDescriptorPoolSize pool_size{};
    pool_size.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    pool_size.descriptorCount = static_cast<uint32_t>(dispatches.size() * kBindings);
    VkDescriptorPoolCreateInfo pool_info{};
    pool_info.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    pool_info.maxSets = static_cast<uint32_t>(dispatches.size());
    pool_info.poolSizeCount = 1;
    pool_info.pPoolSizes = &pool_size;
    COLI_VK_RETURN_IF_ERROR(vk.vkCreateDescriptorPool(device, &pool_info, nullptr, &pool));
    absl::Status status = RecordAndSubmit(pool, dispatches, what);
    vk.vkDestroyDescriptorPool(device, pool, nullptr);
    return status;
  }

  absl::Status RecordAndSubmit(VkDescriptorPool pool, std::span<const Dispatch> dispatches,
                               absl::string_view what) {
    std::vector<VkDescriptorSetLayout> layouts(dispatches.size());
    for (size_t i = 0; i < dispatches.size(); ++i)
      layouts[i] = dispatches[i].situ ? situ_set_layout : set_layout;
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
      const int n = dispatches[i].situ ? kSituBindings : kBindings;
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
      const VkPipelineLayout layout = d.situ ? situ_pipeline_layout : pipeline_layout;
      vk.vkCmdBindPipeline(command_buffer, VK_PIPELINE_BIND_POINT_COMPUTE,
                           d.situ ? situ_pipeline : pipeline);
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
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &command_buffer;
    COLI_VK_RETURN_IF_ERROR(vk.vkQueueSubmit(queue, 1, &submit, fence));
    const VkResult waited = vk.vkWaitForFences(device, 1, &fence, VK_TRUE, kFenceTimeoutNs);
    const VkResult reset = vk.vkResetFences(device, 1, &fence);
    COLI_RETURN_IF_ERROR(VkError(waited, absl::StrCat("vkWaitForFences (", what, ")")));
    COLI_VK_RETURN_IF_ERROR(reset);
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
  COLI_RETURN_IF_ERROR(state->PickDevice());
  COLI_RETURN_IF_ERROR(Annotate(state->CreateDevice(), state->device_name));
  COLI_RETURN_IF_ERROR(Annotate(state->CreatePipeline(), state->device_name));
  return std::unique_ptr<VulkanContext>(new VulkanContext(std::move(state)));
}

struct DeviceMxfp4Matrix::Impl {
  internal::VulkanState* state = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  Buffer weights;
  Buffer scales;
  ~Impl() {
    state->Free(weights);
    state->Free(scales);
  }
};

DeviceMxfp4Matrix::DeviceMxfp4Matrix(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceMxfp4Matrix::~DeviceMxfp4Matrix() = default;
int64_t DeviceMxfp4Matrix::rows() const { return impl_->rows; }
int64_t DeviceMxfp4Matrix::cols() const { return impl_->cols; }
size_t DeviceMxfp4Matrix::device_bytes() const { return impl_->weights.size + impl_->scales.size; }

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
  COLI_RETURN_IF_ERROR(CheckMxfp4View(w));
  internal::VulkanState& s = *state_;
  auto impl = std::make_unique<DeviceMxfp4Matrix::Impl>();
  impl->state = &s;
  impl->rows = w.rows;
  impl->cols = w.cols;
  if (w.rows == 0)
    return std::unique_ptr<DeviceMxfp4Matrix>(new DeviceMxfp4Matrix(std::move(impl)));
  const kernels::MatrixBytes bytes = kernels::FormatBytes(w.format, w.rows, w.cols);
  COLI_RETURN_IF_ERROR(s.Allocate(bytes.data, "mxfp4 weights", impl->weights));
  COLI_RETURN_IF_ERROR(s.Allocate(bytes.scales * sizeof(float), "mxfp4 scales", impl->scales));
  // The e2m1 bytes as they are; the E8M0 exponents widened to f32, exactly as the CPU decodes.
  std::memcpy(impl->weights.mapped, w.data, bytes.data);
  const uint8_t* e8m0 = static_cast<const uint8_t*>(w.scales);
  float* scales = static_cast<float*>(impl->scales.mapped);
  for (size_t i = 0; i < bytes.scales; ++i) scales[i] = kernels::E8m0ToF32(e8m0[i]);
  return std::unique_ptr<DeviceMxfp4Matrix>(new DeviceMxfp4Matrix(std::move(impl)));
}

absl::Status VulkanContext::Mxfp4Matmul(const kernels::MatrixView& w, const float* x, int64_t batch,
                                        float* y) {
  COLI_RETURN_IF_ERROR(CheckMxfp4View(w));
  if (batch <= 0 || w.rows == 0) {
    // Nothing to upload; the resident overload gives the batch checks their one wording.
    if (batch < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Vulkan Mxfp4Matmul: negative batch ", batch));
    }
    return absl::OkStatus();
  }
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<DeviceMxfp4Matrix> resident, UploadMxfp4(w));
  return Mxfp4Matmul(*resident, x, batch, y);
}

absl::Status VulkanContext::Mxfp4Matmul(const DeviceMxfp4Matrix& w, const float* x, int64_t batch,
                                        float* y) {
  if (w.impl_->state != state_.get()) {
    return absl::InvalidArgumentError(
        "Vulkan Mxfp4Matmul: the matrix was uploaded by another VulkanContext");
  }
  if (batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Vulkan Mxfp4Matmul: negative batch ", batch));
  }
  if (batch == 0 || w.rows() == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("Vulkan Mxfp4Matmul: null activation or output pointer");
  }
  // The shader indexes x vec4s (batch*cols/4) and y (batch*rows) with 32-bit uints.
  const uint64_t rows = static_cast<uint64_t>(w.rows());
  const uint64_t cols = static_cast<uint64_t>(w.cols());
  const uint64_t b = static_cast<uint64_t>(batch);
  if (b > kMaxIndex || b * cols / 4 > kMaxIndex || b * rows > kMaxIndex) {
    return absl::InvalidArgumentError(absl::StrCat("Vulkan Mxfp4Matmul: shape [", rows, ", ", cols,
                                                   "] x batch ", b,
                                                   " exceeds the shader's 32-bit indices"));
  }

  internal::VulkanState& s = *state_;
  absl::MutexLock lock(&s.mu);
  Buffer io[2];  // activations, outputs
  auto release = [&] {
    for (Buffer& buf : io) s.Free(buf);
  };
  absl::Status status = s.Allocate(b * cols * sizeof(float), "activations", io[0]);
  if (status.ok()) status = s.Allocate(b * rows * sizeof(float), "outputs", io[1]);
  if (!status.ok()) {
    release();
    return status;
  }
  std::memcpy(io[0].mapped, x, b * cols * sizeof(float));
  internal::VulkanState::Dispatch d;
  d.segments[0] = {w.impl_->weights.buffer, 0, w.impl_->weights.size};
  d.segments[1] = {w.impl_->scales.buffer, 0, w.impl_->scales.size};
  d.segments[2] = {io[0].buffer, 0, io[0].size};
  d.segments[3] = {io[1].buffer, 0, io[1].size};
  d.push[0] = static_cast<uint32_t>(rows);
  d.push[1] = static_cast<uint32_t>(cols);
  d.push[2] = static_cast<uint32_t>(b);
  MatmulGroups(d.push[0], &d.groups_x, &d.groups_y);
  status = Annotate(s.RunDispatches(std::span(&d, 1), "mxfp4_matmul dispatch"), s.device_name);
  if (status.ok()) std::memcpy(y, io[1].mapped, b * rows * sizeof(float));
  release();
  return status;
}

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
  absl::MutexLock lock(&s.mu);
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
  d.situ = true;
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

absl::Status VulkanContext::ExpertChain(std::span<const ExpertChainJob> jobs, float beta1,
                                        float beta2) {
  internal::VulkanState& s = *state_;
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
    const ExpertChainJob& job = jobs[j];
    const std::string which = absl::StrCat("Vulkan ExpertChain job ", j);
    if (job.gate == nullptr || job.up == nullptr || job.down == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": null matrix"));
    }
    for (const DeviceMxfp4Matrix* m : {job.gate, job.up, job.down}) {
      if (m->impl_->state != &s) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, ": a matrix was uploaded by another VulkanContext"));
      }
    }
    const int64_t inter = job.gate->rows(), hidden = job.gate->cols();
    if (job.up->rows() != inter || job.up->cols() != hidden || job.down->rows() != hidden ||
        job.down->cols() != inter) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, ": shapes gate [", inter, ", ", hidden, "], up [", job.up->rows(), ", ",
          job.up->cols(), "], down [", job.down->rows(), ", ", job.down->cols(),
          "] do not form a GLU block (expected up [I, H] and down [H, I])"));
    }
    if (job.rows < 0) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": negative rows ", job.rows));
    }
    if (job.rows == 0 || inter == 0 || hidden == 0) continue;
    if (job.x == nullptr || job.y == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": null activation or output"));
    }
    const uint64_t r = static_cast<uint64_t>(job.rows);
    if (r * static_cast<uint64_t>(inter) > kMaxIndex ||
        r * static_cast<uint64_t>(hidden) > kMaxIndex) {
      return absl::InvalidArgumentError(absl::StrCat(which, ": ", r, " rows of [", inter, ", ",
                                                     hidden, "] exceed the shaders' 32-bit indices"));
    }
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
            absl::StrCat(which, ": a segment of ", seg,
                         " bytes exceeds the device's maxStorageBufferRange (",
                         s.properties.limits.maxStorageBufferRange, ") on ", s.device_name));
      }
    }
    any = true;
  }
  if (!any) return absl::OkStatus();

  absl::MutexLock lock(&s.mu);
  Buffer x, g, u, h, y;
  Buffer* all[] = {&x, &g, &u, &h, &y};
  auto release = [&] {
    for (Buffer* buf : all) s.Free(*buf);
  };
  absl::Status status = s.Allocate(x_total, "chain activations", x, /*check_range=*/false);
  if (status.ok()) status = s.Allocate(inner_total, "chain gate", g, false);
  if (status.ok()) status = s.Allocate(inner_total, "chain up", u, false);
  if (status.ok()) status = s.Allocate(inner_total, "chain hidden", h, false);
  if (status.ok()) status = s.Allocate(x_total, "chain outputs", y, false);
  if (!status.ok()) {
    release();
    return status;
  }
  using Dispatch = internal::VulkanState::Dispatch;
  std::vector<Dispatch> dispatches;
  dispatches.reserve(jobs.size() * 4);
  auto matmul = [&](const DeviceMxfp4Matrix& w, int phase, const Buffer& in, VkDeviceSize in_off,
                    VkDeviceSize in_bytes, const Buffer& out, VkDeviceSize out_off,
                    VkDeviceSize out_bytes, int64_t rows) {
    Dispatch d;
    d.phase = phase;
    d.segments[0] = {w.impl_->weights.buffer, 0, w.impl_->weights.size};
    d.segments[1] = {w.impl_->scales.buffer, 0, w.impl_->scales.size};
    d.segments[2] = {in.buffer, in_off, in_bytes};
    d.segments[3] = {out.buffer, out_off, out_bytes};
    d.push[0] = static_cast<uint32_t>(w.rows());
    d.push[1] = static_cast<uint32_t>(w.cols());
    d.push[2] = static_cast<uint32_t>(rows);
    MatmulGroups(d.push[0], &d.groups_x, &d.groups_y);
    dispatches.push_back(d);
  };
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ExpertChainJob& job = jobs[j];
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    std::memcpy(static_cast<uint8_t*>(x.mapped) + l.x, job.x, l.x_bytes);
    matmul(*job.gate, 0, x, l.x, l.x_bytes, g, l.inner, l.inner_bytes, job.rows);
    matmul(*job.up, 0, x, l.x, l.x_bytes, u, l.inner, l.inner_bytes, job.rows);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    Dispatch d;
    d.situ = true;
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
    const ExpertChainJob& job = jobs[j];
    const Layout& l = layout[j];
    if (l.x_bytes == 0) continue;
    matmul(*job.down, 2, h, l.inner, l.inner_bytes, y, l.y, l.x_bytes, job.rows);
  }
  status = Annotate(s.RunDispatches(dispatches, "expert chain"), s.device_name);
  if (status.ok()) {
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (layout[j].x_bytes == 0) continue;
      std::memcpy(jobs[j].y, static_cast<const uint8_t*>(y.mapped) + layout[j].y,
                  layout[j].x_bytes);
    }
  }
  release();
  return status;
}

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
