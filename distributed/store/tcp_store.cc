// TCPStore client: one connection, one Boost.Asio I/O thread, requests matched to replies by id.
// See tcp_store.h for the protocol and the threading rules.
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility> (C++20 mode).
#include <utility>

#include <boost/asio.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/store/detail/store_util.h>
#include <cohort/distributed/store/detail/tcp_protocol.h>
#include <cohort/distributed/store/tcp_store.h>

namespace cohort::dist {

namespace asio = boost::asio;
using Tcp = asio::ip::tcp;
using boost::system::error_code;
using detail::Clock;

namespace {

struct Reply {
  tcp::Status status = tcp::Status::Ok;
  Bytes body;  // the whole reply body; fields start after the status and id
  tcp::FrameReader fields() const {
    tcp::FrameReader r(body.data(), body.size());
    r.u8();
    r.u32();
    return r;
  }
};

Millis since(Clock::time_point t) { return std::chrono::duration_cast<Millis>(Clock::now() - t); }

}  // namespace

class TCPStore::Impl {
 public:
  Impl(const std::string& host, uint16_t port, const TCPStoreOptions& opts);
  ~Impl();

  // Sends one request and waits for its reply until `deadline`; nullopt when it passed (a get
  // or wait is then cancelled on the server). Throws StoreError when the connection is broken
  // and ValueError when the server rejected the arguments.
  std::optional<Reply> call(tcp::Op op, const std::function<void(tcp::FrameWriter&)>& fields,
                            Clock::time_point deadline);

  void checkKey(const std::string& key) const;
  void checkValue(const Bytes& value, const char* what) const;
  void checkFrame(size_t size) const;
  [[noreturn]] void throwNoReply(const std::string& what, Millis timeout) const;

  std::string host_;
  uint16_t port_;
  std::string where_;     // host:port
  std::string describe_;  // TCPStore(host:port)
  pid_t pid_;
  size_t maxKey_ = 0;
  size_t maxValue_ = 0;

 private:
  void connect(const TCPStoreOptions& opts, Millis connectTimeout);
  error_code tryConnect(Clock::time_point deadline);
  void hello(const std::string& token, Clock::time_point deadline);
  bool runUntil(const bool& done, Clock::time_point deadline);

  // --- the I/O thread ---
  void enqueue(Bytes frame);
  void writeNext();
  void readHeader();
  void readBody();
  void fail(const std::string& reason);

  asio::io_context io_;
  Tcp::socket socket_{io_};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;

  std::mutex mu_;  // guards pending_, nextId_, broken_
  std::map<uint32_t, std::shared_ptr<std::promise<Reply>>> pending_;
  uint32_t nextId_ = 1;
  std::string broken_;

  std::deque<Bytes> out_;  // I/O thread only
  uint8_t header_[4] = {};
  Bytes body_;
};

TCPStore::Impl::Impl(const std::string& host, uint16_t port, const TCPStoreOptions& opts)
    : host_(host), port_(port), where_(fmt::format("{}:{}", host, port)), describe_("TCPStore(" + where_ + ")"),
      pid_(getpid()) {
  connect(opts, opts.connectTimeout.value_or(opts.timeout));
  work_.emplace(asio::make_work_guard(io_));
  io_.restart();
  readHeader();
  thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      COHORT_LOG(Error, "{}: the client's I/O loop stopped by an exception: {}", describe_, e.what());
      fail(std::string("the client's I/O loop failed: ") + e.what());
    }
  });
}

TCPStore::Impl::~Impl() {
  if (thread_.joinable()) {
    asio::post(io_, [this] {
      error_code ec;
      socket_.shutdown(Tcp::socket::shutdown_both, ec);
      socket_.close(ec);
      work_.reset();
    });
    thread_.join();
  }
}

bool TCPStore::Impl::runUntil(const bool& done, Clock::time_point deadline) {
  io_.restart();
  while (!done) {
    if (io_.run_one_until(deadline) == 0) {
      if (Clock::now() >= deadline) return false;
      io_.restart();
    }
  }
  return true;
}

