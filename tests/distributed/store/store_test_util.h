// Helpers for the store tests: one "kind" per Store implementation (so the behavioural suite is
// written once), forked child processes with a deadline, and raw sockets for bad-client cases.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cohort/distributed/store/file_store.h>
#include <cohort/distributed/store/hash_store.h>
#include <cohort/distributed/store/prefix_store.h>
#include <cohort/distributed/store/tcp_store.h>

#include "harness/ranks.h"
#include "temp_dir.h"

namespace cohort::dist::testing {

using namespace std::chrono_literals;

// ThreadSanitizer cannot follow a child that starts threads after a multi-threaded parent forked
// it (it dies with "starting new threads after multi-threaded fork is not supported").
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

inline Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
inline std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

using ::cohort::testing::TempDir;  // temp_dir.h

// Each kind makes handles onto one shared store. open() may be called in a forked child when
// kMultiProcess is true.
struct HashKind {
  static constexpr bool kMultiProcess = false;
  static constexpr bool kChildStartsThreads = false;
  std::shared_ptr<HashStore> base = std::make_shared<HashStore>();
  StorePtr open(Millis timeout) {
    base->setTimeout(timeout);  // one object: every handle is the same store
    return base;
  }
};

struct FileKind {
  static constexpr bool kMultiProcess = true;
  static constexpr bool kChildStartsThreads = false;
  TempDir dir;
  std::string path = dir.file("store");
  StorePtr open(Millis timeout) { return std::make_shared<FileStore>(path, timeout); }
};

struct TCPKind {
  static constexpr bool kMultiProcess = true;
  static constexpr bool kChildStartsThreads = true;  // the client's I/O thread
  std::unique_ptr<TCPStoreServer> server = std::make_unique<TCPStoreServer>();
  StorePtr open(Millis timeout) { return std::make_shared<TCPStore>("127.0.0.1", server->port(), timeout); }
};

struct PrefixKind {
  static constexpr bool kMultiProcess = false;
  static constexpr bool kChildStartsThreads = false;
  std::shared_ptr<HashStore> base = std::make_shared<HashStore>();
  StorePtr open(Millis timeout) {
    auto s = std::make_shared<PrefixStore>("group0", base);
    s->setTimeout(timeout);
    return s;
  }
};

// Runs fn(i) in n forked children (the process harness, tests/harness/ranks.h: they start
// together once every fork is done, and the ones still running after `limit` are killed, so a
// hang fails the test instead of stalling it). A child exits 0 when fn returns, 1 when it throws
// (the message goes to stderr). Returns each child's exit code (-signal when killed).
inline std::vector<int> runChildren(int n, const std::function<void(int)>& fn, Millis limit = 20s) {
  ::cohort::testing::RankOptions o;
  o.limit = limit;
  o.tag = "child";
  auto results = ::cohort::testing::runRanks(
      n,
      [&](int i, std::ostream&) {
        fn(i);
        return 0;
      },
      o);
  std::vector<int> codes;
  for (const auto& r : results) codes.push_back(r.code());
  return codes;
}

// A plain TCP connection to 127.0.0.1:port, for speaking (or mangling) the protocol by hand.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw std::runtime_error("connect failed");
  }
  ~RawSocket() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void send(const Bytes& b) { sendRaw(b.data(), b.size()); }
  void send(const std::string& s) { sendRaw(s.data(), s.size()); }
  void sendRaw(const void* p, size_t n) {
    // The peer may already have dropped us: a failed send is part of what the tests provoke.
    ::send(fd_, p, n, MSG_NOSIGNAL);
  }
  // Reads until the peer closes or `limit` passes; true when the peer closed.
  bool readUntilClosed(Bytes* got = nullptr, Millis limit = 5s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {
      auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      uint8_t buf[4096];
      ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;  // EOF or reset
      if (got) got->insert(got->end(), buf, buf + n);
    }
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// A port nobody listens on (bound, then released).
inline uint16_t unusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Polls cond() every few ms until it holds or `limit` passes (for counters the server updates
// on its own thread); returns whether it held.
inline bool eventually(const std::function<bool()>& cond, Millis limit = 5s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

}  // namespace cohort::dist::testing
