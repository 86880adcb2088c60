// Background responses that stream (tools/coli/serve_responses_stream.h): the kept event log
// read live and replayed, a stream cut and resumed equal to the uninterrupted one, the bound,
// readers ended by Close; the builder's queued start and its snapshots (a running response's
// output so far) taken while another thread writes; the store's live view and event log; the
// input items of a follow-up. Threads synchronise on the log's events, never on sleeps.
#include "tools/coli/serve_responses_stream.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tools/coli/serve_responses.h"

namespace coli::cli::serve {
namespace {

Json J(const char* text) { return Json::parse(text); }

// The JSON of an SSE frame ("event: <type>\ndata: <json>\n\n").
Json Data(const std::string& frame) {
  const size_t at = frame.find("\ndata: ");
  EXPECT_NE(at, std::string::npos) << frame;
  return Json::parse(frame.substr(at + 7));
}

std::string Frame(int64_t sequence) {
  return SseEventFrame(Json{{"type", "response.output_text.delta"}, {"sequence_number", sequence}});
}

// Reads `log` from after `cursor` to its end (or until `stop_after` frames were read).
std::vector<std::string> ReadAll(const ResponseEventLog& log, int64_t* cursor,
                                 size_t stop_after = SIZE_MAX) {
  std::vector<std::string> frames;
  while (frames.size() < stop_after &&
         log.Next(cursor, &frames) == ResponseEventLog::Read::kEvents) {
  }
  return frames;
}

TEST(ResponseEventLog, ReplaysThenFollowsUntilClosed) {
  ResponseEventLog log;
  for (int64_t i = 0; i < 3; ++i) log.Append(i, Frame(i));
  int64_t cursor = -1;
  std::vector<std::string> frames;
  ASSERT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kEvents);
  EXPECT_EQ(frames, (std::vector<std::string>{Frame(0), Frame(1), Frame(2)}));
  EXPECT_EQ(cursor, 2);
  // A reader that waits on an open log gets what comes next, then the end.
  std::vector<std::string> live;
  std::thread reader([&] {
    int64_t c = 2;
    live = ReadAll(log, &c);
  });
  log.Append(3, Frame(3));
  log.Append(4, Frame(4));
  log.Close();
  reader.join();
  EXPECT_EQ(live, (std::vector<std::string>{Frame(3), Frame(4)}));
  // Closed: a replay from any point ends after the last event; later events are ignored.
  log.Append(5, Frame(5));
  cursor = 1;
  EXPECT_EQ(ReadAll(log, &cursor).size(), 3u);
  EXPECT_EQ(cursor, 4);
  cursor = 4;
  EXPECT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kEnd);
  cursor = 40;  // past the end of a finished response: nothing, at once
  EXPECT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kEnd);
  EXPECT_TRUE(log.closed());
  EXPECT_EQ(log.next_sequence(), 5);
}

TEST(ResponseEventLog, KeepsAtMostMaxBytesDroppingTheOldest) {
  const size_t frame = Frame(0).size();
  ResponseEventLog log(3 * frame + frame / 2);
  for (int64_t i = 0; i < 5; ++i) log.Append(i, Frame(i));
  EXPECT_EQ(log.first_kept(), 2);
  EXPECT_EQ(log.bytes(), 3 * frame);
  std::vector<std::string> frames;
  int64_t cursor = -1;
  EXPECT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kDropped);
  cursor = 0;
  EXPECT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kDropped);
  EXPECT_TRUE(frames.empty());
  cursor = 1;  // the first kept event comes next
  ASSERT_EQ(log.Next(&cursor, &frames), ResponseEventLog::Read::kEvents);
  EXPECT_EQ(frames, (std::vector<std::string>{Frame(2), Frame(3), Frame(4)}));
  // One event bigger than the bound alone is still kept.
  ResponseEventLog tiny(4);
  tiny.Append(0, Frame(0));
  tiny.Append(1, Frame(1));
  EXPECT_EQ(tiny.first_kept(), 1);
  EXPECT_EQ(tiny.bytes(), frame);
}