error_code TCPStore::Impl::tryConnect(Clock::time_point deadline) {
  error_code ec;
  Tcp::resolver resolver(io_);
  auto endpoints = resolver.resolve(host_, std::to_string(port_), Tcp::resolver::numeric_service, ec);
  if (ec) return ec;
  bool done = false;
  asio::async_connect(socket_, endpoints, [&](error_code e, const Tcp::endpoint&) {
    ec = e;
    done = true;
  });
  if (!runUntil(done, deadline)) {
    error_code ignore;
    socket_.close(ignore);  // completes the connect with operation_aborted
    io_.restart();
    while (!done) io_.run_one();
    ec = asio::error::timed_out;
  }
  if (ec) {
    error_code ignore;
    socket_.close(ignore);
  }
  return ec;
}

void TCPStore::Impl::connect(const TCPStoreOptions& opts, Millis connectTimeout) {
  auto start = Clock::now();
  auto deadline = detail::deadlineAfter(connectTimeout);
  Millis backoff{10};
  int attempts = 0;
  for (;;) {
    ++attempts;
    error_code ec = tryConnect(deadline);
    if (!ec) break;
    auto now = Clock::now();
    if (now >= deadline) {
      throw StoreError(fmt::format("{}: could not connect to {} within {} ms ({} attempts over {} ms; last error: {})",
                                   describe_, where_, connectTimeout.count(), attempts, since(start).count(),
                                   ec.message()));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, Millis{1000});
  }
  error_code ignore;
  socket_.set_option(Tcp::no_delay(true), ignore);
  // A connected server answers the hello at once; give it at least a second even when the
  // connect used up the whole connect timeout.
  hello(opts.token ? *opts.token : tcp::defaultToken(), std::max(deadline, Clock::now() + Millis{1000}));
}

void TCPStore::Impl::hello(const std::string& token, Clock::time_point deadline) {
  if (token.size() > tcp::kMaxTokenSize)
    throw ValueError(
        fmt::format("{}: the token has {} bytes, at most {} are allowed", describe_, token.size(), tcp::kMaxTokenSize));
  auto start = Clock::now();
  tcp::FrameWriter f;
  f.u8(static_cast<uint8_t>(tcp::Op::Hello)).u32(0).u32(tcp::kMagic).u16(tcp::kVersion).str(token);
  Bytes frame = f.finish();

  auto step = [&](auto&& startOp, const char* what) {
    bool done = false;
    error_code ec;
    startOp([&](error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!runUntil(done, deadline)) {
      error_code ignore;
      socket_.close(ignore);
      io_.restart();
      while (!done) io_.run_one();
      throw StoreError(fmt::format("{}: connected, but the server did not answer the hello within {} ms while {} "
                                   "(not a cohort TCPStore server, or a hung one?)",
                                   describe_, since(start).count(), what));
    }
    if (ec) {
      socket_.close(ec);
      throw StoreError(fmt::format("{}: the server closed the connection during the hello while {}: {} (not a cohort "
                                   "TCPStore server, or one speaking another protocol version?)",
                                   describe_, what, ec.message()));
    }
  };
  step([&](auto h) { asio::async_write(socket_, asio::buffer(frame), h); }, "sending it");
  step([&](auto h) { asio::async_read(socket_, asio::buffer(header_), h); }, "reading the reply length");
  uint32_t len = tcp::readLength(header_);
  if (len < 5 || len > tcp::kMaxHelloFrame)
    throw StoreError(
        fmt::format("{}: the hello reply has a length of {} bytes: not a cohort TCPStore server?", describe_, len));
  body_.resize(len);
  step([&](auto h) { asio::async_read(socket_, asio::buffer(body_), h); }, "reading the reply");
  try {
    tcp::FrameReader r(body_.data(), body_.size());
    auto status = static_cast<tcp::Status>(r.u8());
    r.u32();
    if (status == tcp::Status::Refused)
      throw StoreError(fmt::format("{} refused this client: {}", describe_, r.str(tcp::kMaxHelloFrame, "reason")));
    if (status != tcp::Status::Ok) throw tcp::ProtocolError("unexpected status " + std::to_string(int(status)));
    uint16_t version = r.u16();
    maxKey_ = r.u32();
    maxValue_ = r.u32();
    r.expectEnd();
    if (version != tcp::kVersion)
      throw StoreError(fmt::format("{}: the server answered with protocol version {}, this client speaks {}", describe_,
                                   version, tcp::kVersion));
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(
        fmt::format("{}: a malformed hello reply ({}): not a cohort TCPStore server?", describe_, e.what()));
  }
}

std::optional<Reply> TCPStore::Impl::call(tcp::Op op, const std::function<void(tcp::FrameWriter&)>& fields,
                                          Clock::time_point deadline) {
  if (getpid() != pid_) {
    throw StoreError(fmt::format("{} was connected by process {} and used in process {} (a forked child?): "
                                 "make a new TCPStore in the child",
                                 describe_, pid_, getpid()));
  }
  auto promise = std::make_shared<std::promise<Reply>>();
  auto future = promise->get_future();
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) throw StoreError(broken_);
    id = nextId_++;
    if (nextId_ == 0) nextId_ = 1;  // 0 is the hello's
    pending_[id] = promise;
  }
  tcp::FrameWriter f;
  f.u8(static_cast<uint8_t>(op)).u32(id);
  fields(f);
  asio::post(io_, [this, frame = f.finish()]() mutable { enqueue(std::move(frame)); });

  if (future.wait_until(deadline) == std::future_status::timeout) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(id);
    }
    if (op == tcp::Op::Get || op == tcp::Op::Wait) {
      tcp::FrameWriter c;
      c.u8(static_cast<uint8_t>(tcp::Op::Cancel)).u32(id);
      asio::post(io_, [this, frame = c.finish()]() mutable { enqueue(std::move(frame)); });
    }
    return std::nullopt;
  }
  Reply reply = future.get();  // rethrows the StoreError of a broken connection
  if (reply.status == tcp::Status::ValueError) {
    std::string msg;
    try {
      msg = reply.fields().str(reply.body.size(), "message");
    } catch (const tcp::ProtocolError& e) {
      msg = std::string("(malformed error reply: ") + e.what() + ")";
    }
    throw ValueError(fmt::format("{}: {}", describe_, msg));
  }
  if (reply.status != tcp::Status::Ok)
    throw StoreError(fmt::format("{}: unexpected reply status {} to {}", describe_, int(reply.status),
                                 tcp::opName(static_cast<uint8_t>(op))));
  return reply;
}

