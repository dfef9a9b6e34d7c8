// TCPStore specifics: the server on port 0 with many clients, pushed waits, connect deadlines,
// bad clients (each followed by a check that good clients still work), the token, limits, and
// clients that meet hung, silent, foreign or vanished servers. The shared behaviour is in
// store_test.cc.
#include <atomic>
#include <cstdlib>
#include <thread>

#include <cohort/core/util/error.h>
#include <cohort/distributed/store/detail/tcp_protocol.h>

#include "distributed/store/store_test_util.h"

namespace cohort::dist::testing {
namespace {

constexpr Millis kLong{20000};

std::shared_ptr<TCPStore> client(const TCPStoreServer& server, Millis timeout = kLong,
                                 std::optional<std::string> token = std::nullopt) {
  TCPStoreOptions o;
  o.port = server.port();
  o.timeout = timeout;
  o.token = std::move(token);
  return std::make_shared<TCPStore>(o);
}

// A good client can still do everything after whatever a bad one did.
void expectServes(const TCPStoreServer& server, const std::string& tag) {
  auto c = client(server);
  c->set("alive/" + tag, tag);
  EXPECT_EQ(c->getString("alive/" + tag), tag);
  EXPECT_GE(c->add("alive/count", 1), 1);
}

Bytes helloFrame(uint32_t magic = tcp::kMagic, uint16_t version = tcp::kVersion, const std::string& token = "") {
  tcp::FrameWriter f;
  f.u8(static_cast<uint8_t>(tcp::Op::Hello)).u32(0).u32(magic).u16(version).str(token);
  return f.finish();
}

// Reads one reply frame's body from a raw socket (blocking, with a poll deadline).
Bytes readFrame(RawSocket& s, Millis limit = Millis{5000}) {
  Bytes got;
  auto deadline = std::chrono::steady_clock::now() + limit;
  auto need = [&](size_t n) {
    while (got.size() < n) {
      pollfd p{s.fd(), POLLIN, 0};
      auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) throw std::runtime_error("no reply");
      uint8_t buf[4096];
      ssize_t r = recv(s.fd(), buf, std::min(sizeof buf, n - got.size()), 0);
      if (r <= 0) throw std::runtime_error("closed");
      got.insert(got.end(), buf, buf + r);
    }
  };
  need(4);
  uint32_t len = tcp::readLength(got.data());
  need(4 + len);
  return Bytes(got.begin() + 4, got.end());
}

// A raw socket that has completed a good hello.
std::unique_ptr<RawSocket> helloedSocket(const TCPStoreServer& server) {
  auto s = std::make_unique<RawSocket>(server.port());
  s->send(helloFrame());
  Bytes reply = readFrame(*s);
  EXPECT_EQ(reply.at(0), static_cast<uint8_t>(tcp::Status::Ok));
  return s;
}

TEST(TCPStore, ServerOnPortZeroServesManyClients) {
  TCPStoreServer server;
  ASSERT_NE(server.port(), 0);
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));
  constexpr int kClients = 8;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = client(server);
      c->add("count", 1);  // before announcing itself, so whoever sees every key sees every add
      c->set("client" + std::to_string(i), std::to_string(i));
      // Everyone meets: each waits for all the others' keys.
      std::vector<std::string> all;
      for (int j = 0; j < kClients; ++j) all.push_back("client" + std::to_string(j));
      c->wait(all, kLong);
      EXPECT_EQ(c->getString("count"), std::to_string(kClients));
    });
  for (auto& t : threads) t.join();
  auto c = client(server);
  EXPECT_EQ(c->numKeys(), kClients + 1);
  EXPECT_EQ(server.numDropped(), 0u);
}

TEST(TCPStore, WaitsAndGetsArePushedWhenTheKeyArrives) {
  TCPStoreServer server;
  auto waiter = client(server);
  auto writer = client(server);
  std::atomic<bool> waitDone{false}, getDone{false};
  std::thread w([&] {
    waiter->wait({"k1", "k2"}, kLong);
    waitDone = true;
  });
  std::thread g([&] {
    EXPECT_EQ(waiter->getString("k2"), "two");  // the same client, a second thread
    getDone = true;
  });
  std::this_thread::sleep_for(50ms);
  writer->set("k1", "one");
  writer->set("k2", "two");
  w.join();
  g.join();
  EXPECT_TRUE(waitDone && getDone);
}

TEST(TCPStore, ConnectTimeoutNamesHostPortAndDuration) {
  uint16_t port = unusedPort();
  TCPStoreOptions o;
  o.port = port;
  o.connectTimeout = Millis{300};
  try {
    TCPStore c(o);
    FAIL() << "connected to a port nobody listens on";
  } catch (const StoreError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
    EXPECT_NE(msg.find("within 300 ms"), std::string::npos) << msg;
    EXPECT_NE(msg.find("attempts"), std::string::npos) << msg;
  }
}

