// PluginSet::ForModel on model folders no plugin serves, with the real kimi_k3 plugin: the
// message names what the folder's config.json declares (or why it cannot be read) and what each
// loaded plugin serves, so a user pointed at the wrong folder or a foreign model sees why.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/plugin.h"

namespace coli::host {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class ModelFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plugins_ = PluginSet::LoadDir(COLI_PLUGIN_DIR_FOR_TEST);
    ASSERT_EQ(plugins_.plugins().size(), 1u) << "expected the kimi_k3 plugin alone";
    root_ = fs::temp_directory_path() /
            ("coli_model_folder_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(root_ / "model" / "config.json", fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }
  std::string Folder(const std::string& config_text) {
    fs::create_directories(root_ / "model");
    std::ofstream(root_ / "model" / "config.json") << config_text;
    return (root_ / "model").string();
  }

  PluginSet plugins_;
  fs::path root_;
};

constexpr char kSupported[] =
    "supported: kimi_k3: architectures KimiK3ForConditionalGeneration (KimiK3*) or model_type "
    "'kimi_k3'";

TEST_F(ModelFolderTest, ServesTheKimiFixture) {
  ASSERT_OK_AND_ASSIGN(const Plugin* plugin, plugins_.ForModel(COLI_K3_TINY_DIR));
  EXPECT_EQ(plugin->family(), "kimi_k3");
}

TEST_F(ModelFolderTest, ForeignArchitectureNamesItAndTheSupportedOnes) {
  const std::string dir = Folder(
      R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096})");
  EXPECT_THAT(plugins_.ForModel(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("no plugin serves model directory '" + dir + "'"),
                             HasSubstr("declares model_type 'llama', architectures "
                                       "LlamaForCausalLM"),
                             HasSubstr(kSupported))));
  const std::string v3 = Folder(R"({"architectures": ["DeepseekV3ForCausalLM"]})");
  EXPECT_THAT(plugins_.ForModel(v3),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("declares architectures DeepseekV3ForCausalLM"),
                             HasSubstr(kSupported))));
}

TEST_F(ModelFolderTest, ConfigWithoutModelTypeOrArchitecturesSaysSo) {
  const std::string dir = Folder("{}");
  EXPECT_THAT(plugins_.ForModel(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("config.json' names neither model_type nor architectures")));
}

TEST_F(ModelFolderTest, ConfigThatIsNotJsonNamesTheParseError) {
  const std::string dir = Folder("{\"architectures\": [");
  EXPECT_THAT(
      plugins_.ForModel(dir),
      StatusIs(absl::StatusCode::kNotFound,
               AllOf(HasSubstr(dir + "/config.json: parse error at line"), HasSubstr(kSupported))));
}

TEST_F(ModelFolderTest, EmptyFolderAndHuggingFaceCacheRootSaySo) {
  fs::create_directories(root_ / "empty");
  EXPECT_THAT(plugins_.ForModel((root_ / "empty").string()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("it has no config.json; the folder is empty")));
  // models--org--name/ holds blobs/, refs/, snapshots/<revision>/: the model is one level down.
  const fs::path cache = root_ / "models--moonshotai--Kimi-K3";
  fs::create_directories(cache / "snapshots" / "0123abcd");
  fs::create_directories(cache / "blobs");
  EXPECT_THAT(plugins_.ForModel(cache.string()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("looks like a Hugging Face cache folder: give one of its "
                                 "snapshots/<revision> folders")));
}

TEST_F(ModelFolderTest, DanglingConfigSymlinkNamesItsTarget) {
  fs::create_directories(root_ / "model");
  fs::create_symlink("../../blobs/0badc0de", root_ / "model" / "config.json");
  EXPECT_THAT(plugins_.ForModel((root_ / "model").string()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("config.json' is a symlink to '../../blobs/0badc0de', which "
                                 "does not exist")));
}

TEST_F(ModelFolderTest, UnreadableConfigNamesTheReason) {
  const std::string dir = Folder(R"({"model_type": "kimi_k3"})");
  fs::permissions(root_ / "model" / "config.json", fs::perms::none);
  if (::access((root_ / "model" / "config.json").c_str(), R_OK) == 0) {
    GTEST_SKIP() << "running with permission to read any file (root)";
  }
  EXPECT_THAT(plugins_.ForModel(dir),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("config.json': cannot open: Permission denied"),
                             HasSubstr(kSupported))));
}

}  // namespace
}  // namespace coli::host
