#include <cohort/pipeline/transport.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>
#include <cohort/rpc/rpc.h>

namespace cohort::pipeline {

namespace {

constexpr int kMaxDims = 8;
constexpr int64_t kHeaderLen = 3 + kMaxDims;  // dtype, ndim, the data's device type on the wire, sizes

// ---- process group --------------------------------------------------------------------------

// Where tensors travel: a tensor goes over the group's backend for its own device when the group
// has one (CUDA tensors over NCCL), else through the other side (a CUDA tensor through the host
// and a CPU backend; a CPU tensor, in a group with only a CUDA backend, through this rank's
// device). The header, small and read on the host, travels on the CPU when the group has a CPU
// backend, else on this rank's device; the same rule on every rank, since the group is the same.
// The receiver places what arrives on its own device.
class ProcessGroupTransport final : public Transport {
 public:
  ProcessGroupTransport(dist::ProcessGroupPtr pg, Device device) : pg_(std::move(pg)), device_(device) {
    if (!pg_) throw ValueError("processGroupTransport: the process group is null");
    const bool cpu = pg_->supports(dist::OpType::Send, DeviceType::CPU);
    if (!cpu && (device_.isCpu() || !pg_->supports(dist::OpType::Send, device_.type())))
      throw NotSupportedError(fmt::format(
          "processGroupTransport: the process group sends neither CPU tensors nor {} ones (give the transport the "
          "device its stages run on, with a group that has a backend for it)",
          device_.str()));
    control_ = cpu ? Device::cpu() : device_;
  }
  ~ProcessGroupTransport() override {
    // Sends still in flight keep their tensors alive until they end (or fail).
    for (auto& p : pending_) try {
        p.work->wait(Millis(1000));
      } catch (...) {
      }
  }
  int rank() const override { return pg_->rank(); }
  int size() const override { return pg_->size(); }
  // Two process-group tags per tag, below MPI's guaranteed tag bound (32767).
  int64_t maxTag() const override { return 16383; }
  std::string describe(int r) const override { return fmt::format("rank {}", r); }
  std::string name() const override {
    std::string n = pg_->backend(control_.type()).name();
    if (!device_.isCpu() && control_.isCpu() && pg_->supports(dist::OpType::Send, device_.type()))
      n += ", " + pg_->backend(device_.type()).name();
    return fmt::format("process group ({})", n);
  }
  Device device() const override { return device_; }

  void send(const Tensor& tensor, int dst, int64_t tag) override {
    checkTag(tag);
    if (tensor.dim() > kMaxDims)
      throw ValueError(fmt::format("pipeline transport: a {}-dimensional tensor; at most {} dimensions travel",
                                   tensor.dim(), kMaxDims));
    reap();
    Device wire = tensor.device();
    if (!pg_->supports(dist::OpType::Send, wire.type())) wire = wire.isCpu() ? device_ : Device::cpu();
    if (!pg_->supports(dist::OpType::Send, wire.type()))
      throw NotSupportedError(fmt::format("pipeline transport: the process group has no backend that sends a tensor "
                                          "on {} to rank {}, directly or through {}",
                                          tensor.device().str(), dst, wire.str()));
    Tensor header = empty({kHeaderLen}, {.dtype = DType::Int64});
    auto* h = header.data<int64_t>();
    std::fill(h, h + kHeaderLen, 0);
    h[0] = static_cast<int64_t>(tensor.dtype());
    h[1] = tensor.dim();
    h[2] = static_cast<int64_t>(wire.type());
    for (int64_t d = 0; d < tensor.dim(); ++d) h[3 + d] = tensor.size(d);
    if (control_ != Device::cpu()) header = header.to(control_);
    Tensor data;
    if (tensor.numel() > 0) data = tensor.detach().contiguous().to(wire);
    std::lock_guard<std::mutex> lock(mu_);
    post(pg_->send(header, dst, {.tag = static_cast<int>(2 * tag), .timeout = kSendTimeout}), header);
    if (data.defined())
      post(pg_->send(data, dst, {.tag = static_cast<int>(2 * tag + 1), .timeout = kSendTimeout}), data);
  }

  // Posts the header's receive now and, the moment the header arrives (on the backend's thread),
  // the data's: the tensor then moves while this rank computes, and recv() finds it there.
  void expect(int src, int64_t tag) override {
    checkTag(tag);
    const auto key = std::make_pair(src, tag);
    auto in = std::make_shared<Incoming>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (incoming_.contains(key)) return;  // one posted receive per (source, tag) at a time
      in->header = empty({kHeaderLen}, {.dtype = DType::Int64, .device = control_});
      in->headerWork = pg_->recv(in->header, src, {.tag = static_cast<int>(2 * tag), .timeout = kSendTimeout});
      incoming_[key] = in;
    }
    // Outside the lock: a header already there runs the callback on this thread.
    std::weak_ptr<Incoming> weak = in;
    in->headerWork->future().addCallback([this, weak, src, tag](const Future<std::vector<Tensor>>& f) {
      auto in = weak.lock();
      if (!in) return;
      std::lock_guard<std::mutex> lock(mu_);
      if (f.hasError() || !in->header.defined()) {
        in->ready = true;
      } else {
        try {
          in->data = allocate(in->header, src, tag);
          if (in->data.numel() > 0)
            in->dataWork = pg_->recv(in->data, src, {.tag = static_cast<int>(2 * tag + 1), .timeout = kSendTimeout});
        } catch (...) {
          in->error = std::current_exception();
        }
        in->ready = true;
      }
      cv_.notify_all();
    });
  }