TEST(ResponseEventLog, CloseEndsEveryWaitingReader) {
  ResponseEventLog log;
  std::vector<std::thread> readers;
  std::vector<ResponseEventLog::Read> got(4, ResponseEventLog::Read::kEvents);
  for (size_t i = 0; i < got.size(); ++i) {
    readers.emplace_back([&, i] {
      int64_t cursor = -1;
      std::vector<std::string> frames;
      got[i] = log.Next(&cursor, &frames);
    });
  }
  log.Close();
  for (std::thread& t : readers) t.join();
  for (ResponseEventLog::Read r : got) EXPECT_EQ(r, ResponseEventLog::Read::kEnd);
}

// A reader with a max_wait gets kWaiting while nothing comes (so it can check its client), and
// the same results as Next without one once an event or the close does.
TEST(ResponseEventLog, NextWithMaxWaitReturnsWaitingWhileNothingComes) {
  ResponseEventLog log;
  log.Append(0, Frame(0));
  int64_t cursor = -1;
  std::vector<std::string> frames;
  ASSERT_EQ(log.Next(&cursor, &frames, std::chrono::milliseconds(1)),
            ResponseEventLog::Read::kEvents);
  EXPECT_EQ(cursor, 0);
  frames.clear();
  EXPECT_EQ(log.Next(&cursor, &frames, std::chrono::milliseconds(1)),
            ResponseEventLog::Read::kWaiting);
  EXPECT_TRUE(frames.empty());
  EXPECT_EQ(cursor, 0);
  log.Append(1, Frame(1));
  ASSERT_EQ(log.Next(&cursor, &frames, std::chrono::milliseconds(1)),
            ResponseEventLog::Read::kEvents);
  EXPECT_EQ(frames, std::vector<std::string>{Frame(1)});
  log.Close();
  EXPECT_EQ(log.Next(&cursor, &frames, std::chrono::milliseconds(1)), ResponseEventLog::Read::kEnd);
}

Json Queued() {
  ApiError error;
  std::optional<ResponsesRequest> r = ParseResponsesRequest(
      J(R"({"input": "x", "background": true, "stream": true})"), nullptr, &error);
  EXPECT_TRUE(r.has_value()) << error.message;
  Json object = NewResponseObject(*r, "m", 1);
  object["status"] = "queued";
  return object;
}

// A background response's builder writing into a log, as the gateway wires it.
ResponseBuilder::Sink LogSink(ResponseEventLog* log) {
  ResponseBuilder::Sink sink;
  sink.send = [log](const Json& e) {
    log->Append(e["sequence_number"].get<int64_t>(), SseEventFrame(e));
    return true;
  };
  return sink;
}

TEST(ResponseBuilder, BackgroundStartsQueuedAndSnapshotsShowTheOutputSoFar) {
  ResponseEventLog log;
  ResponseBuilder b(Queued(), LogSink(&log));
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(b.Delta("content", "Hel"));
  Json now = b.Snapshot();
  EXPECT_EQ(now["status"], "in_progress");
  ASSERT_EQ(now["output"].size(), 1u);
  EXPECT_EQ(now["output"][0]["status"], "in_progress");
  EXPECT_EQ(now["output"][0]["content"][0]["text"], "Hel");
  ASSERT_TRUE(b.Delta("content", "lo"));
  ASSERT_TRUE(b.Finish({"stop", 3, 2, 0, 0}));
  log.Close();
  int64_t cursor = -1;
  std::vector<std::string> frames = ReadAll(log, &cursor);
  std::vector<std::string> types;
  for (const std::string& f : frames) types.push_back(Data(f)["type"].get<std::string>());
  const std::vector<std::string> want = {"response.created",
                                         "response.queued",
                                         "response.in_progress",
                                         "response.output_item.added",
                                         "response.content_part.added",
                                         "response.output_text.delta",
                                         "response.output_text.delta",
                                         "response.output_text.done",
                                         "response.content_part.done",
                                         "response.output_item.done",
                                         "response.completed"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(Data(frames[0])["response"]["status"], "queued");
  EXPECT_EQ(Data(frames[1])["response"]["status"], "queued");
  EXPECT_EQ(Data(frames[2])["response"]["status"], "in_progress");
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(Data(frames[i])["sequence_number"], static_cast<int64_t>(i));
  }
  EXPECT_EQ(b.Snapshot()["status"], "completed");
  EXPECT_EQ(b.Snapshot()["output"][0]["content"][0]["text"], "Hello");
}

