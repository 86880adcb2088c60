// `coli bench vk [--json] [--quick] [--experts N]`: the Vulkan expert tier's device work on the
// selected device (COLI_VK_DEVICE; COLI_VK_STAGING=1 forces staged device-local residency)
// against that device's own limits, measured in the same run.
//
// 1. Uploads. Expert-sized MXFP4 matrices (gate, up [inter, latent], down [latent, inter]:
//    e2m1 bytes plus the f32-widened exponents) are uploaded the way the tier does it (one
//    UploadMxfp4Batch per expert; staged through the staging buffer on a discrete GPU), best of
//    3 rounds of `experts` experts: upload_gbs (device bytes per second). The limit:
//    h2d_copy_gbs, one plain vkCmdCopyBuffer host-visible -> device-local of one expert's bytes
//    (best of 5). upload_ratio = upload_gbs / h2d_copy_gbs.
// 2. Device memory bandwidth: device_bw_gbs = 2·bytes / time of one device-local -> device-local
//    vkCmdCopyBuffer of device_bw_bytes (reads plus writes; best of 3).
// 3. The expert chain (VulkanContext::ExpertChain: gate, up, SiTU-GLU, down as one submission)
//    on the K3 shapes (latent 3584, inter 3072; --quick: 256, 128) with `experts` resident
//    experts of `pairs` rows each, pairs = 1, 4, 16 (--quick: 1, 4): best wall time of 5 calls
//    (3 with --quick) after one warm-up. gflops = 2·3·inter·latent·pairs·experts / seconds;
//    weight_gbs = experts·expert_device_bytes / seconds; bw_ratio = weight_gbs / device_bw_gbs.
// 4. The CPU's exact-float expert (kernels::Matmul, idot off; ops::SituGlu; OpenMP default
//    threads) on the same matrices and activations, after all device work (step 3): cpu_seconds, cpu_gflops, speedup =
//    cpu_seconds / seconds, and rel_l2 = the worst per-row ||y_vk - y_cpu|| / ||y_cpu||.
//
// --json prints ONE object:
//   {"device": str, "device_index": int, "staging": bool, "latent": int, "inter": int,
//    "experts": int, "expert_device_bytes": int, "upload_gbs": num, "h2d_copy_gbs": num,
//    "upload_ratio": num, "device_bw_bytes": int, "device_bw_gbs": num,
//    "results": [{"pairs": int, "experts": int, "seconds": num, "gflops": num,
//                 "weight_gbs": num, "bw_ratio": num, "cpu_seconds": num, "cpu_gflops": num,
//                 "speedup": num, "rel_l2": num}, ...]}
//
// `coli bench vk --dense [--json] [--quick] [--bits 4|8|32] [--idot]`: the shared experts' block
// (COLI_VK_DENSE: VulkanContext::DenseGlu, gate and up [inner, hidden], SiTU-GLU, down
// [hidden, inner]) on K3's shapes (hidden 7168, inner 2·3072; --quick: 256, 384), random weights
// quantized by the CPU's own load-time code to int4-g64 (default), int8 or f32. Uploads
// (UploadDenseBatch, best of 3) give upload_gbs; device_bw_gbs as in 2.; for rows = 1, 4, 8
// (--quick: 1, 4; a decode pass) the best of 5 (3) submissions after a warm-up: seconds,
// weight_gbs = dense_device_bytes / seconds, bw_ratio = weight_gbs / device_bw_gbs, and the CPU's
// block with the same numerics after all device work: cpu_seconds, speedup, rel_l2 (worst row),
// mismatches (outputs whose bits differ). Numerics: exact-float (K3_IDOT=0) by default; --idot
// the integer-dot block the model runs by default (K3_IDOT=1; DenseGlu with kIdot: gate and up,
// SiTU-GLU on the host, down), the CPU's bits for int8 / int4 (mismatches 0). One object:
//   {"device": str, "device_index": int, "staging": bool, "mode": "dense", "hidden": int,
//    "inner": int, "format": str, "numerics": "float" | "idot", "dense_device_bytes": int,
//    "upload_gbs": num, "device_bw_bytes": int, "device_bw_gbs": num,
//    "results": [{"rows": int, "seconds": num, "weight_gbs": num, "bw_ratio": num,
//                 "cpu_seconds": num, "speedup": num, "rel_l2": num, "mismatches": int}, ...]}
// Exit status: 0 on success; 3 when there is no Vulkan device (message on stderr); 1 when a
// device call fails; 2 for bad arguments.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/vk/vulkan_context.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