TEST(TCPStore, ClientRetriesUntilTheServerComesUp) {
  uint16_t port = unusedPort();
  std::unique_ptr<TCPStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(150ms);
    TCPStoreServerOptions so;
    so.port = port;
    server = std::make_unique<TCPStoreServer>(so);
  });
  TCPStoreOptions o;
  o.port = port;
  o.connectTimeout = Millis{15000};
  TCPStore c(o);
  starter.join();
  c.set("k", "v");
  EXPECT_EQ(c.getString("k"), "v");
}

TEST(TCPStore, IsServerHostsItsOwnServer) {
  TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  TCPStore host(o);
  ASSERT_NE(host.server(), nullptr);
  ASSERT_NE(host.port(), 0);
  EXPECT_EQ(host.port(), host.server()->port());
  TCPStore other("127.0.0.1", host.port(), kLong);
  other.set("k", "v");
  EXPECT_EQ(host.getString("k"), "v");
}

TEST(TCPStore, BindingATakenPortFailsNamingIt) {
  TCPStoreServer first;
  TCPStoreServerOptions so;
  so.port = first.port();
  try {
    TCPStoreServer second(so);
    FAIL() << "two servers on one port";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
}

// ---- bad clients ------------------------------------------------------------------------------

TEST(TCPStoreBadClients, GarbageBytesAreDropped) {
  TCPStoreServer server;
  auto before = client(server);  // connected before the garbage, must keep working
  {
    RawSocket raw(server.port());
    raw.send(std::string("GET / HTTP/1.1\r\nHost: store\r\n\r\n"));  // "GET " is a 542 MB length
    EXPECT_TRUE(raw.readUntilClosed());
  }
  {
    RawSocket raw(server.port());
    raw.send(Bytes{5, 0, 0, 0, 9, 9, 9, 9, 9});  // a well-formed frame that is not a hello
    EXPECT_TRUE(raw.readUntilClosed());
  }
  EXPECT_TRUE(eventually([&] { return server.numDropped() == 2; }));
  before->set("k", "v");
  EXPECT_EQ(before->getString("k"), "v");
  expectServes(server, "garbage");
}

TEST(TCPStoreBadClients, WrongMagicIsDroppedWithoutAReply) {
  TCPStoreServer server;
  RawSocket raw(server.port());
  raw.send(helloFrame(0xdeadbeef));
  Bytes got;
  EXPECT_TRUE(raw.readUntilClosed(&got));
  EXPECT_TRUE(got.empty());
  expectServes(server, "magic");
}

TEST(TCPStoreBadClients, WrongVersionIsRefusedWithTheReason) {
  TCPStoreServer server;
  RawSocket raw(server.port());
  raw.send(helloFrame(tcp::kMagic, 99));
  Bytes reply = readFrame(raw);
  tcp::FrameReader r(reply.data(), reply.size());
  EXPECT_EQ(r.u8(), static_cast<uint8_t>(tcp::Status::Refused));
  r.u32();
  std::string reason = r.str(4096, "reason");
  EXPECT_NE(reason.find("version 99"), std::string::npos) << reason;
  EXPECT_TRUE(raw.readUntilClosed());
  expectServes(server, "version");
}

TEST(TCPStoreBadClients, OversizedFramesAreDropped) {
  TCPStoreServerOptions so;
  so.maxKeySize = 64;
  so.maxValueSize = 1024;
  TCPStoreServer server(so);
  {
    RawSocket raw(server.port());  // before the hello
    raw.send(Bytes{0xff, 0xff, 0xff, 0x7f});
    EXPECT_TRUE(raw.readUntilClosed());
  }
  {
    auto raw = helloedSocket(server);          // after a good hello
    raw->send(Bytes{0x00, 0x00, 0x10, 0x00});  // 1 MiB, over 64 + 64 + 2 × 1024
    EXPECT_TRUE(raw->readUntilClosed());
  }
  {
    // A frame within the limit carrying a value over it.
    auto raw = helloedSocket(server);
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Op::Set)).u32(1).str("k").bytes(Bytes(1500, 7));
    raw->send(f.finish());
    EXPECT_TRUE(raw->readUntilClosed());
  }
  {
    // Fields that claim more bytes than the frame holds.
    auto raw = helloedSocket(server);
    raw->send(Bytes{9, 0, 0, 0, static_cast<uint8_t>(tcp::Op::Get), 1, 0, 0, 0, 50, 0, 0, 0});
    EXPECT_TRUE(raw->readUntilClosed());
  }
  EXPECT_TRUE(eventually([&] { return server.numDropped() == 4; }));
  expectServes(server, "oversized");
}

