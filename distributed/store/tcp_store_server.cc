// TCPStoreServer: one Boost.Asio event loop on one thread owns the keys, the waiters and every
// connection, so nothing here takes a lock. See tcp_store.h for the protocol.
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility> (C++20 mode).
#include <utility>

#include <boost/asio.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include <cohort/core/util/env.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/store/detail/store_util.h>
#include <cohort/distributed/store/detail/tcp_protocol.h>
#include <cohort/distributed/store/tcp_store.h>

namespace cohort::dist {

COHORT_ENV_KNOB(kStoreToken, "COHORT_STORE_TOKEN", "",
                "Shared secret of the TCPStore: a server with one refuses clients that do not present it");

namespace tcp {

std::string defaultToken() { return kStoreToken.str(); }

const char* opName(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::Hello: return "hello";
    case Op::Set: return "set";
    case Op::Get: return "get";
    case Op::Add: return "add";
    case Op::CompareSet: return "compareSet";
    case Op::Check: return "check";
    case Op::Delete: return "delete";
    case Op::NumKeys: return "numKeys";
    case Op::Wait: return "wait";
    case Op::Cancel: return "cancel";
  }
  return "unknown";
}

}  // namespace tcp

namespace asio = boost::asio;
using Tcp = asio::ip::tcp;
using boost::system::error_code;

namespace server {

// Compares in time that depends only on the secret's length, not on where the bytes differ.
bool constantTimeEquals(const std::string& presented, const std::string& secret) {
  volatile uint8_t diff = presented.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    uint8_t c = i < presented.size() ? static_cast<uint8_t>(presented[i]) : 0;
    diff = diff | (c ^ static_cast<uint8_t>(secret[i]));
  }
  return diff == 0;
}

struct Waiter {
  uint32_t id = 0;
  bool isGet = false;
  std::string getKey;
  std::vector<std::string> missingKeys;  // the keys it was registered under
  size_t missing = 0;
  bool done = false;
};

class Session;

}  // namespace server

using server::Session;
using server::Waiter;

class TCPStoreServer::Impl {
 public:
  explicit Impl(TCPStoreServerOptions opts);
  ~Impl();
  void stop();

  // --- used by sessions, on the event-loop thread ---
  void notifyKey(const std::string& key);
  void removeWaiter(const std::shared_ptr<Waiter>& w);
  void sessionClosed(const std::shared_ptr<Session>& s);

  TCPStoreServerOptions opts_;
  std::string token_;
  std::string address_;
  uint16_t port_ = 0;
  pid_t pid_;
  std::atomic<size_t> numConnections_{0};
  std::atomic<size_t> numDropped_{0};
  std::map<std::string, Bytes> data_;
  std::map<std::string, std::vector<std::shared_ptr<Waiter>>> waiters_;
  // Who waits, so a completed waiter's reply goes to the right connection.
  std::map<Waiter*, std::weak_ptr<Session>> waiterSession_;

  asio::io_context io_;
  Tcp::acceptor acceptor_{io_};
  std::set<std::shared_ptr<Session>> sessions_;
  std::thread thread_;
  bool stopped_ = false;

 private:
  void accept();
};

namespace server {

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(TCPStoreServer::Impl& server, Tcp::socket socket)
      : server_(server), socket_(std::move(socket)), helloTimer_(server.io_) {
    error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
  }

  void start() {
    auto self = shared_from_this();
    helloTimer_.expires_after(server_.opts_.helloTimeout);
    helloTimer_.async_wait([self](error_code ec) {
      if (!ec && !self->helloDone_ && !self->closed_)
        self->drop(fmt::format("no hello within {} ms", self->server_.opts_.helloTimeout.count()));
    });
    readHeader();
  }

