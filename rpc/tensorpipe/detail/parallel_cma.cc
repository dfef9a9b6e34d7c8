#include <cohort/rpc/tensorpipe/detail/parallel_cma.h>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <tensorpipe/channel/channel.h>
#include <tensorpipe/channel/context.h>
#include <tensorpipe/channel/error.h>
#include <tensorpipe/common/cpu_buffer.h>
#include <tensorpipe/tensorpipe.h>
#include <tensorpipe/transport/connection.h>

#include <cohort/core/util/error.h>
#include <cohort/rpc/detail/thread_pool.h>

namespace tp = tensorpipe;

namespace cohort::rpc {

namespace {

// A tensor below this is copied on the transport thread that read its descriptor: a pool hand-off
// would cost more than the copy.
constexpr size_t kInlineCopyBytes = size_t{64} << 10;
// process_vm_readv moves at most this much per call (read(2)'s limit).
constexpr size_t kMaxBytesPerCall = 0x7ffff000;

class CmaError final : public tp::BaseError {
 public:
  explicit CmaError(std::string what) : what_(std::move(what)) {}
  std::string what() const override { return what_; }

 private:
  std::string what_;
};

tp::Error makeError(std::string what) {
  return tp::Error(std::make_shared<CmaError>(std::move(what)), __FILE__, __LINE__);
}

std::atomic<uint64_t> gTensors{0}, gBytes{0}, gSplit{0};

void countReceived(size_t length, bool split) {
  gTensors.fetch_add(1, std::memory_order_relaxed);
  gBytes.fetch_add(length, std::memory_order_relaxed);
  if (split) gSplit.fetch_add(1, std::memory_order_relaxed);
}

// Reads `length` bytes at `remote` in process `pid` into `local`. Empty on success, else why not.
std::string readRemote(pid_t pid, char* local, uint64_t remote, size_t length) {
  while (length > 0) {
    size_t n = std::min(length, kMaxBytesPerCall);
    iovec l{local, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return fmt::format("process_vm_readv of {} bytes at 0x{:x} in pid {} failed: {}", n, remote, pid,
                         got < 0 ? std::strerror(errno) : "it read nothing");
    }
    local += got;
    remote += static_cast<uint64_t>(got);
    length -= static_cast<size_t>(got);
  }
  return {};
}

// One tensor's copy, split in chunks; the chunk that finishes last reports.
struct CopyJob {
  std::atomic<int> remaining{0};
  std::mutex mu;
  std::string error;
  std::function<void(std::string)> done;

  void chunkDone(std::string err) {
    if (!err.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = std::move(err);
    }
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::string e;
      {
        std::lock_guard<std::mutex> lock(mu);
        e = std::move(error);
      }
      done(std::move(e));
    }
  }
};

// Splits a copy into chunks and runs them on the RPC layer's thread pool (rpc/detail/thread_pool.h),
// here with a fixed size, no polling, and threads named "cohort-rpc-copy".
class CopyPool {
 public:
  explicit CopyPool(int threads)
      : threads_(threads), pool_(threads, threads, std::chrono::microseconds(0), "cohort-rpc-copy") {}

  // Copies and then calls done(error) once, on a pool thread (or this one, for a small tensor).
  void copy(pid_t pid, void* local, uint64_t remote, size_t length, std::function<void(std::string)> done) {
    if (length < kInlineCopyBytes) {
      std::string err = readRemote(pid, static_cast<char*>(local), remote, length);
      if (err.empty()) countReceived(length, false);
      done(std::move(err));
      return;
    }
    size_t chunks = std::clamp<size_t>(length / kMinChunkBytes, 1, static_cast<size_t>(threads_));
    // Chunk edges on 4 KiB: each thread pins whole pages of its own.
    size_t chunk = (length / chunks + 4095) & ~size_t{4095};
    size_t parts = (length + chunk - 1) / chunk;
    auto job = std::make_shared<CopyJob>();
    job->done = [length, split = parts > 1, done = std::move(done)](std::string err) {
      if (err.empty()) countReceived(length, split);
      done(std::move(err));
    };
    job->remaining.store(static_cast<int>(parts), std::memory_order_relaxed);
    for (size_t off = 0; off < length; off += chunk) {
      char* to = static_cast<char*>(local) + off;
      const size_t n = std::min(chunk, length - off);
      bool queued = pool_.run([job, pid, to, from = remote + off, n] { job->chunkDone(readRemote(pid, to, from, n)); });
      if (!queued) job->chunkDone("the RPC agent is shutting down");
    }
  }