TEST(TCPStoreBadClients, AClientThatVanishesMidFrameIsDropped) {
  TCPStoreServer server;
  auto before = client(server);
  {
    auto raw = helloedSocket(server);
    raw->send(Bytes{100, 0, 0, 0, static_cast<uint8_t>(tcp::Op::Set), 1, 0, 0, 0, 1});  // 6 of 100 bytes
  }                                                                                     // closed here
  {
    auto raw = helloedSocket(server);
    raw->send(Bytes{100, 0});  // half a length
  }
  EXPECT_TRUE(eventually([&] { return server.numDropped() == 2; }));
  EXPECT_TRUE(eventually([&] { return server.numConnections() == 1; }));
  before->set("k", "v");
  EXPECT_EQ(before->getString("k"), "v");
  expectServes(server, "vanish");
}

TEST(TCPStoreBadClients, AClientThatVanishesWhileWaitingIsForgotten) {
  TCPStoreServer server;
  {
    auto raw = helloedSocket(server);
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Op::Wait)).u32(7).keys({"later"});
    raw->send(f.finish());
    tcp::FrameWriter g;
    g.u8(static_cast<uint8_t>(tcp::Op::Get)).u32(8).str("later");
    raw->send(g.finish());
  }
  EXPECT_TRUE(eventually([&] { return server.numConnections() == 0; }));
  // The key arrives after its waiter left: the server must not write to the dead connection.
  auto c = client(server);
  c->set("later", "now");
  c->wait({"later"}, kLong);
  expectServes(server, "waiter");
}

TEST(TCPStoreBadClients, AClientThatNeverReadsItsRepliesIsDropped) {
  TCPStoreServerOptions so;
  so.maxValueSize = 64 << 10;  // the reply queue limit is then 128 KiB + 16 MiB
  TCPStoreServer server(so);
  auto c = client(server);
  const std::string big(60000, 'v');
  c->set("big", big);
  auto raw = helloedSocket(server);
  // 2000 gets of a 60 kB value: 120 MB of replies that are never read. Loopback socket buffers
  // may grow to tens of MB (tcp_rmem), so the volume is well past what the kernel absorbs.
  Bytes requests;
  for (uint32_t i = 1; i <= 2000; ++i) {
    tcp::FrameWriter f;
    Bytes frame = f.u8(static_cast<uint8_t>(tcp::Op::Get)).u32(i).str("big").finish();
    requests.insert(requests.end(), frame.begin(), frame.end());
  }
  raw->send(requests);
  EXPECT_TRUE(eventually([&] { return server.numDropped() == 1; }, Millis{20000}));
  raw->close();
  EXPECT_EQ(c->getString("big"), big);
  expectServes(server, "unread");
}

TEST(TCPStoreBadClients, ASilentConnectionIsDroppedAfterTheHelloTimeout) {
  TCPStoreServerOptions so;
  so.helloTimeout = Millis{200};
  TCPStoreServer server(so);
  RawSocket raw(server.port());
  EXPECT_TRUE(raw.readUntilClosed());
  EXPECT_TRUE(eventually([&] { return server.numDropped() == 1; }));
  expectServes(server, "silent");
}

// ---- token and limits -------------------------------------------------------------------------

TEST(TCPStoreToken, TheRightTokenIsAcceptedOthersAreRefused) {
  TCPStoreServerOptions so;
  so.token = "s3cret";
  TCPStoreServer server(so);
  auto good = client(server, kLong, "s3cret");
  good->set("k", "v");
  try {
    client(server, kLong, "");
    FAIL() << "a client without the token was let in";
  } catch (const StoreError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("refused"), std::string::npos) << msg;
    EXPECT_NE(msg.find("requires a token"), std::string::npos) << msg;
    EXPECT_NE(msg.find("presented none"), std::string::npos) << msg;
  }
  try {
    client(server, kLong, "s3cres");
    FAIL() << "a client with the wrong token was let in";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("does not match"), std::string::npos) << e.what();
  }
  EXPECT_EQ(good->getString("k"), "v");
  EXPECT_EQ(server.numDropped(), 2u);
}

TEST(TCPStoreToken, TheEnvironmentSuppliesTheTokenByDefault) {
  setenv("COHORT_STORE_TOKEN", "from-env", 1);
  TCPStoreServer server;  // the server reads it too
  auto c = client(server);
  c->set("k", "v");
  EXPECT_THROW(client(server, kLong, "other"), StoreError);
  unsetenv("COHORT_STORE_TOKEN");
  EXPECT_THROW(client(server), StoreError);
  EXPECT_EQ(c->getString("k"), "v");
}