using kernels::MatrixView;
using kernels::WeightFormat;
using Clock = std::chrono::steady_clock;

constexpr float kSituBeta = 4.0f;         // K3 activation_situ_beta
constexpr float kSituLinearBeta = 25.0f;  // K3 activation_situ_linear_beta

struct HostMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data, scales;
  MatrixView view() const {
    return MatrixView{WeightFormat::kMxfp4, rows, cols, data.data(), scales.data()};
  }
};

HostMatrix RandomMxfp4(int64_t rows, int64_t cols, std::mt19937& rng) {
  HostMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows * cols / 2));
  m.scales.resize(static_cast<size_t>(rows * cols / 32));
  std::uniform_int_distribution<int> byte(0, 255), exponent(118, 134);
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(byte(rng));
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(exponent(rng));
  return m;
}

struct HostExpert {
  HostMatrix gate, up, down;
};

struct Result {
  int64_t pairs = 0, experts = 0;
  double seconds = 0, gflops = 0, weight_gbs = 0, bw_ratio = 0;
  double cpu_seconds = 0, cpu_gflops = 0, speedup = 0, rel_l2 = 0;
};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "coli bench vk: %s\n", status.ToString().c_str());
  return 1;
}

int Usage(std::FILE* out = stderr) {
  std::fprintf(out,
               "usage: coli bench vk [--json] [--quick] [--experts N]\n"
               "       coli bench vk --dense [--json] [--quick] [--bits 4|8|32] [--idot]\n");
  return 2;
}

// The CPU's SiTU-GLU block (an expert, or the shared experts) for `rows` rows of
// x [rows, gate.cols] into y [rows, down.rows]: exact-float, or with `idot` the integer dots.
absl::Status CpuGlu(const MatrixView& gate, const MatrixView& up, const MatrixView& down,
                    const float* x, int64_t rows, float* y, std::vector<float>& g,
                    std::vector<float>& u, bool idot = false) {
  const int64_t inter = gate.rows;
  g.resize(static_cast<size_t>(rows * inter));
  u.resize(static_cast<size_t>(rows * inter));
  const kernels::MatmulOptions exact{.idot = idot};
  absl::Status s = kernels::Matmul(gate, x, rows, g.data(), exact);
  if (s.ok()) s = kernels::Matmul(up, x, rows, u.data(), exact);
  if (!s.ok()) return s;
  ops::SituGlu(g.data(), u.data(), rows * inter, kSituBeta, kSituLinearBeta, g.data());
  return kernels::Matmul(down, g.data(), rows, y, exact);
}

// The worst per-row ||a - ref|| / ||ref|| of two [rows, cols] arrays.
double WorstRowRelL2(const float* a, const float* ref, int64_t rows, int64_t cols) {
  double worst = 0;
  for (int64_t row = 0; row < rows; ++row) {
    double diff = 0, norm = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = a[row * cols + c], b = ref[row * cols + c];
      diff += (x - b) * (x - b);
      norm += b * b;
    }
    worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : (diff > 0 ? INFINITY : 0.0));
  }
  return worst;
}

// The device's name as a JSON string body.
std::string JsonEscaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) out.push_back(c);
  }
  return out;
}

// Opens the selected device; `*exit_code` is set (3 without a device, 1 on another failure)
// when it returns null.
std::unique_ptr<vulkan::VulkanContext> OpenDevice(int* exit_code) {
  absl::StatusOr<std::unique_ptr<vulkan::VulkanContext>> created = vulkan::VulkanContext::Create();
  if (created.ok()) return std::move(created).value();
  if (created.status().code() == absl::StatusCode::kUnavailable) {
    std::fprintf(stderr, "coli bench vk: no Vulkan device: %s\n",
                 created.status().ToString().c_str());
    *exit_code = 3;
  } else {
    *exit_code = Fail(created.status());
  }
  return nullptr;
}