void TCPStore::Impl::checkKey(const std::string& key) const {
  if (key.size() > maxKey_)
    throw ValueError(
        fmt::format("{}: a key of {} bytes exceeds the server's limit of {} bytes", describe_, key.size(), maxKey_));
}

void TCPStore::Impl::checkValue(const Bytes& value, const char* what) const {
  if (value.size() > maxValue_)
    throw ValueError(fmt::format("{}: a {} of {} bytes exceeds the server's limit of {} bytes", describe_, what,
                                 value.size(), maxValue_));
}

void TCPStore::Impl::checkFrame(size_t size) const {
  size_t limit = tcp::maxRequestFrame(maxKey_, maxValue_);
  if (size > limit)
    throw ValueError(
        fmt::format("{}: a request of {} bytes exceeds the server's frame limit of {} bytes (too many keys?)",
                    describe_, size, limit));
}

void TCPStore::Impl::throwNoReply(const std::string& what, Millis timeout) const {
  throw TimeoutError(fmt::format("{}: {} got no reply within {} ms (is the server hung or overloaded?)", describe_,
                                 what, timeout.count()));
}

void TCPStore::Impl::enqueue(Bytes frame) {
  if (!socket_.is_open()) return;
  out_.push_back(std::move(frame));
  if (out_.size() == 1) writeNext();
}

void TCPStore::Impl::writeNext() {
  asio::async_write(socket_, asio::buffer(out_.front()), [this](error_code ec, size_t) {
    if (ec) {
      out_.clear();
      fail(fmt::format("{}: the connection to {} broke while sending: {}", describe_, where_, ec.message()));
      return;
    }
    out_.pop_front();
    if (!out_.empty()) writeNext();
  });
}