TEST(TCPStoreLimits, TheClientRejectsOversizedKeysAndValuesItself) {
  TCPStoreServerOptions so;
  so.maxKeySize = 8;
  so.maxValueSize = 16;
  TCPStoreServer server(so);
  auto c = client(server);
  try {
    c->set("123456789", "v");
    FAIL() << "an oversized key was sent";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 8 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->set("k", std::string(17, 'x')), ValueError);
  EXPECT_THROW(c->wait({"123456789"}, Millis{100}), ValueError);
  c->set("k", std::string(16, 'x'));  // the connection is untouched
  EXPECT_EQ(c->getString("k"), std::string(16, 'x'));
  EXPECT_EQ(server.numDropped(), 0u);
}

// ---- servers that misbehave -------------------------------------------------------------------

// A listener on loopback whose accepted connection is handed to `serve` on a thread, with a
// flag that turns true when the fake server is being destroyed.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd, const std::atomic<bool>& stop)> serve) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 4);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, serve = std::move(serve)] {
      int c = accept(fd_, nullptr, nullptr);
      if (c >= 0) {
        serve(c, stop_);
        ::close(c);
      }
    });
  }
  ~FakeServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  int fd_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Drains a connection until the peer closes or the fake server stops.
void drain(int fd, const std::atomic<bool>& stop) {
  uint8_t buf[4096];
  while (!stop) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) > 0 && recv(fd, buf, sizeof buf, 0) <= 0) return;
  }
}

TEST(TCPStoreServers, AHungServerCostsATimeoutNotAHang) {
  FakeServer fake([](int fd, const std::atomic<bool>& stop) {
    uint8_t buf[4096];
    recv(fd, buf, sizeof buf, 0);  // the hello
    tcp::FrameWriter f;
    f.u8(0).u32(0).u16(tcp::kVersion).u32(1024).u32(1024);
    Bytes ok = f.finish();
    ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    drain(fd, stop);  // then never answers
  });
  TCPStore c("127.0.0.1", fake.port(), Millis{200});
  try {
    c.set("k", "v");
    FAIL() << "set returned without a reply";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("no reply within 200 ms"), std::string::npos) << e.what();
  }
  try {
    c.wait({"k"}, Millis{200});
    FAIL() << "wait returned without a reply";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("\"k\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.get("k"), TimeoutError);
}

TEST(TCPStoreServers, ASilentServerFailsTheConnectWithinItsDeadline) {
  FakeServer fake([](int fd, const std::atomic<bool>& stop) { drain(fd, stop); });
  TCPStoreOptions o;
  o.port = fake.port();
  o.connectTimeout = Millis{300};
  try {
    TCPStore c(o);
    FAIL() << "connected to a server that never answers the hello";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer the hello"), std::string::npos) << e.what();
  }
}

TEST(TCPStoreServers, AForeignServerIsRecognised) {
  FakeServer fake([](int fd, const std::atomic<bool>&) {
    uint8_t buf[4096];
    recv(fd, buf, sizeof buf, 0);
    std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
  });
  TCPStoreOptions o;
  o.port = fake.port();
  o.connectTimeout = Millis{2000};
  try {
    TCPStore c(o);
    FAIL() << "took an HTTP server for a store";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("not a cohort TCPStore server"), std::string::npos) << e.what();
  }
}

TEST(TCPStoreServers, AStoppedServerFailsPendingAndLaterCalls) {
  auto server = std::make_unique<TCPStoreServer>();
  auto c = client(*server);
  c->set("k", "v");
  std::atomic<bool> threwStoreError{false};
  std::thread waiter([&] {
    try {
      c->wait({"never"}, kLong);
    } catch (const TimeoutError&) {
    } catch (const StoreError&) {
      threwStoreError = true;
    }
  });
  std::this_thread::sleep_for(50ms);
  server->stop();
  waiter.join();
  EXPECT_TRUE(threwStoreError);
  try {
    c->set("k", "v2");
    FAIL() << "set on a broken connection returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:"), std::string::npos) << e.what();
  }
}

TEST(TCPStoreServers, TheParentsClientRefusesUseInAForkedChild) {
  TCPStoreServer server;
  auto c = client(server);
  auto codes = runChildren(1, [&](int) {
    try {
      c->set("k", "v");
    } catch (const StoreError& e) {
      if (std::string(e.what()).find("forked child") != std::string::npos) _exit(42);
    }
  });
  EXPECT_EQ(codes[0], 42);
  EXPECT_FALSE(c->check({"k"}));
}

}  // namespace
}  // namespace cohort::dist::testing