int RunBenchVkDense(bool json, bool quick, int bits, bool idot);

int RunBenchVk(int argc, char** argv) {
  bool json = false, quick = false, dense = false, idot = false;
  int experts = 0, bits = 0;
  if (WantsHelp(argc, argv)) {
    Usage(stdout);
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--dense")) {
      dense = true;
    } else if (!std::strcmp(argv[i], "--idot")) {
      idot = true;
    } else if (!std::strcmp(argv[i], "--bits") && i + 1 < argc) {
      bits = std::atoi(argv[++i]);
      if (bits != 4 && bits != 8 && bits != 32) return Usage();
    } else if (!std::strcmp(argv[i], "--experts") && i + 1 < argc) {
      experts = std::atoi(argv[++i]);
      if (experts < 1 || experts > 64) return Usage();
    } else {
      std::fprintf(stderr, "coli bench vk: unknown argument '%s'\n", argv[i]);
      return Usage();
    }
  }
  if (dense) {
    if (experts != 0) return Usage();
    return RunBenchVkDense(json, quick, bits == 0 ? 4 : bits, idot);
  }
  if (bits != 0 || idot) return Usage();
  if (experts == 0) experts = quick ? 2 : 4;
  const int64_t latent = quick ? 256 : 3584, inter = quick ? 128 : 3072;
  const std::vector<int64_t> pair_counts = quick ? std::vector<int64_t>{1, 4}
                                                 : std::vector<int64_t>{1, 4, 16};
  const int chain_reps = quick ? 3 : 5;
  const uint64_t bw_bytes = quick ? (8ull << 20) : (512ull << 20);

  int exit_code = 0;
  const std::unique_ptr<vulkan::VulkanContext> opened = OpenDevice(&exit_code);
  if (opened == nullptr) return exit_code;
  vulkan::VulkanContext& vk = *opened;
  std::fprintf(stderr, "coli bench vk: %s (device %d), %s residency, latent %lld, inter %lld\n",
               vk.device_name().c_str(), vk.device_index(),
               vk.staging() ? "staged device-local" : "host-visible",
               static_cast<long long>(latent), static_cast<long long>(inter));

  std::mt19937 rng(20261129);
  std::vector<HostExpert> host(static_cast<size_t>(experts));
  for (HostExpert& e : host) {
    e.gate = RandomMxfp4(inter, latent, rng);
    e.up = RandomMxfp4(inter, latent, rng);
    e.down = RandomMxfp4(latent, inter, rng);
  }
  absl::StatusOr<uint64_t> gate_bytes = vk.Mxfp4DeviceBytes(inter, latent);
  absl::StatusOr<uint64_t> down_bytes = vk.Mxfp4DeviceBytes(latent, inter);
  if (!gate_bytes.ok()) return Fail(gate_bytes.status());
  if (!down_bytes.ok()) return Fail(down_bytes.status());
  const uint64_t expert_device_bytes = 2 * *gate_bytes + *down_bytes;
  // The bytes an upload moves: e2m1 data plus f32 scales of the three matrices.
  const uint64_t expert_upload_bytes =
      3 * static_cast<uint64_t>(inter * latent / 2 + inter * latent / 32 * 4);

  // 1. Uploads, the tier's way, against a plain host -> device copy of the same bytes.
  using Resident = std::vector<std::unique_ptr<vulkan::DeviceMxfp4Matrix>>;
  std::vector<Resident> resident;
  double best_upload = 0;
  for (int round = 0; round < 3; ++round) {
    resident.clear();
    const auto t0 = Clock::now();
    for (const HostExpert& e : host) {
      const MatrixView views[] = {e.gate.view(), e.up.view(), e.down.view()};
      absl::StatusOr<Resident> r = vk.UploadMxfp4Batch(views);
      if (!r.ok()) return Fail(r.status());
      resident.push_back(std::move(r).value());
    }
    const double t = Since(t0);
    if (round == 0 || t < best_upload) best_upload = t;
  }
  const double upload_gbs = static_cast<double>(expert_upload_bytes) * experts / best_upload / 1e9;
  absl::StatusOr<double> h2d = vk.TimeCopy(vulkan::CopyKind::kHostToDevice, expert_upload_bytes, 5);
  if (!h2d.ok()) return Fail(h2d.status());
  const double h2d_gbs = static_cast<double>(expert_upload_bytes) / *h2d / 1e9;

  // 2. Device memory bandwidth.
  absl::StatusOr<double> d2d = vk.TimeCopy(vulkan::CopyKind::kDeviceToDevice, bw_bytes, 3);
  if (!d2d.ok()) return Fail(d2d.status());
  const double device_bw_gbs = 2.0 * static_cast<double>(bw_bytes) / *d2d / 1e9;

  // 3 and 4. The chain on the device for every pair count, then the same experts on the CPU:
  // all device work first, so the CPU's OpenMP threads (which spin a while after each parallel
  // region) do not compete with a CPU-based driver such as lavapipe.
  std::vector<Result> results;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g, u;
  struct Data {
    std::vector<std::vector<float>> xs, ys, ys_cpu;
  };
  std::vector<Data> data(pair_counts.size());
  for (size_t p = 0; p < pair_counts.size(); ++p) {
    const int64_t pairs = pair_counts[p];
    std::vector<std::vector<float>>& xs = data[p].xs;
    std::vector<std::vector<float>>& ys = data[p].ys;
    std::vector<std::vector<float>>& ys_cpu = data[p].ys_cpu;
    xs.resize(host.size());
    ys.resize(host.size());
    ys_cpu.resize(host.size());
    std::vector<vulkan::ExpertChainJob> jobs;
    for (size_t e = 0; e < host.size(); ++e) {
      xs[e].resize(static_cast<size_t>(pairs * latent));
      for (float& v : xs[e]) v = normal(rng);
      ys[e].assign(static_cast<size_t>(pairs * latent), NAN);
      ys_cpu[e].assign(static_cast<size_t>(pairs * latent), NAN);
      jobs.push_back({resident[e][0].get(), resident[e][1].get(), resident[e][2].get(),
                      xs[e].data(), pairs, ys[e].data()});
    }
    Result r;
    r.pairs = pairs;
    r.experts = experts;
    for (int rep = 0; rep <= chain_reps; ++rep) {  // rep 0 warms up
      const auto t0 = Clock::now();
      if (absl::Status s = vk.ExpertChain(jobs, kSituBeta, kSituLinearBeta); !s.ok()) {
        return Fail(s);
      }
      const double t = Since(t0);
      if (rep == 1 || (rep > 1 && t < r.seconds)) r.seconds = t;
    }
    results.push_back(r);
  }
  for (size_t p = 0; p < pair_counts.size(); ++p) {
    const int64_t pairs = pair_counts[p];
    Result& r = results[p];
    const std::vector<std::vector<float>>& xs = data[p].xs;
    const std::vector<std::vector<float>>& ys = data[p].ys;
    std::vector<std::vector<float>>& ys_cpu = data[p].ys_cpu;
    for (int rep = 0; rep <= chain_reps; ++rep) {
      const auto t0 = Clock::now();
      for (size_t e = 0; e < host.size(); ++e) {
        if (absl::Status s = CpuGlu(host[e].gate.view(), host[e].up.view(), host[e].down.view(),
                                    xs[e].data(), pairs, ys_cpu[e].data(), g, u);
            !s.ok()) {
          return Fail(s);
        }
      }
      const double t = Since(t0);
      if (rep == 1 || (rep > 1 && t < r.cpu_seconds)) r.cpu_seconds = t;
    }
    for (size_t e = 0; e < host.size(); ++e) {
      r.rel_l2 =
          std::max(r.rel_l2, WorstRowRelL2(ys[e].data(), ys_cpu[e].data(), pairs, latent));
    }
    const double flops = 2.0 * 3 * static_cast<double>(inter * latent) * pairs * experts;
    r.gflops = flops / r.seconds / 1e9;
    r.weight_gbs = static_cast<double>(expert_device_bytes) * experts / r.seconds / 1e9;
    r.bw_ratio = r.weight_gbs / device_bw_gbs;
    r.cpu_gflops = flops / r.cpu_seconds / 1e9;
    r.speedup = r.cpu_seconds / r.seconds;
  }

  if (json) {
    const std::string name = JsonEscaped(vk.device_name());
    std::printf(
        "{\"device\": \"%s\", \"device_index\": %d, \"staging\": %s, \"latent\": %lld, "
        "\"inter\": %lld, \"experts\": %d, \"expert_device_bytes\": %llu, \"upload_gbs\": %.6g, "
        "\"h2d_copy_gbs\": %.6g, \"upload_ratio\": %.6g, \"device_bw_bytes\": %llu, "
        "\"device_bw_gbs\": %.6g, \"results\": [",
        name.c_str(), vk.device_index(), vk.staging() ? "true" : "false",
        static_cast<long long>(latent), static_cast<long long>(inter), experts,
        static_cast<unsigned long long>(expert_device_bytes), upload_gbs, h2d_gbs,
        upload_gbs / h2d_gbs, static_cast<unsigned long long>(bw_bytes), device_bw_gbs);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "%s{\"pairs\": %lld, \"experts\": %lld, \"seconds\": %.6g, \"gflops\": %.6g, "
          "\"weight_gbs\": %.6g, \"bw_ratio\": %.6g, \"cpu_seconds\": %.6g, \"cpu_gflops\": %.6g, "
          "\"speedup\": %.6g, \"rel_l2\": %.6g}",
          i ? ", " : "", static_cast<long long>(r.pairs), static_cast<long long>(r.experts),
          r.seconds, r.gflops, r.weight_gbs, r.bw_ratio, r.cpu_seconds, r.cpu_gflops, r.speedup,
          r.rel_l2);
    }
    std::printf("]}\n");
  } else {
    std::printf("device: %s (index %d), %s residency\n", vk.device_name().c_str(),
                vk.device_index(), vk.staging() ? "staged device-local" : "host-visible");
    std::printf("upload: %.2f GB/s (%d experts of %.1f MB) vs host->device copy %.2f GB/s: %.2f\n",
                upload_gbs, experts, expert_upload_bytes / 1e6, h2d_gbs, upload_gbs / h2d_gbs);
    std::printf("device memory: %.2f GB/s (copy of %.0f MB, read + write)\n\n", device_bw_gbs,
                bw_bytes / 1e6);
    std::printf(
        "| pairs | experts | ms      | GFLOPS  | weight GB/s | bw_ratio | CPU ms  | CPU GFLOPS "
        "| speedup | rel-L2  |\n");
    std::printf(
        "|-------|---------|---------|---------|-------------|----------|---------|-----------"
        "-|---------|---------|\n");
    for (const Result& r : results) {
      std::printf("| %5lld | %7lld | %7.2f | %7.2f | %11.2f | %8.3f | %7.2f | %10.2f | %7.2f | "
                  "%7.1e |\n",
                  static_cast<long long>(r.pairs), static_cast<long long>(r.experts),
                  r.seconds * 1e3, r.gflops, r.weight_gbs, r.bw_ratio, r.cpu_seconds * 1e3,
                  r.cpu_gflops, r.speedup, r.rel_l2);
    }
  }
  return 0;
}

