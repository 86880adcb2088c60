// Shared by the kimi_k3_core tests of batched and mixed passes (batched_decode_session_test.cc,
// mixed_prefill_session_test.cc): bit comparison of logits, and the tiny fixture loaded with an
// expert source that fails on demand (to break a forward pass in the middle).
//
//   std::atomic<bool> fail{false};
//   std::unique_ptr<Model> model = LoadTiny(K3_TEST_TINY, ModelOptions(), &fail);
//   fail = true;   // every expert read from here on answers DATA_LOSS
#ifndef COLI_TESTS_KIMI_K3_CORE_TEST_UTIL_H_
#define COLI_TESTS_KIMI_K3_CORE_TEST_UTIL_H_

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status/status.h"
#include "common/status/status_matchers.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/model.h"

namespace coli::k3::core_test {

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Serves experts from the snapshot until `fail` is set, then refuses every call.
class FailingSource : public ExpertSource {
 public:
  FailingSource(std::unique_ptr<ExpertSource> inner, std::atomic<bool>* fail)
      : inner_(std::move(inner)), fail_(fail) {}
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override {
    if (fail_->load()) return absl::DataLossError("test: expert read failed");
    return inner_->ForEachExpert(layer, experts, fn);
  }

 private:
  std::unique_ptr<ExpertSource> inner_;
  std::atomic<bool>* fail_;
};

// The fixture at `dir` with options `o`; with `fail`, behind a FailingSource. Null (and a test
// failure) when it does not load.
inline std::unique_ptr<Model> LoadTiny(const std::string& dir, const ModelOptions& o,
                                       std::atomic<bool>* fail = nullptr) {
  Model::ExpertSourceFactory experts = nullptr;
  if (fail != nullptr) {
    experts = [fail](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                     int layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
      COLI_ASSIGN_OR_RETURN(auto inner, PreadExpertSource::Create(snapshot, cfg, prefix, layers));
      return std::unique_ptr<ExpertSource>(new FailingSource(std::move(inner), fail));
    };
  }
  auto model = Model::Load(dir, o, nullptr, experts);
  EXPECT_OK(model.status());
  return model.ok() ? std::move(model).value() : nullptr;
}

}  // namespace coli::k3::core_test

#endif  // COLI_TESTS_KIMI_K3_CORE_TEST_UTIL_H_
