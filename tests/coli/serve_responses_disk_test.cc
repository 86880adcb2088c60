// ResponseStore::Persist and ResponseDir (tools/coli/serve_responses_disk.h): stored responses
// kept in a folder survive a new store, files are written whole or not at all, DELETE and
// eviction remove them, and no string that is not a coli response id ever becomes a path.
#include "tools/coli/serve_responses_disk.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/io/io.h"
#include "common/log/log.h"
#include "gtest/gtest.h"
#include "tests/common/io/test_files.h"
#include "tools/coli/serve_responses.h"

namespace coli::cli::serve {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the test's temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "/coli_resp_XXXXXX";
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Collects the log lines of its lifetime (the store logs skipped files and I/O failures).
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel level, std::string_view message) {
      if (level < LogLevel::kWarning) return;
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(message);
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

void WriteAll(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(io::WriteFileAtomic(path, bytes).ok()) << path;
}

// The names in `dir`, sorted, without the lock file an open ResponseDir keeps there.
std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  names.erase(std::string(ResponseDir::kLockName));
  return names;
}

// The permission bits of `path` (-1 when it cannot be stat'ed).
int ModeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 07777);
}

// Sets the process umask for its lifetime (022: what the files would get without coli's modes).
class Umask {
 public:
  explicit Umask(mode_t mask) : old_(::umask(mask)) {}
  ~Umask() { ::umask(old_); }

 private:
  mode_t old_;
};

// A finished response object as the gateway stores it.
Json Response(const std::string& id, int64_t created_at, const std::string& status,
              const std::string& text) {
  Json output = Json::array();
  output.push_back(Json{{"id", NewId("msg_")},
                        {"type", "message"},
                        {"status", "completed"},
                        {"role", "assistant"},
                        {"content", Json::array({Json{{"type", "output_text"},
                                                      {"annotations", Json::array()},
                                                      {"logprobs", Json::array()},
                                                      {"text", text}}})}});
  return Json{{"id", id},
              {"object", "response"},
              {"created_at", created_at},
              {"status", status},
              {"model", "kimi-k3"},
              {"output", output},
              {"usage", Json{{"input_tokens", 7}, {"output_tokens", 3}}},
              {"metadata", Json{{"k", "v\u00e9\n\"quoted\""}}}};
}

Json Conversation(const std::string& question, const std::string& answer) {
  return Json::array({Json{{"role", "user"}, {"content", question}},
                      Json{{"role", "assistant"}, {"content", answer}}});
}

Json Items(const std::string& question) {
  return Json::array(
      {Json{{"id", NewId("msg_")},
            {"type", "message"},
            {"role", "user"},
            {"status", "completed"},
            {"content", Json::array({Json{{"type", "input_text"}, {"text", question}}})}}});
}

// A completed response answering "q" with `text`, created at `created_at`.
void PutDone(ResponseStore& store, const std::string& id, int64_t created_at,
             const std::string& text) {
  store.Put(id, Response(id, created_at, "completed", text), Conversation("q", text));
}

std::unique_ptr<ResponseDir> OpenDir(const std::string& path) {
  auto dir = ResponseDir::Open(path);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *std::move(dir) : nullptr;
}

TEST(ResponseDirTest, NewIdMakesNamesTheFolderAccepts) {
  // If the gateway's ids change form, stored responses would silently stop being written.
  for (int i = 0; i < 100; ++i) {
    const std::string id = NewId("resp_");
    EXPECT_TRUE(ResponseDir::IsResponseId(id)) << id;
  }
}