  // Complete a get/wait this connection asked for.
  void completeWaiter(const Waiter& w) {
    auto it = waits_.find(w.id);
    if (it != waits_.end() && it->second.get() == &w) waits_.erase(it);
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Status::Ok)).u32(w.id);
    if (w.isGet) f.bytes(server_.data_.at(w.getKey));
    send(f.finish());
  }

  // Close without blame (server stopping, peer gone).
  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ec;
    helloTimer_.cancel();
    socket_.shutdown(Tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    for (auto& [id, w] : waits_) server_.removeWaiter(w);
    waits_.clear();
    server_.sessionClosed(shared_from_this());
  }

  const std::string& peer() const { return peer_; }

 private:
  void drop(const std::string& reason) {
    COHORT_LOG(Warning, "TCPStore server {}: dropping client {}: {}", server_.address_, peer_, reason);
    ++server_.numDropped_;
    close();
  }

  // Send a refusal, then close once it is written.
  void refuse(const std::string& reason) {
    COHORT_LOG(Warning, "TCPStore server {}: refusing client {}: {}", server_.address_, peer_, reason);
    ++server_.numDropped_;
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Status::Refused)).u32(0).str(reason);
    closeAfterWrite_ = true;
    send(f.finish());
  }

  void readHeader() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_), [self](error_code ec, size_t n) {
      if (self->closed_) return;
      if (ec) {
        if (n > 0) self->drop(fmt::format("disconnected mid-frame ({} of 4 length bytes): {}", n, ec.message()));
        else if (ec == asio::error::eof || ec == asio::error::connection_reset)
          self->close();  // an orderly goodbye between frames
        else self->drop("read failed: " + ec.message());
        return;
      }
      uint32_t len = tcp::readLength(self->header_);
      size_t limit = self->helloDone_
                         ? tcp::maxRequestFrame(self->server_.opts_.maxKeySize, self->server_.opts_.maxValueSize)
                         : tcp::kMaxHelloFrame;
      if (len == 0 || len > limit) {
        self->drop(fmt::format("a frame of {} bytes is {} (limit {} bytes{})", len, len == 0 ? "empty" : "too long",
                               limit, self->helloDone_ ? "" : " before the hello"));
        return;
      }
      self->body_.resize(len);
      self->readBody();
    });
  }

  void readBody() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(body_), [self](error_code ec, size_t n) {
      if (self->closed_) return;
      if (ec) {
        self->drop(
            fmt::format("disconnected mid-frame ({} of {} body bytes): {}", n, self->body_.size(), ec.message()));
        return;
      }
      uint8_t op = self->body_[0];
      try {
        self->handleFrame();
      } catch (const tcp::ProtocolError& e) {
        self->drop(fmt::format("malformed {} request (opcode {}): {}", tcp::opName(op), op, e.what()));
        return;
      }
      if (!self->closed_ && !self->closeAfterWrite_) self->readHeader();
    });
  }

  void handleFrame() {
    tcp::FrameReader r(body_.data(), body_.size());
    uint8_t op = r.u8();
    uint32_t id = r.u32();
    if (!helloDone_) {
      handleHello(op, r);
      return;
    }
    const size_t maxKey = server_.opts_.maxKeySize, maxValue = server_.opts_.maxValueSize;
    auto& data = server_.data_;
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Status::Ok)).u32(id);
    switch (static_cast<tcp::Op>(op)) {
      case tcp::Op::Set: {
        std::string key = r.str(maxKey, "key");
        Bytes value = r.bytes(maxValue, "value");
        r.expectEnd();
        data[key] = std::move(value);
        send(f.finish());
        server_.notifyKey(key);
        return;
      }
      case tcp::Op::Get: {
        std::string key = r.str(maxKey, "key");
        r.expectEnd();
        auto it = data.find(key);
        if (it != data.end()) {
          send(f.bytes(it->second).finish());
          return;
        }
        auto w = std::make_shared<Waiter>();
        w->id = id;
        w->isGet = true;
        w->getKey = key;
        registerWaiter(w, {key});
        return;
      }
      case tcp::Op::Add: {
        std::string key = r.str(maxKey, "key");
        int64_t delta = r.i64();
        r.expectEnd();
        auto it = data.find(key);
        int64_t current = 0;
        if (it != data.end()) {
          try {
            current = detail::parseStoredInt(it->second, "key \"" + key + "\"");
          } catch (const ValueError& e) {
            tcp::FrameWriter err;
            send(err.u8(static_cast<uint8_t>(tcp::Status::ValueError)).u32(id).str(e.what()).finish());
            return;
          }
        }
        int64_t result = current + delta;
        data[key] = detail::formatStoredInt(result);
        send(f.i64(result).finish());
        server_.notifyKey(key);
        return;
      }
      case tcp::Op::CompareSet: {
        std::string key = r.str(maxKey, "key");
        Bytes expected = r.bytes(maxValue, "expected value");
        Bytes desired = r.bytes(maxValue, "desired value");
        r.expectEnd();
        auto it = data.find(key);
        if (it == data.end()) {
          if (!expected.empty()) {
            send(f.bytes(expected).finish());
            return;
          }
        } else if (it->second != expected) {
          send(f.bytes(it->second).finish());
          return;
        }
        data[key] = desired;
        send(f.bytes(desired).finish());
        server_.notifyKey(key);
        return;
      }
      case tcp::Op::Check: {
        auto keys = r.keys(maxKey);
        r.expectEnd();
        f.u32(static_cast<uint32_t>(keys.size()));
        for (const auto& k : keys) f.u8(data.count(k) > 0 ? 1 : 0);
        send(f.finish());
        return;
      }
      case tcp::Op::Delete: {
        std::string key = r.str(maxKey, "key");
        r.expectEnd();
        send(f.u8(data.erase(key) > 0 ? 1 : 0).finish());
        return;
      }
      case tcp::Op::NumKeys: {
        r.expectEnd();
        send(f.i64(static_cast<int64_t>(data.size())).finish());
        return;
      }
      case tcp::Op::Wait: {
        auto keys = r.keys(maxKey);
        r.expectEnd();
        auto w = std::make_shared<Waiter>();
        w->id = id;
        registerWaiter(w, keys);
        return;
      }
      case tcp::Op::Cancel: {
        r.expectEnd();
        auto it = waits_.find(id);
        if (it != waits_.end()) {
          server_.removeWaiter(it->second);
          waits_.erase(it);
        }
        return;
      }
      case tcp::Op::Hello: throw tcp::ProtocolError("a second hello");
    }
    throw tcp::ProtocolError(fmt::format("unknown opcode {}", op));
  }

  void handleHello(uint8_t op, tcp::FrameReader& r) {
    if (op != static_cast<uint8_t>(tcp::Op::Hello)) {
      drop(fmt::format("the first frame is opcode {}, not a hello: not a cohort TCPStore client?", op));
      return;
    }
    uint32_t magic = r.u32();
    if (magic != tcp::kMagic) {
      drop(fmt::format("bad magic 0x{:08x} in the hello (expected 0x{:08x}): not a cohort TCPStore client", magic,
                       tcp::kMagic));
      return;
    }
    uint16_t version = r.u16();
    if (version != tcp::kVersion) {
      refuse(fmt::format("the client speaks TCPStore protocol version {}, this server speaks version {}", version,
                         tcp::kVersion));
      return;
    }
    std::string token = r.str(tcp::kMaxTokenSize, "token");
    r.expectEnd();
    if (!server_.token_.empty() && !constantTimeEquals(token, server_.token_)) {
      refuse(token.empty() ? "this server requires a token (COHORT_STORE_TOKEN) and the client presented none"
                           : "the client's token (COHORT_STORE_TOKEN) does not match the server's");
      return;
    }
    helloDone_ = true;
    helloTimer_.cancel();
    tcp::FrameWriter f;
    f.u8(static_cast<uint8_t>(tcp::Status::Ok)).u32(0).u16(tcp::kVersion);
    f.u32(static_cast<uint32_t>(server_.opts_.maxKeySize)).u32(static_cast<uint32_t>(server_.opts_.maxValueSize));
    send(f.finish());
  }

  void registerWaiter(const std::shared_ptr<Waiter>& w, const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
      if (server_.data_.count(k)) continue;
      server_.waiters_[k].push_back(w);
      w->missingKeys.push_back(k);
      ++w->missing;
    }
    if (w->missing == 0) {
      w->done = true;
      completeWaiter(*w);
      return;
    }
    // A client reusing the id of a pending get/wait replaces it.
    auto it = waits_.find(w->id);
    if (it != waits_.end()) server_.removeWaiter(it->second);
    waits_[w->id] = w;
    server_.waiterSession_[w.get()] = shared_from_this();
  }

  void send(Bytes frame) {
    if (closed_) return;
    // A client that sends requests but never reads the replies must not make the server buffer
    // without bound: past two largest values (and some room), it is dropped.
    outBytes_ += frame.size();
    size_t limit = 2 * server_.opts_.maxValueSize + (size_t{16} << 20);
    if (outBytes_ > limit) {
      drop(fmt::format("it does not read its replies ({} bytes queued, limit {})", outBytes_, limit));
      return;
    }
    out_.push_back(std::move(frame));
    if (out_.size() == 1) writeNext();
  }

  void writeNext() {
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_.front()), [self](error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) {
        COHORT_LOG(Info, "TCPStore server {}: client {} went away while being answered: {}", self->server_.address_,
                   self->peer_, ec.message());
        self->close();
        return;
      }
      self->outBytes_ -= self->out_.front().size();
      self->out_.pop_front();
      if (!self->out_.empty()) self->writeNext();
      else if (self->closeAfterWrite_) self->close();
    });
  }

  TCPStoreServer::Impl& server_;
  Tcp::socket socket_;
  asio::steady_timer helloTimer_;
  std::string peer_;
  uint8_t header_[4] = {};
  Bytes body_;
  std::deque<Bytes> out_;
  size_t outBytes_ = 0;
  std::map<uint32_t, std::shared_ptr<Waiter>> waits_;
  bool helloDone_ = false;
  bool closed_ = false;
  bool closeAfterWrite_ = false;
};

}  // namespace server