  // Runs what is queued, then joins the threads.
  void stop() { pool_.stop(); }

 private:
  const int threads_;
  ThreadPool pool_;
};

struct Descriptor {
  uint64_t pid;
  uint64_t ptr;
  uint64_t length;
};

class ChannelImpl : public std::enable_shared_from_this<ChannelImpl> {
 public:
  ChannelImpl(std::shared_ptr<CopyPool> pool, std::shared_ptr<tp::transport::Connection> descriptors,
              std::shared_ptr<tp::transport::Connection> completions)
      : pool_(std::move(pool)), descriptors_(std::move(descriptors)), completions_(std::move(completions)) {}

  void send(tp::Buffer buffer, size_t length, tp::channel::TSendCallback callback) {
    tp::Error err = error();
    if (err || length == 0) {
      callback(err);
      return;
    }
    auto desc = std::make_shared<Descriptor>(Descriptor{static_cast<uint64_t>(getpid()),
                                                        reinterpret_cast<uint64_t>(buffer.unwrap<tp::CpuBuffer>().ptr),
                                                        static_cast<uint64_t>(length)});
    auto self = shared_from_this();
    descriptors_->write(desc.get(), sizeof(Descriptor), [self, desc](const tp::Error& e) {
      if (e) self->fail(e);
    });
    // The receiver answers once it has copied: only then may the sender's buffer go.
    completions_->read(nullptr, 0, [self, callback = std::move(callback)](const tp::Error& e, const void*, size_t) {
      if (e) self->fail(e);
      callback(e);
    });
  }

  void recv(tp::Buffer buffer, size_t length, tp::channel::TRecvCallback callback) {
    tp::Error err = error();
    if (err || length == 0) {
      callback(err);
      return;
    }
    auto op = std::make_shared<RecvOp>();
    op->ptr = buffer.unwrap<tp::CpuBuffer>().ptr;
    op->length = length;
    op->callback = std::move(callback);
    {
      std::lock_guard<std::mutex> lock(mu_);
      recvs_.push_back(op);
    }
    auto self = shared_from_this();
    descriptors_->read(&op->desc, sizeof(Descriptor), [self, op](const tp::Error& e, const void*, size_t n) {
      if (e) {
        self->finish(op, e);
        return;
      }
      if (n != sizeof(Descriptor) || op->desc.length != op->length) {
        tp::Error bad = makeError(
            fmt::format("cma descriptor from the peer describes {} bytes where {} were expected ({}-byte frame)",
                        op->desc.length, op->length, n));
        self->fail(bad);
        self->finish(op, bad);
        return;
      }
      self->pool_->copy(static_cast<pid_t>(op->desc.pid), op->ptr, op->desc.ptr, op->length,
                        [self, op](std::string failure) {
                          self->finish(op, failure.empty() ? tp::Error::kSuccess : makeError(std::move(failure)));
                        });
    });
  }

  void setId(std::string id) {
    descriptors_->setId(id + ".d");
    completions_->setId(id + ".c");
  }

  void close() { fail(tp::Error(std::make_shared<tp::channel::ChannelClosedError>(), __FILE__, __LINE__)); }

 private:
  struct RecvOp {
    void* ptr = nullptr;
    size_t length = 0;
    Descriptor desc{};
    tp::channel::TRecvCallback callback;
    bool done = false;
    tp::Error error;
  };