TEST(ResponseDirTest, OnlyResponseIdsMapToAPath) {
  TempDir tmp;
  auto dir = OpenDir(tmp.path());
  ASSERT_NE(dir, nullptr);
  const std::string good = "resp_0123456789abcdef01234567";
  ASSERT_TRUE(dir->PathOf(good).has_value());
  EXPECT_EQ(*dir->PathOf(good), tmp.path() + "/" + good + ".json");
  const std::vector<std::string> bads = {"../../etc/passwd",
                                         "..%2F..%2Fetc%2Fpasswd",
                                         "resp_../../../../etc/passwd",
                                         "resp_0123456789abcdef0123456",
                                         "resp_0123456789abcdef012345678",
                                         "resp_0123456789ABCDEF01234567",
                                         "resp_0123456789abcdef0123456/",
                                         "/resp_0123456789abcdef0123456",
                                         "msg_0123456789abcdef01234567",
                                         "resp_0123456789abcdef0123456g",
                                         "",
                                         "resp_",
                                         std::string("resp_0123456789abcdef0123456\0", 29)};
  for (const std::string& bad : bads) {
    EXPECT_FALSE(dir->PathOf(bad).has_value()) << bad;
    EXPECT_FALSE(ResponseDir::IsResponseId(bad)) << bad;
    EXPECT_EQ(dir->Write(bad, "x").code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(dir->Remove(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(Names(tmp.path()).empty());
}

TEST(ResponseDirTest, AClientsIdNeverTouchesAFile) {
  TempDir tmp;
  const std::string dir_path = tmp.path() + "/responses";
  // A file beside the folder that a traversal would reach.
  const std::string victim = tmp.path() + "/victim.json";
  WriteAll(victim, "keep me");
  LogCapture log;
  ResponseStore store;
  store.Persist(OpenDir(dir_path));
  EXPECT_FALSE(store.Response("../victim").has_value());
  EXPECT_FALSE(store.Erase("../victim"));
  EXPECT_FALSE(store.Erase("..%2Fvictim"));
  // Even a Put under such an id (the gateway never makes one) writes nothing.
  store.Put("../victim", Response("../victim", 1, "completed", "x"), Conversation("q", "x"));
  EXPECT_TRUE(store.Response("../victim").has_value());  // still served from memory
  EXPECT_TRUE(store.Erase("../victim"));
  EXPECT_EQ(test_files::ReadRaw(victim), "keep me");
  EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{"responses", "victim.json"}));
  EXPECT_TRUE(Names(dir_path).empty());
}

TEST(ResponseStoreDiskTest, StoredResponsesSurviveANewStore) {
  TempDir tmp;
  const std::string a = NewId("resp_"), b = NewId("resp_"), c = NewId("resp_"),
                    running = NewId("resp_");
  const Json ra = Response(a, 100, "completed", "first"),
             rb = Response(b, 101, "incomplete", "second"), rc = Response(c, 102, "failed", "");
  {
    ResponseStore store;
    EXPECT_EQ(store.Persist(OpenDir(tmp.path())), 0u);
    store.Put(a, ra, Conversation("q1", "first"), Items("q1"));
    store.Put(b, rb, Conversation("q2", "second"), Items("q2"));
    store.Put(c, rc, nullptr, Items("q3"));  // a failed background response: no conversation
    Json queued = Response(running, 103, "queued", "");
    store.Put(running, queued, nullptr, Items("q4"));  // still running: no file yet
    EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{a + ".json", b + ".json", c + ".json"}));
  }
  {  // one store per folder: `again` goes before `third` opens it
    ResponseStore again;
    EXPECT_EQ(again.Persist(OpenDir(tmp.path())), 3u);
    EXPECT_EQ(again.size(), 3u);
    ASSERT_TRUE(again.Response(a).has_value());
    EXPECT_EQ(*again.Response(a), ra);
    EXPECT_EQ(again.Response(a)->dump(), ra.dump());  // key order too (ordered_json)
    EXPECT_EQ(*again.Response(b), rb);
    EXPECT_EQ(*again.Response(c), rc);
    EXPECT_EQ(*again.Conversation(a), Conversation("q1", "first"));
    EXPECT_EQ(*again.Conversation(b), Conversation("q2", "second"));
    EXPECT_FALSE(again.Conversation(c).has_value());
    ASSERT_TRUE(again.InputItems(b).has_value());
    EXPECT_EQ((*again.InputItems(b))[0]["content"][0]["text"], "q2");
    EXPECT_FALSE(again.Response(running).has_value());

    // The running one finishes in the new store: its Put writes it; a third store sees 4.
    again.Put(running, Response(running, 103, "cancelled", "partial"), nullptr, Items("q4"));
  }
  ResponseStore third;
  EXPECT_EQ(third.Persist(OpenDir(tmp.path())), 4u);
  EXPECT_EQ((*third.Response(running))["status"], "cancelled");
}

