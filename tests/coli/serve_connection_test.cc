// ConnectionWatch (tools/coli/serve_connection.h): a `coli serve` handler finds its own accepted
// TCP socket by the endpoints httplib reports, and sees the peer close it — without reading.
#include "tools/coli/serve_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace coli::cli::serve {
namespace {

int Port(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return rc == 0 ? ntohs(a.sin_port) : -1;
}

// A loopback listener, a client connected to it and the server side of that connection.
struct Pair {
  int listener = -1, client = -1, server = -1;
  Pair() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listener, 4) != 0) {
      return;
    }
    a.sin_port = htons(static_cast<uint16_t>(Port(listener, false)));
    client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return;
    server = accept(listener, nullptr, nullptr);
  }
  ~Pair() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) close(fd);
    }
  }
  // The client hangs up (`hard`: with a reset instead of a FIN).
  void HangUp(bool hard = false) {
    if (hard) {
      linger rst{1, 0};
      setsockopt(client, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
    }
    close(client);
    client = -1;
  }
  // The watch a handler of `server` makes from httplib's local_port / remote_addr / remote_port.
  ConnectionWatch Watch() const {
    return ConnectionWatch(Port(server, false), "127.0.0.1", Port(server, true));
  }
};

TEST(ConnectionWatch, FindsTheServerSideSocket) {
  Pair p;
  ASSERT_GE(p.server, 0);
  EXPECT_EQ(p.Watch().fd(), p.server);
  EXPECT_FALSE(p.Watch().PeerClosed());
}

TEST(ConnectionWatch, SeesAnOrderlyClose) {
  Pair p;
  ASSERT_GE(p.server, 0);
  const ConnectionWatch watch = p.Watch();
  ASSERT_FALSE(watch.PeerClosed());
  p.HangUp();
  // The FIN is on the loopback by the time close returns; the peek sees EOF.
  EXPECT_TRUE(watch.PeerClosed());
}

TEST(ConnectionWatch, PendingBytesAreNotAClose) {
  Pair p;
  ASSERT_GE(p.server, 0);
  const ConnectionWatch watch = p.Watch();
  ASSERT_EQ(write(p.client, "GET / HTTP/1.1\r\n", 16), 16);
  EXPECT_FALSE(watch.PeerClosed());
  // Peeking consumed nothing: the bytes are all still there to read.
  char buf[32];
  EXPECT_EQ(read(p.server, buf, sizeof(buf)), 16);
  EXPECT_FALSE(watch.PeerClosed());
}

TEST(ConnectionWatch, SeesAReset) {
  Pair p;
  ASSERT_GE(p.server, 0);
  const ConnectionWatch watch = p.Watch();
  p.HangUp(/*hard=*/true);
  EXPECT_TRUE(watch.PeerClosed());
}

TEST(ConnectionWatch, UnknownEndpointsGiveAnInertWatch) {
  Pair p;
  ASSERT_GE(p.server, 0);
  // No socket of this process has these endpoints: never "closed", whatever happens.
  const ConnectionWatch none(Port(p.server, false), "127.0.0.1", 1);
  EXPECT_EQ(none.fd(), -1);
  EXPECT_FALSE(none.PeerClosed());
  const ConnectionWatch bad(0, "", 0);
  EXPECT_EQ(bad.fd(), -1);
  EXPECT_FALSE(bad.PeerClosed());
}

TEST(ConnectionWatch, AnAddressSpelledDifferentlyStillFindsTheOnlyPortMatch) {
  Pair p;
  ASSERT_GE(p.server, 0);
  const ConnectionWatch watch(Port(p.server, false), "localhost", Port(p.server, true));
  EXPECT_EQ(watch.fd(), p.server);
}

// Polls `cond` for up to 10 s.
template <typename Cond>
bool Eventually(Cond cond) {
  for (int i = 0; i < 1000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

TEST(ConnectionMonitor, CancelsOnceWhenThePeerGoes) {
  Pair p;
  ASSERT_GE(p.server, 0);
  ConnectionMonitor monitor(std::chrono::milliseconds(5));
  std::atomic<int> cancels{0};
  ConnectionMonitor::Guard guard = monitor.Watch(p.Watch(), [&cancels] { ++cancels; });
  EXPECT_EQ(monitor.watched(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(cancels.load(), 0);  // the client is still there
  p.HangUp();
  EXPECT_TRUE(Eventually([&] { return cancels.load() == 1; }));
  EXPECT_EQ(monitor.watched(), 0u);  // dropped after its cancel
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(cancels.load(), 1);
}

TEST(ConnectionMonitor, AGuardGoneEndsTheWatch) {
  Pair p;
  ASSERT_GE(p.server, 0);
  ConnectionMonitor monitor(std::chrono::milliseconds(5));
  std::atomic<int> cancels{0};
  {
    ConnectionMonitor::Guard guard = monitor.Watch(p.Watch(), [&cancels] { ++cancels; });
    ConnectionMonitor::Guard moved = std::move(guard);  // the watch moves with it
    EXPECT_EQ(monitor.watched(), 1u);
  }
  EXPECT_EQ(monitor.watched(), 0u);
  p.HangUp();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cancels.load(), 0);
}

TEST(ConnectionMonitor, AnInertWatchIsNotRegistered) {
  ConnectionMonitor monitor(std::chrono::milliseconds(5));
  ConnectionMonitor::Guard guard = monitor.Watch(ConnectionWatch(0, "", 0), [] {});
  EXPECT_EQ(monitor.watched(), 0u);
}

TEST(ConnectionMonitor, CancelAllCancelsEveryWatchNowAndEachLaterOneAtOnce) {
  // The server's stop: calls waiting on the host end now, not when their clients go.
  Pair p;
  ASSERT_GE(p.server, 0);
  ConnectionMonitor monitor(std::chrono::milliseconds(5));
  std::atomic<int> first{0}, later{0}, inert{0};
  ConnectionMonitor::Guard guard = monitor.Watch(p.Watch(), [&first] { ++first; });
  monitor.CancelAll();
  EXPECT_EQ(first.load(), 1);  // its client is still there
  EXPECT_EQ(monitor.watched(), 0u);
  ConnectionMonitor::Guard after = monitor.Watch(p.Watch(), [&later] { ++later; });
  ConnectionMonitor::Guard no_socket =
      monitor.Watch(ConnectionWatch(0, "", 0), [&inert] { ++inert; });
  EXPECT_EQ(later.load(), 1);
  EXPECT_EQ(inert.load(), 1);
  EXPECT_EQ(monitor.watched(), 0u);
  p.HangUp();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(first.load() + later.load(), 2);  // never twice
}

}  // namespace
}  // namespace coli::cli::serve