TCPStoreServer::Impl::Impl(TCPStoreServerOptions opts) : opts_(std::move(opts)), pid_(getpid()) {
  token_ = opts_.token ? *opts_.token : tcp::defaultToken();
  std::string where = fmt::format("{}:{}", opts_.host, opts_.port);
  if (token_.size() > tcp::kMaxTokenSize)
    throw ValueError(fmt::format("TCPStoreServer({}): the token has {} bytes, at most {} are allowed", where,
                                 token_.size(), tcp::kMaxTokenSize));
  if (opts_.maxKeySize == 0 || opts_.maxValueSize > (size_t{1} << 30))
    throw ValueError(fmt::format("TCPStoreServer({}): maxKeySize must be at least 1 and maxValueSize at most 1 GiB "
                                 "(got {} and {})",
                                 where, opts_.maxKeySize, opts_.maxValueSize));
  if (opts_.maxKeySize > (size_t{1} << 30)) opts_.maxKeySize = size_t{1} << 30;

  error_code ec;
  Tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(opts_.host, std::to_string(opts_.port),
                                    Tcp::resolver::passive | Tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty())
    throw StoreError(fmt::format("TCPStoreServer: cannot resolve {}: {}", where, ec ? ec.message() : "no address"));
  std::string lastError;
  for (const auto& entry : endpoints) {
    Tcp::endpoint ep = entry.endpoint();
    error_code e;
    acceptor_.open(ep.protocol(), e);
    if (!e) acceptor_.set_option(Tcp::acceptor::reuse_address(true), e);
    if (!e) acceptor_.bind(ep, e);
    if (!e) acceptor_.listen(asio::socket_base::max_listen_connections, e);
    if (!e) break;
    lastError = e.message();
    error_code ignore;
    acceptor_.close(ignore);
  }
  if (!acceptor_.is_open()) throw StoreError(fmt::format("TCPStoreServer: cannot listen on {}: {}", where, lastError));
  port_ = acceptor_.local_endpoint().port();
  address_ = fmt::format("{}:{}", opts_.host, port_);
  accept();
  thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      COHORT_LOG(Error, "TCPStore server {}: event loop stopped by an exception: {}", address_, e.what());
    }
  });
  COHORT_LOG(Debug, "TCPStore server listening on {}", address_);
}