// The writer runs on its own thread while readers follow, cut and resume, and snapshot.
TEST(ResponseEventLog, AResumedStreamEqualsTheUninterruptedOne) {
  ResponseEventLog log;
  ResponseBuilder b(Queued(), LogSink(&log), /*logprobs=*/true);
  constexpr int kTokens = 300;
  std::thread writer([&] {
    b.Start();
    for (int i = 0; i < kTokens; ++i) {
      if (i < 40) {
        std::string r = "r";  // appended, not "r" + ...: GCC 12's -Wrestrict false positive
        r += std::to_string(i);
        b.Delta("reasoning", r);
      } else {
        std::string t = "t";
        t += std::to_string(i);
        t += ' ';
        b.Delta("content", t);
        b.Delta("logprob", Json{{"token", t},
                                {"logprob", -0.5},
                                {"bytes", Json::array()},
                                {"top_logprobs", Json::array()}});
      }
    }
    b.Finish({"stop", 5, kTokens, 40, 0});
    log.Close();
  });
  // Uninterrupted.
  std::vector<std::string> whole;
  std::thread full([&] {
    int64_t cursor = -1;
    whole = ReadAll(log, &cursor);
  });
  // Cut after some events (whatever has arrived by then), resumed from the last sequence
  // number the client saw, as GET ?starting_after=N does.
  std::vector<std::string> cut;
  std::thread resumed([&] {
    int64_t cursor = -1;
    cut = ReadAll(log, &cursor, 25);
    int64_t seen = Data(cut.back())["sequence_number"].get<int64_t>();
    EXPECT_EQ(seen, cursor);
    std::vector<std::string> rest = ReadAll(log, &seen);
    cut.insert(cut.end(), rest.begin(), rest.end());
  });
  // Snapshots while it runs: each holds at least the text of the deltas read before it.
  std::thread watcher([&] {
    int64_t cursor = -1;
    std::string text;
    std::vector<std::string> frames;
    while (log.Next(&cursor, &frames) == ResponseEventLog::Read::kEvents) {
      for (const std::string& f : frames) {
        const Json e = Data(f);
        if (e["type"] == "response.output_text.delta") text += e["delta"].get<std::string>();
      }
      frames.clear();
      const Json now = b.Snapshot();
      std::string snapshot_text;
      for (const Json& item : now["output"]) {
        if (item["type"] == "message") snapshot_text = item["content"][0]["text"];
      }
      EXPECT_EQ(snapshot_text.compare(0, text.size(), text), 0) << text << " / " << snapshot_text;
    }
  });
  for (std::thread* t : {&writer, &full, &resumed, &watcher}) t->join();
  ASSERT_GT(whole.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(cut, whole);  // event by event, sequence numbers included
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(Data(whole[i])["sequence_number"], static_cast<int64_t>(i));
  }
  EXPECT_EQ(Data(whole.back())["type"], "response.completed");
  EXPECT_EQ(Data(whole.back())["response"], b.Snapshot());
}