  Tensor recv(int src, int64_t tag, Millis timeout) override {
    expect(src, tag);  // posts the receive, unless the pipeline announced it already
    std::shared_ptr<Incoming> in;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = incoming_.find({src, tag});
      in = it->second;
      incoming_.erase(it);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    in->headerWork->wait(timeout);  // throws the backend's error (or TimeoutError)
    {
      // The header's callback (posting the data's receive) runs as the header's Work completes.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return in->ready; });
    }
    if (in->error) std::rethrow_exception(in->error);
    if (in->dataWork)
      in->dataWork->wait(
          std::max(Millis(1), std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now())));
    return in->data.device() == device_ ? in->data : in->data.to(device_);
  }

  void flush(Millis timeout) override {
    std::exception_ptr first;
    for (auto& p : pending_) {
      try {
        p.work->wait(timeout);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    pending_.clear();
    if (first) std::rethrow_exception(first);
  }

 private:
  // A send's own deadline: flush() waits with the pipeline's timeout; the op itself may wait for
  // its receiver as long as a step may last.
  static constexpr Millis kSendTimeout{Millis(24 * 3600 * 1000)};
  struct Pending {
    dist::WorkPtr work;
    Tensor keep;
  };
  void checkTag(int64_t tag) const {
    if (tag < 0 || tag > maxTag())
      throw ValueError(fmt::format("pipeline transport: tag {} outside 0..{} (too many micro-batches x stages for "
                                   "a process group's tags)",
                                   tag, maxTag()));
  }
  struct Incoming {
    Tensor header, data;
    dist::WorkPtr headerWork, dataWork;
    std::exception_ptr error;
    bool ready = false;  // the data's receive is posted (or failed, or not needed)
  };
  // The receive buffer the header describes, on the device the data travels on.
  Tensor allocate(const Tensor& received, int src, int64_t tag) const {
    const Tensor header = received.device().isCpu() ? received : received.to(Device::cpu());
    const auto* h = header.data<int64_t>();
    if (h[0] < 0 || h[0] >= kNumDTypes || h[1] < 0 || h[1] > kMaxDims || h[2] < 0 || h[2] >= kNumDeviceTypes)
      throw DistError(fmt::format("pipeline transport: a malformed header from rank {} (tag {})", src, tag));
    Device wire = Device::cpu();
    if (static_cast<DeviceType>(h[2]) != DeviceType::CPU) {
      if (device_.type() != static_cast<DeviceType>(h[2]))
        throw NotSupportedError(fmt::format(
            "pipeline transport: rank {} sends a tensor (tag {}) over the group's {} backend, but this rank's "
            "transport places tensors on {}; give processGroupTransport the device this rank's stages run on",
            src, tag, Device(static_cast<DeviceType>(h[2]), 0).str(), device_.str()));
      wire = device_;
    }
    return empty(Shape(h + 3, h + 3 + h[1]), {.dtype = static_cast<DType>(h[0]), .device = wire});
  }
  void post(dist::WorkPtr work, Tensor keep) { pending_.push_back({std::move(work), std::move(keep)}); }
  // Drops finished sends (failures stay for flush() to report).
  void reap() {
    std::erase_if(pending_, [](const Pending& p) { return p.work->isCompleted() && p.work->isSuccess(); });
  }

  dist::ProcessGroupPtr pg_;
  Device device_;   // where received tensors are placed
  Device control_;  // where headers travel
  std::vector<Pending> pending_;
  // Serialises this transport's calls into the group: the pipeline's thread and the backend
  // thread that posts an expected tensor's data.
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int64_t>, std::shared_ptr<Incoming>> incoming_;
};

// ---- rpc ------------------------------------------------------------------------------------

// Tensors delivered to this process, by (source pipeline rank, tag), in arrival order.
class Mailbox {
 public:
  static Mailbox& instance() {
    static Mailbox box;
    return box;
  }
  void put(int64_t src, int64_t tag, Tensor t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[{src, tag}].push_back(std::move(t));
    }
    cv_.notify_all();
  }
  // Undefined after `timeout`, or once `stop` holds (checked under the mailbox's lock: whatever
  // makes it hold calls wake()).
  Tensor take(int64_t src, int64_t tag, Millis timeout, const std::function<bool()>& stop = {}) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto key = std::make_pair(src, tag);
    auto there = [&] {
      auto it = slots_.find(key);
      return it != slots_.end() && !it->second.empty();
    };
    if (!cv_.wait_for(lock, timeout, [&] { return there() || (stop && stop()); }) || !there()) return {};
    auto it = slots_.find(key);
    Tensor t = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) slots_.erase(it);
    return t;
  }

  // Has a waiting take() check its `stop` again.
  void wake() {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int64_t, int64_t>, std::deque<Tensor>> slots_;
};

