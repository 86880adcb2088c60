// Finding a handler's own socket and peeking at it (see serve_connection.h).
#include "tools/coli/serve_connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace coli::cli::serve {
namespace {

// Port and numeric address of a socket address (IPv4, IPv6; v4-mapped IPv6 as IPv4).
bool Endpoint(const sockaddr_storage& sa, int* port, std::string* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    *port = ntohs(in->sin_port);
    if (!inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf))) return false;
  } else if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    *port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      if (!inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], buf, sizeof(buf))) return false;
    } else if (!inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf))) {
      return false;
    }
  } else {
    return false;
  }
  *addr = buf;
  return true;
}

}  // namespace

ConnectionWatch::ConnectionWatch(int local_port, const std::string& remote_addr,
                                 int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  std::vector<int> port_matches;
  int exact = -1, exact_count = 0;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
    // Not a socket, not connected, or not TCP/IP: getsockname/getpeername fail or the family
    // is another.
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
      continue;
    }
    int lport = 0, pport = 0;
    std::string laddr, paddr;
    if (!Endpoint(local, &lport, &laddr) || !Endpoint(peer, &pport, &paddr)) continue;
    if (lport != local_port || pport != remote_port) continue;
    port_matches.push_back(static_cast<int>(fd));
    if (paddr == remote_addr) {
      exact = static_cast<int>(fd);
      ++exact_count;
    }
  }
  closedir(dir);
  if (exact_count == 1) {
    fd_ = exact;
  } else if (exact_count == 0 && port_matches.size() == 1) {
    fd_ = port_matches.front();  // the address spelled differently (a scope id, say)
  }
}

bool ConnectionWatch::PeerClosed() const {
  if (fd_ < 0) return false;
  char byte;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // the client sent more (a pipelined request): still there
  if (n == 0) return true;  // orderly shutdown
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // reset or error
}

ConnectionMonitor::ConnectionMonitor(std::chrono::milliseconds period)
    : period_(period), thread_([this] { Run(); }) {}

ConnectionMonitor::~ConnectionMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

ConnectionMonitor::Guard& ConnectionMonitor::Guard::operator=(Guard&& other) noexcept {
  if (this != &other) {
    if (monitor_ != nullptr) monitor_->Unwatch(id_);
    monitor_ = other.monitor_;
    id_ = other.id_;
    other.monitor_ = nullptr;
  }
  return *this;
}

ConnectionMonitor::Guard::~Guard() {
  if (monitor_ != nullptr) monitor_->Unwatch(id_);
}

ConnectionMonitor::Guard ConnectionMonitor::Watch(const ConnectionWatch& watch,
                                                  std::function<void()> cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_all_) {
    cancel();
    return Guard();
  }
  if (watch.fd() < 0) return Guard();
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{watch, std::move(cancel)});
  return Guard(this, id);
}

size_t ConnectionMonitor::watched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void ConnectionMonitor::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);  // as in Run: a guard going away waits for its cancel
  cancelled_all_ = true;
  for (auto& [id, entry] : entries_) entry.cancel();
  entries_.clear();
}

void ConnectionMonitor::Unwatch(uint64_t id) {
  // Under the lock: a cancel function runs under it too, so none runs after this returns.
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(id);
}

void ConnectionMonitor::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, period_, [this] { return stop_; });
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.watch.PeerClosed()) {
        it->second.cancel();  // quick (a gRPC TryCancel): the lock keeps the guard waiting
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace coli::cli::serve