TEST(ResponseStore, ARunningResponseShowsItsBuilderAndKeepsItsEvents) {
  ResponseStore store(10, 2000);
  auto log = std::make_shared<ResponseEventLog>();
  auto b = std::make_shared<ResponseBuilder>(Queued(), LogSink(log.get()));
  const std::string id = b->Snapshot()["id"];
  store.Put(id, b->Snapshot(), nullptr);
  store.SetEvents(id, log);
  EXPECT_EQ((*store.Response(id))["status"], "queued");
  ASSERT_TRUE(b->Start());
  store.SetLive(id, b);
  ASSERT_TRUE(b->Delta("content", "so far"));
  Json partial = *store.Response(id);
  EXPECT_EQ(partial["status"], "in_progress");
  EXPECT_EQ(partial["output"][0]["content"][0]["text"], "so far");
  EXPECT_EQ(store.Events(id), log);
  // The final Put ends the live view and keeps the log, whose bytes now count.
  ASSERT_TRUE(b->Finish({"stop", 1, 2, 0, 0}));
  Json done = b->Snapshot();
  ASSERT_TRUE(b->Delta("content", "not stored"));  // the builder is no longer looked at
  store.Put(id, done, Json::array());
  EXPECT_EQ(*store.Response(id), done);
  EXPECT_EQ(store.Events(id), log);
  ASSERT_GT(log->bytes(), 2000u);
  store.Put("other", Json{{"id", "other"}}, Json::array());  // over 2000 bytes: id goes
  EXPECT_FALSE(store.Response(id).has_value());
  EXPECT_EQ(store.Events(id), nullptr);
  // Unknown ids: nothing to attach to.
  store.SetLive("nope", b);
  store.SetEvents("nope", log);
  EXPECT_FALSE(store.Response("nope").has_value());
  EXPECT_EQ(store.Events("nope"), nullptr);
  EXPECT_EQ(store.Events("other"), nullptr);  // not a streamed background response
}

TEST(ResponsesRequest, AFollowUpListsThePreviousItemsAndOutputThenItsOwn) {
  ResponseStore store;
  ApiError error;
  std::optional<ResponsesRequest> first =
      ParseResponsesRequest(J(R"({"input": "a"})"), &store, &error);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->input_items.size(), 1u);
  Json response = NewResponseObject(*first, "m", 1);
  response["status"] = "completed";
  response["output"] = J(R"([{"id": "msg_out1", "type": "message", "role": "assistant",
      "status": "completed", "content": [{"type": "output_text", "text": "b",
      "annotations": [], "logprobs": []}]}])");
  Json conversation = first->conversation;
  conversation.push_back(J(R"({"role": "assistant", "content": "b"})"));
  store.Put("resp_1", response, conversation, first->input_items);

  std::optional<ResponsesRequest> second = ParseResponsesRequest(
      J(R"({"previous_response_id": "resp_1", "input": [{"role": "user", "content": "c",
            "id": "msg_c"}]})"),
      &store, &error);
  ASSERT_TRUE(second.has_value()) << error.message;
  const Json& items = second->input_items;
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0], first->input_items[0]);
  EXPECT_EQ(items[1], response["output"][0]);
  EXPECT_EQ(items[2]["id"], "msg_c");
  // Down the chain: a third turn lists all five, newest first by default.
  response["id"] = "resp_2";
  store.Put("resp_2", response, conversation, items);
  std::optional<ResponsesRequest> third = ParseResponsesRequest(
      J(R"({"previous_response_id": "resp_2", "input": "d"})"), &store, &error);
  ASSERT_TRUE(third.has_value());
  ASSERT_EQ(third->input_items.size(), 5u);
  std::optional<Json> page = ListInputItems(third->input_items, "", "", "", &error);
  ASSERT_TRUE(page.has_value());
  EXPECT_EQ((*page)["data"][0]["content"][0]["text"], "d");
  EXPECT_EQ((*page)["last_id"], first->input_items[0]["id"]);
}

TEST(ParseStartingAfter, TakesSequenceNumbersOnly) {
  EXPECT_EQ(ParseStartingAfter("0").value_or(-1), 0);
  EXPECT_EQ(ParseStartingAfter("17").value_or(-1), 17);
  for (const char* bad : {"", "-1", "1.5", "x", "1e3", " 1", "9999999999999999999"}) {
    EXPECT_FALSE(ParseStartingAfter(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace coli::cli::serve