void TCPStore::Impl::readHeader() {
  asio::async_read(socket_, asio::buffer(header_), [this](error_code ec, size_t) {
    if (ec) {
      fail(fmt::format("{}: the connection to {} was lost: {}", describe_, where_, ec.message()));
      return;
    }
    uint32_t len = tcp::readLength(header_);
    if (len < 5 || len > tcp::maxReplyFrame(maxValue_)) {
      fail(fmt::format("{}: the server sent a malformed frame ({} bytes long)", describe_, len));
      return;
    }
    body_.resize(len);
    readBody();
  });
}

void TCPStore::Impl::readBody() {
  asio::async_read(socket_, asio::buffer(body_), [this](error_code ec, size_t) {
    if (ec) {
      fail(fmt::format("{}: the connection to {} was lost mid-reply: {}", describe_, where_, ec.message()));
      return;
    }
    tcp::FrameReader r(body_.data(), body_.size());
    auto status = static_cast<tcp::Status>(r.u8());
    uint32_t id = r.u32();
    std::shared_ptr<std::promise<Reply>> p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(id);
      if (it != pending_.end()) {
        p = std::move(it->second);
        pending_.erase(it);
      }
    }
    // No one waiting: the caller gave up (timeout) and the reply crossed its cancel.
    if (p) p->set_value(Reply{status, std::move(body_)});
    body_ = Bytes();
    readHeader();
  });
}

void TCPStore::Impl::fail(const std::string& reason) {
  std::map<uint32_t, std::shared_ptr<std::promise<Reply>>> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = reason;
    pending.swap(pending_);
  }
  error_code ignore;
  socket_.close(ignore);
  if (!pending.empty()) COHORT_LOG(Warning, "{}", reason);
  for (auto& [id, p] : pending) p->set_exception(std::make_exception_ptr(StoreError(reason)));
}

// ---- TCPStore ----------------------------------------------------------------------------------

namespace {

// A server bound to every interface is reached through loopback from its own host.
std::string connectHost(const std::string& bound) {
  if (bound == "0.0.0.0" || bound.empty()) return "127.0.0.1";
  if (bound == "::") return "::1";
  return bound;
}

}  // namespace

TCPStore::TCPStore(TCPStoreOptions opts) : Store(opts.timeout) {
  uint16_t port = opts.port;
  std::string host = opts.host;
  if (opts.isServer) {
    TCPStoreServerOptions so;
    so.host = opts.host;
    so.port = opts.port;
    so.token = opts.token;
    server_ = std::make_unique<TCPStoreServer>(so);
    port = server_->port();
    host = connectHost(opts.host);
  }
  impl_ = std::make_unique<Impl>(host, port, opts);
}

namespace {
TCPStoreOptions clientOptions(std::string host, uint16_t port, Millis timeout) {
  TCPStoreOptions o;
  o.host = std::move(host);
  o.port = port;
  o.timeout = timeout;
  return o;
}
}  // namespace

TCPStore::TCPStore(std::string host, uint16_t port, Millis timeout)
    : TCPStore(clientOptions(std::move(host), port, timeout)) {}

TCPStore::~TCPStore() {
  // A forked child's copy: the I/O thread and the connection are the parent's; touch nothing.
  if (impl_ && getpid() != impl_->pid_) (void)impl_.release();
  impl_.reset();  // the client goes before the server it may host
}

std::string TCPStore::describe() const { return impl_->describe_; }
const std::string& TCPStore::host() const { return impl_->host_; }
uint16_t TCPStore::port() const { return impl_->port_; }
TCPStoreServer* TCPStore::server() const { return server_.get(); }

void TCPStore::set(const std::string& key, const Bytes& value) {
  impl_->checkKey(key);
  impl_->checkValue(value, "value");
  Millis t = timeout_;
  if (!impl_->call(
          tcp::Op::Set, [&](tcp::FrameWriter& f) { f.str(key).bytes(value); }, detail::deadlineAfter(t)))
    impl_->throwNoReply(fmt::format("set(\"{}\")", key), t);
}