  tp::Error error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // The first error sticks, and closing both connections fails whatever waits on them.
  void fail(const tp::Error& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_) return;
      error_ = e;
    }
    descriptors_->close();
    completions_->close();
  }

  // Receives complete in the order they were posted: the sender reads completions in that order.
  void finish(const std::shared_ptr<RecvOp>& op, const tp::Error& e) {
    if (e) fail(e);
    std::unique_lock<std::mutex> lock(mu_);
    op->done = true;
    op->error = e;
    if (draining_) return;  // the thread draining now will reach it
    draining_ = true;
    while (!recvs_.empty() && recvs_.front()->done) {
      std::shared_ptr<RecvOp> next = std::move(recvs_.front());
      recvs_.pop_front();
      lock.unlock();
      next->callback(next->error);
      next->callback = nullptr;
      if (!next->error) {
        auto self = shared_from_this();
        completions_->write(nullptr, 0, [self](const tp::Error& we) {
          if (we) self->fail(we);
        });
      }
      lock.lock();
    }
    draining_ = false;
  }

  std::shared_ptr<CopyPool> pool_;
  std::shared_ptr<tp::transport::Connection> descriptors_;
  std::shared_ptr<tp::transport::Connection> completions_;
  std::mutex mu_;
  tp::Error error_;
  std::deque<std::shared_ptr<RecvOp>> recvs_;
  bool draining_ = false;
};

// What TensorPipe holds: dropping it closes the channel (callbacks in flight keep the impl alive).
class Channel final : public tp::channel::Channel {
 public:
  explicit Channel(std::shared_ptr<ChannelImpl> impl) : impl_(std::move(impl)) {}
  ~Channel() override { impl_->close(); }
  void send(tp::Buffer buffer, size_t length, tp::channel::TSendCallback callback) override {
    impl_->send(buffer, length, std::move(callback));
  }
  void recv(tp::Buffer buffer, size_t length, tp::channel::TRecvCallback callback) override {
    impl_->recv(buffer, length, std::move(callback));
  }
  void setId(std::string id) override { impl_->setId(std::move(id)); }
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<ChannelImpl> impl_;
};

class Context final : public tp::channel::Context {
 public:
  explicit Context(int copyThreads)
      : cma_(tp::channel::cma::create()), pool_(std::make_shared<CopyPool>(copyThreads)) {}
  ~Context() override { join(); }

  bool isViable() const override { return cma_->isViable(); }
  size_t numConnectionsNeeded() const override { return 2; }
  const std::unordered_map<tp::Device, std::string>& deviceDescriptors() const override {
    return cma_->deviceDescriptors();
  }
  bool canCommunicateWithRemote(const std::string& local, const std::string& remote) const override {
    return cma_->canCommunicateWithRemote(local, remote);
  }

  std::shared_ptr<tp::channel::Channel> createChannel(std::vector<std::shared_ptr<tp::transport::Connection>> conns,
                                                      tp::channel::Endpoint) override {
    auto impl = std::make_shared<ChannelImpl>(pool_, conns.at(0), conns.at(1));
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) impl->close();
    // Forget the channels that are gone, so a long-lived agent's list stays short.
    channels_.erase(std::remove_if(channels_.begin(), channels_.end(), [](auto& w) { return w.expired(); }),
                    channels_.end());
    channels_.push_back(impl);
    return std::make_shared<Channel>(std::move(impl));
  }

  void setId(std::string id) override { cma_->setId(std::move(id)); }

  void close() override {
    std::vector<std::weak_ptr<ChannelImpl>> channels;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      channels.swap(channels_);
    }
    for (auto& w : channels) {
      if (auto c = w.lock()) c->close();
    }
    cma_->close();
  }

  void join() override {
    close();
    cma_->join();
    pool_->stop();
  }

 private:
  std::shared_ptr<tp::channel::Context> cma_;  // viability and device descriptors only
  std::shared_ptr<CopyPool> pool_;
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::weak_ptr<ChannelImpl>> channels_;
};

}  // namespace

CmaStats cmaStats() {
  return CmaStats{gTensors.load(std::memory_order_relaxed), gBytes.load(std::memory_order_relaxed),
                  gSplit.load(std::memory_order_relaxed)};
}

std::shared_ptr<tp::channel::Context> createParallelCmaChannel(int copyThreads) {
  if (copyThreads < 1 || copyThreads > 64) {
    throw ValueError(fmt::format("createParallelCmaChannel: copyThreads must be 1 to 64, got {}", copyThreads));
  }
  return std::make_shared<Context>(copyThreads);
}

}  // namespace cohort::rpc