TEST(ResponseStoreDiskTest, TheFileHoldsWhatTheStoreKeeps) {
  TempDir tmp;
  const std::string id = NewId("resp_");
  ResponseStore store;
  store.Persist(OpenDir(tmp.path()));
  const Json response = Response(id, 5, "completed", "hi");
  store.Put(id, response, Conversation("q", "hi"), Items("q"));
  const Json file = Json::parse(test_files::ReadRaw(tmp.path() + "/" + id + ".json"));
  EXPECT_EQ(file["format"], "coli.response");
  EXPECT_EQ(file["version"], ResponseDir::kVersion);
  EXPECT_EQ(file["id"], id);
  EXPECT_EQ(file["response"], response);
  EXPECT_EQ(file["conversation"], Conversation("q", "hi"));
  EXPECT_EQ(file["input_items"][0]["content"][0]["text"], "q");
}

TEST(ResponseStoreDiskTest, TempLeftoversAndBadFilesAreSkippedTheGoodOnesLoad) {
  TempDir tmp;
  const std::string good1 = NewId("resp_"), good2 = NewId("resp_");
  {
    ResponseStore store;
    store.Persist(OpenDir(tmp.path()));
    PutDone(store, good1, 10, "one");
    PutDone(store, good2, 11, "two");
  }
  const std::string text = test_files::ReadRaw(tmp.path() + "/" + good1 + ".json");
  auto file_of = [&](const std::string& id) { return tmp.path() + "/" + id + ".json"; };
  auto with_id = [&](const std::string& id) {  // good1's file, renamed to `id`
    Json j = Json::parse(text);
    j["id"] = id;
    j["response"]["id"] = id;
    return j;
  };
  // A crash mid-write: the temp file of a new response, and one replacing good2's file.
  // (Built with append: GCC 12's -Wrestrict misfires on "." + std::string.)
  std::string tmp_new = ".", tmp_old = ".";
  tmp_new.append(NewId("resp_")).append(".json.tmp.AbC123");
  tmp_old.append(good2).append(".json.tmp.x0Y9zQ");
  WriteAll(tmp.path() + "/" + tmp_new, text.substr(0, text.size() / 2));
  WriteAll(tmp.path() + "/" + tmp_old, "{");
  // Files that cannot be loaded, each to be named once and left alone.
  const std::string truncated = NewId("resp_"), empty = NewId("resp_"), version = NewId("resp_"),
                    format = NewId("resp_"), other_id = NewId("resp_"), running = NewId("resp_"),
                    bad_time = NewId("resp_"), not_object = NewId("resp_");
  Json t = with_id(truncated);
  std::string t_text = t.dump();
  WriteAll(file_of(truncated), t_text.substr(0, t_text.size() - 7));
  WriteAll(file_of(empty), "");
  Json v = with_id(version);
  v["version"] = 2;
  WriteAll(file_of(version), v.dump());
  Json f = with_id(format);
  f["format"] = "something.else";
  WriteAll(file_of(format), f.dump());
  WriteAll(file_of(other_id), with_id(good1).dump());  // good1's content under another name
  Json r = with_id(running);
  r["response"]["status"] = "in_progress";
  WriteAll(file_of(running), r.dump());
  Json bt = with_id(bad_time);
  bt["response"]["created_at"] = "yesterday";
  WriteAll(file_of(bad_time), bt.dump());
  WriteAll(file_of(not_object), "[1, 2]");
  // Not ours: ignored and untouched.
  WriteAll(tmp.path() + "/notes.txt", "hello");
  WriteAll(tmp.path() + "/RESP_0123456789abcdef01234567.json", "hello");
  fs::create_directory(file_of(NewId("resp_")));  // a folder with a response's name
  const std::set<std::string> bad = {truncated, empty,   version,  format,
                                     other_id,  running, bad_time, not_object};

  LogCapture log;
  ResponseStore store;
  EXPECT_EQ(store.Persist(OpenDir(tmp.path())), 2u);
  EXPECT_EQ(*store.Conversation(good1), Conversation("q", "one"));
  EXPECT_EQ(*store.Conversation(good2), Conversation("q", "two"));
  for (const std::string& id : bad) EXPECT_FALSE(store.Response(id).has_value()) << id;

  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), bad.size() + 1);  // + the folder with a response's name
  std::set<std::string> named;
  for (const std::string& line : lines) {
    for (const std::string& id : bad) {
      if (line.find(file_of(id)) != std::string::npos) named.insert(id);
    }
  }
  EXPECT_EQ(named, bad);
  auto line_of = [&](const std::string& id) {
    for (const std::string& line : lines) {
      if (line.find(file_of(id)) != std::string::npos) return line;
    }
    return std::string();
  };
  EXPECT_NE(line_of(truncated).find("not valid JSON"), std::string::npos) << line_of(truncated);
  EXPECT_NE(line_of(version).find("version 2"), std::string::npos) << line_of(version);
  EXPECT_NE(line_of(running).find("status"), std::string::npos) << line_of(running);
  EXPECT_NE(line_of(bad_time).find("created_at"), std::string::npos) << line_of(bad_time);

  const std::set<std::string> names = Names(tmp.path());
  EXPECT_EQ(names.count(tmp_new), 0u);  // temp files removed
  EXPECT_EQ(names.count(tmp_old), 0u);
  for (const std::string& id : bad) EXPECT_EQ(names.count(id + ".json"), 1u) << id;  // kept
  EXPECT_EQ(names.count("notes.txt"), 1u);
  EXPECT_EQ(names.count("RESP_0123456789abcdef01234567.json"), 1u);
  EXPECT_EQ(Json::parse(
                test_files::ReadRaw(file_of(good2)))["response"]["output"][0]["content"][0]["text"],
            "two");  // the old file a crashed rewrite was to replace is intact
}