constexpr const char* kDeliver = "cohort.pipeline.deliver";
// Answers at once: a receive that waits probes its sender with it (RpcTransport::recv).
constexpr const char* kPing = "cohort.pipeline.ping";

void registerDeliver() {
  static std::once_flag once;
  std::call_once(once, [] {
    rpc::registerFunction(kDeliver,
                          [](int64_t src, int64_t tag, Tensor t) { Mailbox::instance().put(src, tag, std::move(t)); });
    rpc::registerFunction(kPing, [] {});
  });
}
// Registered when the library loads, so that a peer's probe (or tensor) never finds them missing
// while this process is still building its transport.
const bool kRegistered = (registerDeliver(), true);

class RpcTransport final : public Transport {
 public:
  RpcTransport(std::vector<std::string> workers, Device device) : workers_(std::move(workers)), device_(device) {
    registerDeliver();
    const std::string self = rpc::currentAgent()->self().name;
    for (size_t i = 0; i < workers_.size(); ++i) {
      (void)rpc::currentAgent()->worker(workers_[i]);  // RpcError for an unknown one
      if (workers_[i] == self) rank_ = static_cast<int>(i);
    }
    if (rank_ < 0)
      throw ValueError(fmt::format("rpcTransport: this worker ('{}') is not among the pipeline's workers", self));
  }
  ~RpcTransport() override {
    for (auto& f : pending_) (void)f.waitFor(Millis(1000));
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(workers_.size()); }
  int64_t maxTag() const override { return INT64_MAX; }
  std::string describe(int r) const override {
    return fmt::format("rank {} (worker '{}')", r, workers_.at(static_cast<size_t>(r)));
  }
  std::string name() const override { return "rpc"; }
  Device device() const override { return device_; }

  void send(const Tensor& tensor, int dst, int64_t tag) override {
    std::erase_if(pending_, [](const Future<void>& f) { return f.isCompleted() && !f.hasError(); });
    pending_.push_back(rpc::rpcAsync<void>(workers_.at(static_cast<size_t>(dst)), kDeliver, static_cast<int64_t>(rank_),
                                           tag, tensor.detach().to(Device::cpu())));  // RPC carries CPU tensors
  }

  // Waits in slices of kProbeEvery; after each slice without the tensor it probes the sender
  // with a ping (one at a time). The agent fails a call to a worker whose connection broke — one
  // pending when it broke, or any later one — so a sender that died ends the wait with an RpcError
  // naming it, within about a slice, instead of at the timeout. A ping that times out proves
  // nothing (the sender may be busy) and the wait goes on.
  Tensor recv(int src, int64_t tag, Millis timeout) override {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    const std::string& peer = workers_.at(static_cast<size_t>(src));
    std::optional<Future<void>> ping;
    auto peerGone = [&] {
      if (!ping || !ping->isCompleted() || !ping->hasError()) return false;
      try {
        std::rethrow_exception(ping->exception());
      } catch (const RpcTimeoutError&) {
        return false;
      } catch (...) {
        return true;
      }
    };
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline)
        throw TimeoutError(fmt::format("pipeline transport (rpc): nothing arrived from {} under tag {} within {} ms",
                                       describe(src), tag, timeout.count()));
      const auto left = std::chrono::duration_cast<Millis>(deadline - now) + Millis(1);
      Tensor t = Mailbox::instance().take(src, tag, std::min(kProbeEvery, left), peerGone);
      if (t.defined()) return t.device() == device_ ? t : t.to(device_);
      if (peerGone()) {
        std::string why = "unknown error";
        try {
          std::rethrow_exception(ping->exception());
        } catch (const std::exception& e) {
          why = e.what();
        }
        throw RpcError(fmt::format("pipeline transport (rpc): {} is gone; nothing arrived from it under tag {}: {}",
                                   describe(src), tag, why));
      }
      if (!ping || ping->isCompleted()) {
        ping = rpc::rpcAsync<void>(rpc::Timeout{timeout}, peer, kPing);
        ping->addCallback([](const Future<void>&) { Mailbox::instance().wake(); });
      }
    }
  }

  void flush(Millis timeout) override {
    std::exception_ptr first;
    for (auto& f : pending_) {
      try {
        f.wait(timeout);
        if (f.hasError()) std::rethrow_exception(f.exception());
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    pending_.clear();
    if (first) std::rethrow_exception(first);
  }

 private:
  static constexpr Millis kProbeEvery{100};
  std::vector<std::string> workers_;
  Device device_;
  int rank_ = -1;
  std::vector<Future<void>> pending_;
};

}  // namespace

TransportPtr processGroupTransport(dist::ProcessGroupPtr pg, Device device) {
  return std::make_shared<ProcessGroupTransport>(std::move(pg), device);
}

TransportPtr rpcTransport(std::vector<std::string> workers, Device device) {
  return std::make_shared<RpcTransport>(std::move(workers), device);
}

}  // namespace cohort::pipeline