TCPStoreServer::Impl::~Impl() { stop(); }

void TCPStoreServer::Impl::stop() {
  if (stopped_) return;
  stopped_ = true;
  io_.stop();
  if (thread_.joinable()) thread_.join();
  // The loop is stopped: nothing else touches the state now.
  error_code ec;
  acceptor_.close(ec);
  auto sessions = sessions_;
  for (const auto& s : sessions) s->close();
  sessions_.clear();
  waiters_.clear();
  waiterSession_.clear();
}

void TCPStoreServer::Impl::accept() {
  acceptor_.async_accept([this](error_code ec, Tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      COHORT_LOG(Warning, "TCPStore server {}: accept failed: {}", address_, ec.message());
    } else {
      error_code ignore;
      socket.set_option(Tcp::no_delay(true), ignore);
      auto s = std::make_shared<Session>(*this, std::move(socket));
      sessions_.insert(s);
      ++numConnections_;
      COHORT_LOG(Debug, "TCPStore server {}: client {} connected", address_, s->peer());
      s->start();
    }
    accept();
  });
}

void TCPStoreServer::Impl::notifyKey(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto list = std::move(it->second);
  waiters_.erase(it);
  for (const auto& w : list) {
    if (w->done || --w->missing > 0) continue;
    w->done = true;
    auto sit = waiterSession_.find(w.get());
    if (sit == waiterSession_.end()) continue;
    auto session = sit->second.lock();
    waiterSession_.erase(sit);
    if (session) session->completeWaiter(*w);
  }
}

void TCPStoreServer::Impl::removeWaiter(const std::shared_ptr<Waiter>& w) {
  w->done = true;
  waiterSession_.erase(w.get());
  for (const auto& k : w->missingKeys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    auto& list = it->second;
    std::erase(list, w);
    if (list.empty()) waiters_.erase(it);
  }
}

void TCPStoreServer::Impl::sessionClosed(const std::shared_ptr<Session>& s) {
  if (sessions_.erase(s)) --numConnections_;
}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions opts) : impl_(std::make_unique<Impl>(std::move(opts))) {}

TCPStoreServer::~TCPStoreServer() {
  // A forked child's copy: the loop thread and the sockets are the parent's; touch nothing.
  if (impl_ && getpid() != impl_->pid_) (void)impl_.release();
}

const std::string& TCPStoreServer::host() const { return impl_->opts_.host; }
uint16_t TCPStoreServer::port() const { return impl_->port_; }
std::string TCPStoreServer::address() const { return impl_->address_; }
size_t TCPStoreServer::numConnections() const { return impl_->numConnections_.load(); }
size_t TCPStoreServer::numDropped() const { return impl_->numDropped_.load(); }
void TCPStoreServer::stop() { impl_->stop(); }

}  // namespace cohort::dist