TEST(ResponseStoreDiskTest, DeleteRemovesTheFile) {
  TempDir tmp;
  const std::string a = NewId("resp_"), b = NewId("resp_");
  {  // one store per folder: this one goes before `again` opens it
    ResponseStore store;
    store.Persist(OpenDir(tmp.path()));
    PutDone(store, a, 1, "a");
    PutDone(store, b, 2, "b");
    EXPECT_TRUE(store.Erase(a));
    EXPECT_FALSE(store.Erase(a));
    EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{b + ".json"}));
  }
  ResponseStore again;
  EXPECT_EQ(again.Persist(OpenDir(tmp.path())), 1u);
  EXPECT_FALSE(again.Response(a).has_value());
  EXPECT_TRUE(again.Response(b).has_value());
}

TEST(ResponseStoreDiskTest, EvictionRemovesTheFilesOfTheEvicted) {
  TempDir tmp;
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(NewId("resp_"));
  ResponseStore store(/*max_entries=*/2);
  store.Persist(OpenDir(tmp.path()));
  for (int i = 0; i < 4; ++i) {
    PutDone(store, ids[i], i, "t");
  }
  EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{ids[2] + ".json", ids[3] + ".json"}));

  // By bytes: one big response pushes the two others out.
  const std::string big = NewId("resp_");
  const size_t one = Response(ids[0], 0, "completed", "t").dump().size() +
                     Conversation("q", "t").dump().size() + 2;
  ResponseStore bytes_store(/*max_entries=*/100, /*max_bytes=*/3 * one);
  TempDir tmp2;
  bytes_store.Persist(OpenDir(tmp2.path()));
  PutDone(bytes_store, ids[0], 0, "t");
  PutDone(bytes_store, ids[1], 1, "t");
  EXPECT_EQ(Names(tmp2.path()).size(), 2u);
  bytes_store.Put(big, Response(big, 2, "completed", std::string(2 * one, 'x')),
                  Conversation("q", "t"));
  EXPECT_EQ(Names(tmp2.path()), (std::set<std::string>{big + ".json"}));
}

TEST(ResponseStoreDiskTest, LoadingKeepsTheNewestByCreatedAtUnderTheLimits) {
  TempDir tmp;
  // Written newest first, so neither write order nor file times give the created_at order.
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(NewId("resp_"));
  {
    ResponseStore store;
    store.Persist(OpenDir(tmp.path()));
    for (int i = 4; i >= 0; --i) {
      PutDone(store, ids[i], 1000 + i, "t");
    }
  }
  ResponseStore small(/*max_entries=*/2);
  EXPECT_EQ(small.Persist(OpenDir(tmp.path())), 2u);
  EXPECT_TRUE(small.Response(ids[3]).has_value());
  EXPECT_TRUE(small.Response(ids[4]).has_value());
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(small.Response(ids[i]).has_value()) << i;
  EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{ids[3] + ".json", ids[4] + ".json"}));
  // The oldest loaded is evicted first by the next Put.
  const std::string next = NewId("resp_");
  PutDone(small, next, 2000, "t");
  EXPECT_FALSE(small.Response(ids[3]).has_value());
  EXPECT_EQ(Names(tmp.path()), (std::set<std::string>{ids[4] + ".json", next + ".json"}));

  // Same created_at: by id.
  TempDir tmp2;
  std::vector<std::string> same = {NewId("resp_"), NewId("resp_"), NewId("resp_")};
  {
    ResponseStore store;
    store.Persist(OpenDir(tmp2.path()));
    for (const std::string& id : same) {
      PutDone(store, id, 7, "t");
    }
  }
  std::sort(same.begin(), same.end());
  ResponseStore one(/*max_entries=*/1);
  EXPECT_EQ(one.Persist(OpenDir(tmp2.path())), 1u);
  EXPECT_TRUE(one.Response(same[2]).has_value());
}