Bytes TCPStore::get(const std::string& key) {
  impl_->checkKey(key);
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::Get, [&](tcp::FrameWriter& f) { f.str(key); }, detail::deadlineAfter(t));
  if (!reply) detail::throwGetTimeout(describe(), t, key);
  try {
    auto r = reply->fields();
    return r.bytes(reply->body.size(), "value");
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed get reply: {}", describe(), e.what()));
  }
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  impl_->checkKey(key);
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::Add, [&](tcp::FrameWriter& f) { f.str(key).i64(delta); }, detail::deadlineAfter(t));
  if (!reply) impl_->throwNoReply(fmt::format("add(\"{}\", {})", key, delta), t);
  try {
    return reply->fields().i64();
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed add reply: {}", describe(), e.what()));
  }
}

Bytes TCPStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  impl_->checkKey(key);
  impl_->checkValue(expected, "expected value");
  impl_->checkValue(desired, "desired value");
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::CompareSet, [&](tcp::FrameWriter& f) { f.str(key).bytes(expected).bytes(desired); },
      detail::deadlineAfter(t));
  if (!reply) impl_->throwNoReply(fmt::format("compareSet(\"{}\")", key), t);
  try {
    return reply->fields().bytes(reply->body.size(), "value");
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed compareSet reply: {}", describe(), e.what()));
  }
}

namespace {

// Which of `keys` are missing, from a check reply (one presence byte per key, in order).
std::vector<std::string> missingFromCheck(const Reply& reply, const std::vector<std::string>& keys,
                                          const std::string& store) {
  try {
    auto r = reply.fields();
    uint32_t n = r.u32();
    if (n != keys.size()) throw tcp::ProtocolError(fmt::format("{} flags for {} keys", n, keys.size()));
    std::vector<std::string> missing;
    for (uint32_t i = 0; i < n; ++i)
      if (r.u8() == 0) missing.push_back(keys[i]);
    r.expectEnd();
    return missing;
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed check reply: {}", store, e.what()));
  }
}

size_t keysFrameSize(const std::vector<std::string>& keys) {
  size_t n = 16;
  for (const auto& k : keys) n += 4 + k.size();
  return n;
}

}  // namespace

bool TCPStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) impl_->checkKey(k);
  impl_->checkFrame(keysFrameSize(keys));
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::Check, [&](tcp::FrameWriter& f) { f.keys(keys); }, detail::deadlineAfter(t));
  if (!reply) impl_->throwNoReply(fmt::format("check({} keys)", keys.size()), t);
  return missingFromCheck(*reply, keys, describe()).empty();
}

bool TCPStore::deleteKey(const std::string& key) {
  impl_->checkKey(key);
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::Delete, [&](tcp::FrameWriter& f) { f.str(key); }, detail::deadlineAfter(t));
  if (!reply) impl_->throwNoReply(fmt::format("deleteKey(\"{}\")", key), t);
  try {
    return reply->fields().u8() != 0;
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed delete reply: {}", describe(), e.what()));
  }
}

int64_t TCPStore::numKeys() {
  Millis t = timeout_;
  auto reply = impl_->call(
      tcp::Op::NumKeys, [](tcp::FrameWriter&) {}, detail::deadlineAfter(t));
  if (!reply) impl_->throwNoReply("numKeys()", t);
  try {
    return reply->fields().i64();
  } catch (const tcp::ProtocolError& e) {
    throw StoreError(fmt::format("{}: a malformed numKeys reply: {}", describe(), e.what()));
  }
}

void TCPStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  for (const auto& k : keys) impl_->checkKey(k);
  impl_->checkFrame(keysFrameSize(keys));
  if (impl_->call(
          tcp::Op::Wait, [&](tcp::FrameWriter& f) { f.keys(keys); }, detail::deadlineAfter(timeout)))
    return;
  // Timed out: ask which keys are still missing, briefly; a server that does not answer that
  // either leaves every key in doubt.
  std::vector<std::string> missing = keys;
  try {
    auto reply = impl_->call(
        tcp::Op::Check, [&](tcp::FrameWriter& f) { f.keys(keys); },
        detail::deadlineAfter(std::min(timeout_, Millis{2000})));
    if (reply) missing = missingFromCheck(*reply, keys, describe());
  } catch (const Error&) {
  }
  detail::throwWaitTimeout(describe(), timeout, missing, keys.size());
}

}  // namespace cohort::dist