int RunBenchVkDense(bool json, bool quick, int bits, bool idot) {
  const int64_t hidden = quick ? 256 : 7168, inner = quick ? 384 : 6144;
  const std::vector<int64_t> row_counts = quick ? std::vector<int64_t>{1, 4}
                                                : std::vector<int64_t>{1, 4, 8};
  const int reps = quick ? 3 : 5;
  const uint64_t bw_bytes = quick ? (8ull << 20) : (512ull << 20);
  const WeightFormat format = bits == 4   ? WeightFormat::kInt4G64
                              : bits == 8 ? WeightFormat::kInt8Row
                                          : WeightFormat::kF32;
  int exit_code = 0;
  const std::unique_ptr<vulkan::VulkanContext> opened = OpenDevice(&exit_code);
  if (opened == nullptr) return exit_code;
  vulkan::VulkanContext& vk = *opened;
  const char* numerics = idot ? "idot" : "float";
  std::fprintf(stderr,
               "coli bench vk --dense: %s (device %d), %s residency, hidden %lld, inner %lld, %s, "
               "%s\n",
               vk.device_name().c_str(), vk.device_index(),
               vk.staging() ? "staged device-local" : "host-visible",
               static_cast<long long>(hidden), static_cast<long long>(inner),
               kernels::WeightFormatName(format), numerics);

  // Random weights (σ 0.02) in the CPU's own formats, as the model quantizes them at load.
  std::mt19937 rng(20261129);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<kernels::QuantizedMatrix> host;
  for (const auto& [rows, cols] : {std::pair{inner, hidden}, std::pair{inner, hidden},
                                   std::pair{hidden, inner}}) {
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (float& v : w) v = 0.02f * normal(rng);
    absl::StatusOr<kernels::QuantizedMatrix> q =
        kernels::QuantizedMatrix::FromF32(w.data(), rows, cols, format);
    if (!q.ok()) return Fail(q.status());
    host.push_back(std::move(q).value());
  }
  const MatrixView views[] = {host[0].view(), host[1].view(), host[2].view()};
  uint64_t upload_bytes = 0;
  for (const MatrixView& v : views) upload_bytes += kernels::ViewBytes(v);

  using Resident = std::vector<std::unique_ptr<vulkan::DeviceDenseMatrix>>;
  Resident resident;
  double best_upload = 0;
  for (int round = 0; round < 3; ++round) {
    resident.clear();
    const auto t0 = Clock::now();
    absl::StatusOr<Resident> r = vk.UploadDenseBatch(views);
    if (!r.ok()) return Fail(r.status());
    resident = std::move(r).value();
    const double t = Since(t0);
    if (round == 0 || t < best_upload) best_upload = t;
  }
  uint64_t device_bytes = 0;
  for (const auto& m : resident) device_bytes += m->device_bytes();
  const double upload_gbs = static_cast<double>(upload_bytes) / best_upload / 1e9;
  absl::StatusOr<double> d2d = vk.TimeCopy(vulkan::CopyKind::kDeviceToDevice, bw_bytes, 3);
  if (!d2d.ok()) return Fail(d2d.status());
  const double device_bw_gbs = 2.0 * static_cast<double>(bw_bytes) / *d2d / 1e9;

  struct DenseResult {
    int64_t rows = 0;
    double seconds = 0, weight_gbs = 0, bw_ratio = 0, cpu_seconds = 0, speedup = 0, rel_l2 = 0;
    int64_t mismatches = 0;
  };
  std::vector<DenseResult> results(row_counts.size());
  std::vector<std::vector<float>> xs(row_counts.size()), ys(row_counts.size());
  // All device work first (see RunBenchVk), then the CPU.
  for (size_t i = 0; i < row_counts.size(); ++i) {
    const int64_t rows = row_counts[i];
    xs[i].resize(static_cast<size_t>(rows * hidden));
    for (float& v : xs[i]) v = normal(rng);
    ys[i].assign(static_cast<size_t>(rows * hidden), NAN);
    results[i].rows = rows;
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      const auto t0 = Clock::now();
      if (absl::Status s =
              vk.DenseGlu(*resident[0], *resident[1], *resident[2], xs[i].data(), rows, kSituBeta,
                          kSituLinearBeta, ys[i].data(),
                          idot ? vulkan::MatmulNumerics::kIdot : vulkan::MatmulNumerics::kFloat);
          !s.ok()) {
        return Fail(s);
      }
      const double t = Since(t0);
      if (rep == 1 || (rep > 1 && t < results[i].seconds)) results[i].seconds = t;
    }
  }
  std::vector<float> g, u;
  for (size_t i = 0; i < row_counts.size(); ++i) {
    DenseResult& r = results[i];
    std::vector<float> y_cpu(static_cast<size_t>(r.rows * hidden));
    for (int rep = 0; rep <= reps; ++rep) {
      const auto t0 = Clock::now();
      if (absl::Status s =
              CpuGlu(views[0], views[1], views[2], xs[i].data(), r.rows, y_cpu.data(), g, u, idot);
          !s.ok()) {
        return Fail(s);
      }
      const double t = Since(t0);
      if (rep == 1 || (rep > 1 && t < r.cpu_seconds)) r.cpu_seconds = t;
    }
    r.rel_l2 = WorstRowRelL2(ys[i].data(), y_cpu.data(), r.rows, hidden);
    for (size_t k = 0; k < y_cpu.size(); ++k) {
      r.mismatches += std::memcmp(&ys[i][k], &y_cpu[k], sizeof(float)) != 0 ? 1 : 0;
    }
    r.weight_gbs = static_cast<double>(device_bytes) / r.seconds / 1e9;
    r.bw_ratio = r.weight_gbs / device_bw_gbs;
    r.speedup = r.cpu_seconds / r.seconds;
  }

  if (json) {
    std::printf(
        "{\"device\": \"%s\", \"device_index\": %d, \"staging\": %s, \"mode\": \"dense\", "
        "\"hidden\": %lld, \"inner\": %lld, \"format\": \"%s\", \"numerics\": \"%s\", "
        "\"dense_device_bytes\": %llu, "
        "\"upload_gbs\": %.6g, \"device_bw_bytes\": %llu, \"device_bw_gbs\": %.6g, \"results\": [",
        JsonEscaped(vk.device_name()).c_str(), vk.device_index(), vk.staging() ? "true" : "false",
        static_cast<long long>(hidden), static_cast<long long>(inner),
        kernels::WeightFormatName(format), numerics, static_cast<unsigned long long>(device_bytes),
        upload_gbs, static_cast<unsigned long long>(bw_bytes), device_bw_gbs);
    for (size_t i = 0; i < results.size(); ++i) {
      const DenseResult& r = results[i];
      std::printf(
          "%s{\"rows\": %lld, \"seconds\": %.6g, \"weight_gbs\": %.6g, \"bw_ratio\": %.6g, "
          "\"cpu_seconds\": %.6g, \"speedup\": %.6g, \"rel_l2\": %.6g, \"mismatches\": %lld}",
          i ? ", " : "", static_cast<long long>(r.rows), r.seconds, r.weight_gbs, r.bw_ratio,
          r.cpu_seconds, r.speedup, r.rel_l2, static_cast<long long>(r.mismatches));
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("device: %s (index %d), %s residency\n", vk.device_name().c_str(),
              vk.device_index(), vk.staging() ? "staged device-local" : "host-visible");
  std::printf(
      "shared experts: hidden %lld, inner %lld, %s, %s numerics, %.1f MB on the device; "
      "upload %.2f GB/s; device memory %.2f GB/s\n\n",
      static_cast<long long>(hidden), static_cast<long long>(inner),
      kernels::WeightFormatName(format), numerics, device_bytes / 1e6, upload_gbs, device_bw_gbs);
  std::printf(
      "| rows | ms      | weight GB/s | bw_ratio | CPU ms  | speedup | rel-L2  | bits differ |\n");
  std::printf(
      "|------|---------|-------------|----------|---------|---------|---------|-------------|\n");
  for (const DenseResult& r : results) {
    std::printf("| %4lld | %7.2f | %11.2f | %8.3f | %7.2f | %7.2f | %7.1e | %11lld |\n",
                static_cast<long long>(r.rows), r.seconds * 1e3, r.weight_gbs, r.bw_ratio,
                r.cpu_seconds * 1e3, r.speedup, r.rel_l2, static_cast<long long>(r.mismatches));
  }
  return 0;
}

}  // namespace

COLI_REGISTER_BENCH(vk, "vk",
                    "Vulkan expert tier: uploads, expert chain vs device bandwidth and the CPU "
                    "[--json] [--quick] [--experts N]; --dense [--bits 4|8|32] [--idot]: the "
                    "shared experts' block (COLI_VK_DENSE)",
                    RunBenchVk);

}  // namespace coli::cli