TEST(ResponseStoreDiskTest, AFailedWriteIsLoggedAndTheResponseStillServed) {
  TempDir tmp;
  const std::string dir_path = tmp.path() + "/gone";
  ResponseStore store;
  store.Persist(OpenDir(dir_path));
  fs::remove_all(dir_path);  // the folder disappears under the running server
  LogCapture log;
  const std::string id = NewId("resp_");
  PutDone(store, id, 1, "t");
  EXPECT_EQ(*store.Conversation(id), Conversation("q", "t"));
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(id), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("not written"), std::string::npos) << lines[0];
  EXPECT_TRUE(store.Erase(id));  // the file is not there: nothing to log
  EXPECT_EQ(log.lines().size(), 1u);
}

TEST(ResponseDirTest, OpenNamesAFolderItCannotUse) {
  TempDir tmp;
  const std::string file = tmp.path() + "/a_file";
  WriteAll(file, "x");
  for (const std::string& bad : {file, file + "/sub"}) {
    auto dir = ResponseDir::Open(bad);
    ASSERT_FALSE(dir.ok()) << bad;
    EXPECT_NE(dir.status().message().find("responses dir '" + bad + "'"), std::string::npos)
        << dir.status();
  }
  EXPECT_FALSE(ResponseDir::Open("").ok());
  // Missing parents are made; the probe leaves nothing behind.
  const std::string nested = tmp.path() + "/x/y/z";
  ASSERT_NE(OpenDir(nested), nullptr);
  EXPECT_TRUE(Names(nested).empty());
}

TEST(ResponseDirTest, DecodeRefusesWhatItDoesNotKnow) {
  const std::string id = "resp_0123456789abcdef01234567";
  StoredResponse r{id, Response(id, 3, "completed", "x"), Conversation("q", "x"), Items("q")};
  const std::string bytes = ResponseDir::Encode(id, r.response, r.conversation, r.input_items);
  auto back = ResponseDir::Decode(bytes, id, "f.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->response, r.response);
  EXPECT_EQ(back->conversation, r.conversation);
  EXPECT_EQ(back->input_items, r.input_items);
  // Every proper prefix of the file is refused (a write cut anywhere), never a crash.
  for (size_t n = 0; n + 1 < bytes.size(); ++n) {
    auto cut = ResponseDir::Decode(std::string_view(bytes).substr(0, n), id, "f.json");
    ASSERT_FALSE(cut.ok()) << n;
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(cut.status().message().find("'f.json'"), std::string::npos);
  }
  EXPECT_FALSE(ResponseDir::Decode(bytes, "resp_0123456789abcdef01234568", "f.json").ok());
  EXPECT_FALSE(ResponseDir::Decode(std::string(5000, '[') + std::string(5000, ']'), id, "f.json")
                   .ok());  // nesting bounded
  Json j = Json::parse(bytes);
  for (const char* key : {"format", "version", "id", "response", "conversation", "input_items"}) {
    Json k = j;
    k.erase(key);
    EXPECT_FALSE(ResponseDir::Decode(k.dump(), id, "f.json").ok()) << key;
  }
  Json nc = j;
  nc["conversation"] = nullptr;
  EXPECT_TRUE(ResponseDir::Decode(nc.dump(), id, "f.json").ok());
}

TEST(ResponseDirTest, FilesArePrivateAndAFolderItMakesIs0700) {
  Umask umask(022);  // without coli's modes: a 0755 folder and 0644 files
  TempDir tmp;
  const std::string dir_path = tmp.path() + "/made/here";
  const std::string id = NewId("resp_");
  {
    ResponseStore store;
    store.Persist(OpenDir(dir_path));
    EXPECT_EQ(ModeOf(dir_path), 0700);
    EXPECT_EQ(ModeOf(tmp.path() + "/made"), 0755);  // parents: the default, like mkdir -p
    EXPECT_EQ(ModeOf(dir_path + "/.lock"), 0600);
    PutDone(store, id, 1, "a secret");
    EXPECT_EQ(ModeOf(dir_path + "/" + id + ".json"), 0600);
    // A rewrite (rename over the old file) keeps it private too.
    PutDone(store, id, 1, "another secret");
    EXPECT_EQ(ModeOf(dir_path + "/" + id + ".json"), 0600);
  }
  // Reopened: an existing private folder stays as it is, without a warning.
  LogCapture log;
  ResponseStore again;
  EXPECT_EQ(again.Persist(OpenDir(dir_path)), 1u);
  EXPECT_EQ(ModeOf(dir_path), 0700);
  EXPECT_TRUE(log.lines().empty()) << log.lines()[0];
}

TEST(ResponseDirTest, AReadableFolderKeepsItsModeAndIsNamedInOneWarning) {
  TempDir tmp;
  for (const int mode : {0755, 0750}) {
    const std::string dir_path = tmp.path() + "/d" + std::to_string(mode);
    ASSERT_EQ(::mkdir(dir_path.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(dir_path.c_str(), static_cast<mode_t>(mode)), 0);
    LogCapture log;
    auto dir = OpenDir(dir_path);
    ASSERT_NE(dir, nullptr);
    EXPECT_EQ(ModeOf(dir_path), mode);  // the user's folder: never chmod'ed
    const std::vector<std::string> lines = log.lines();
    ASSERT_EQ(lines.size(), 1u) << mode;
    EXPECT_NE(lines[0].find("responses dir '" + dir_path + "'"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(mode == 0755 ? "other users" : "its group"), std::string::npos)
        << lines[0];
    const std::string id = NewId("resp_");
    ASSERT_TRUE(dir->Write(id, "{}").ok());
    EXPECT_EQ(ModeOf(*dir->PathOf(id)), 0600);  // the files are private all the same
  }
}

TEST(ResponseDirTest, ASecondOpenOfTheFolderFailsWhileTheFirstLives) {
  TempDir tmp;
  auto first = OpenDir(tmp.path());
  ASSERT_NE(first, nullptr);
  // A crash leftover of the first server's: the second must not get as far as removing it.
  std::string leftover = tmp.path() + "/.";
  leftover.append(NewId("resp_")).append(".json.tmp.AbC123");
  WriteAll(leftover, "{");
  for (int i = 0; i < 2; ++i) {
    auto second = ResponseDir::Open(tmp.path());
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("responses dir '" + tmp.path() + "'"),
              std::string::npos)
        << second.status();
    EXPECT_NE(second.status().message().find("another coli serve uses it"), std::string::npos)
        << second.status();
  }
  EXPECT_TRUE(fs::exists(leftover));
  // The same folder by another spelling is the same lock.
  EXPECT_FALSE(ResponseDir::Open(tmp.path() + "/.").ok());
  // Released with the first: the folder can be opened again (the failed tries held nothing).
  first.reset();
  auto again = ResponseDir::Open(tmp.path());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(ResponseDir::Open(tmp.path()).ok());
}

TEST(ResponseStoreDiskTest, ConcurrentPutsAndErasesLeaveTheFolderEqualToTheStore) {
  TempDir tmp;
  ResponseStore store(/*max_entries=*/12);
  store.Persist(OpenDir(tmp.path()));
  std::mutex mu;
  std::vector<std::string> all;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        const std::string id = NewId("resp_");
        PutDone(store, id, t * 100 + i, "t");
        if (i % 3 == 0) store.Erase(id);
        std::lock_guard<std::mutex> lock(mu);
        all.push_back(id);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> in_store;
  for (const std::string& id : all) {
    if (store.Response(id)) in_store.insert(id + ".json");
  }
  EXPECT_EQ(in_store.size(), store.size());
  EXPECT_EQ(Names(tmp.path()), in_store);
}

}  // namespace
}  // namespace coli::cli::serve
