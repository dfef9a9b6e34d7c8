#include <cohort/rpc/tensorpipe/tensorpipe_agent.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <tensorpipe/tensorpipe.h>

#include <cohort/core/util/env.h>
#include <cohort/core/util/logging.h>
#include <cohort/distributed/store/detail/store_util.h>
#include <cohort/rpc/tensorpipe/detail/parallel_cma.h>

namespace tp = tensorpipe;

namespace cohort::rpc {

namespace {

COHORT_ENV_KNOB(kRpcShmKnob, "COHORT_RPC_SHM", "",
                "1 or 0: overrides RpcOptions::useShm. TensorPipe's shared-memory transport between the workers "
                "of one host (round trips of ~20 us) keeps one thread per process polling without sleeping, a "
                "whole core even while idle; 0 uses TCP, whose thread sleeps until there is work (~90 us round "
                "trips). Tensors between processes of one host move by cross-memory attach either way.");

// Same host and network namespace: shm's abstract sockets reach each other only then.
std::string readHostId() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  char ns[256] = {0};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return fmt::format("{}|{}|{}", host, boot, n > 0 ? std::string(ns, n) : std::string());
}

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

}  // namespace

TensorPipeAgent::TensorPipeAgent(const std::string& name, int rank, int worldSize, RpcOptions options)
    : RpcAgent(WorkerInfo{name, rank}, worldSize, std::move(options)) {}

TensorPipeAgent::~TensorPipeAgent() { closeTransport(); }

void TensorPipeAgent::start() {
  if (!store_) throw ValueError("rpc::init: no store to meet the other workers through");
  hostId_ = readHostId();
  useShm_ = kRpcShmKnob.raw() ? kRpcShmKnob.flag() : options_.useShm;  // ValueError naming it when malformed
  context_ = std::make_shared<tp::Context>(tp::ContextOptions().name(self_.name));
  context_->registerTransport(0, "uv", tp::transport::uv::create());
  std::vector<std::string> urls;
  std::string host = options_.tcpHost;
  if (host.empty()) {
    auto [err, addr] = tp::transport::uv::lookupAddrForHostname();
    host = err ? "127.0.0.1" : addr;
  }
  urls.push_back("uv://" + host);
  std::random_device rd;
  std::string shmName = fmt::format("cohort-rpc-{}-{}-{:x}", getpid(), self_.rank, (uint64_t{rd()} << 32) | rd());
  if (useShm_) {
    context_->registerTransport(10, "shm", tp::transport::shm::create());
    urls.push_back("shm://" + shmName);
  }
  context_->registerChannel(0, "basic", tp::channel::basic::create());
  // Cross-memory attach: a tensor between processes of one host is read straight out of the
  // sender's memory with process_vm_readv, no ring-buffer copies, by several threads at once for a
  // large one (parallel_cma.h). TensorPipe's cma context decides viability (same user, ptrace
  // scope); where it is not viable the pipe falls back to basic.
  if (options_.useCma) {
    int threads = options_.copyThreads;
    if (threads == 0) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
    context_->registerChannel(10, "cohort-cma", createParallelCmaChannel(threads));
  }
  listener_ = context_->listen(urls);
  std::string uvUrl = listener_->url("uv");
  std::string shmUrl = useShm_ ? listener_->url("shm") : "";

  // Rendezvous: claim the name, publish the addresses, wait for everyone.
  std::string me = std::to_string(self_.rank);
  dist::Bytes got = store_->compareSet("name/" + self_.name, {}, dist::Bytes(me.begin(), me.end()));
  std::string owner(got.begin(), got.end());
  if (owner != me) {
    throw RpcError(fmt::format("rpc::init: worker name '{}' is already taken by rank {}", self_.name, owner));
  }
  store_->set("worker/" + me, fmt::format("{}\n{}\n{}\n{}\n", self_.name, hostId_, shmUrl, uvUrl));
  std::vector<std::string> keys;
  for (int r = 0; r < worldSize_; ++r) keys.push_back(fmt::format("worker/{}", r));
  try {
    store_->wait(keys, options_.initTimeout);
  } catch (const TimeoutError& e) {
    throw RpcError(fmt::format("rpc::init: worker '{}' (rank {}) waited {} ms for the others: {}", self_.name,
                               self_.rank, options_.initTimeout.count(), e.what()));
  }
  workers_.resize(worldSize_);
  peers_.resize(worldSize_);
  for (int r = 0; r < worldSize_; ++r) {
    auto lines = splitLines(store_->getString(keys[r]));
    if (lines.size() != 4) throw RpcError(fmt::format("rpc::init: the store's record for rank {} is malformed", r));
    workers_[r] = WorkerInfo{lines[0], r};
    if (!rankOf_.emplace(lines[0], r).second) {
      throw RpcError(fmt::format("rpc::init: ranks {} and {} are both named '{}'", rankOf_[lines[0]], r, lines[0]));
    }
    peers_[r] = Peer{lines[1], lines[2], lines[3]};
  }
  startThreads();
  acceptNext();
}

std::string TensorPipeAgent::transportTo(int rank) const {
  const Peer& p = peers_.at(rank);
  return useShm_ && !p.shmUrl.empty() && p.hostId == hostId_ ? "shm" : "uv";
}

// ---- sending ---------------------------------------------------------------------------------

void TensorPipeAgent::write(const std::shared_ptr<tp::Pipe>& pipe, EncodedFrame frame,
                            std::function<void(std::string)> onError) {
  auto keep = std::make_shared<EncodedFrame>(std::move(frame));
  tp::Message msg;
  msg.payloads.push_back(tp::Message::Payload{keep->payload.data(), keep->payload.size(), ""});
  for (const auto& t : keep->tensors) {
    tp::Message::Tensor mt;
    mt.buffer = tp::CpuBuffer{t.dataPtr()};
    mt.length = t.nbytes();
    msg.tensors.push_back(std::move(mt));
  }
  pipe->write(std::move(msg), [keep, onError = std::move(onError)](const tp::Error& err) {
    if (err && onError) onError(err.what());
  });
}

std::shared_ptr<tp::Pipe> TensorPipeAgent::clientPipe(int rank) {
  std::lock_guard<std::mutex> lock(pipesMu_);
  if (closed_) return nullptr;
  auto it = clientPipes_.find(rank);
  if (it != clientPipes_.end()) return it->second;
  const Peer& p = peers_[rank];
  std::string url = transportTo(rank) == "shm" ? p.shmUrl : p.uvUrl;
  auto pipe = context_->connect(url, tp::PipeOptions().remoteName(workers_[rank].name));
  clientPipes_[rank] = pipe;
  Frame hello;
  hello.kind = FrameKind::Hello;
  hello.worker = self_.name;
  hello.message = makeHelloProof(options_.secret, self_.name, workers_[rank].name);  // not the secret itself
  // Written under the lock so that no request overtakes the hello.
  write(pipe, encodeFrame(hello), [this, rank](const std::string& why) {
    failPeer(rank, fmt::format("the connection to '{}' broke ({})", workers_[rank].name, why));
  });
  readResponses(pipe, rank);
  return pipe;
}

void TensorPipeAgent::transmit(int rank, EncodedFrame frame) {
  auto pipe = clientPipe(rank);
  if (!pipe) {
    failPeer(rank, "the agent has shut down");
    return;
  }
  write(pipe, std::move(frame), [this, rank](const std::string& why) {
    failPeer(rank, fmt::format("the connection to '{}' broke ({})", workers_[rank].name, why));
  });
}

void TensorPipeAgent::transmitRawForTesting(int rank, std::string payload) {
  EncodedFrame f;
  f.payload = std::move(payload);
  transmit(rank, std::move(f));
}

void TensorPipeAgent::readResponses(std::shared_ptr<tp::Pipe> pipe, int rank) {
  readFrame(
      pipe, rank,
      [this, pipe, rank](Frame f) {
        if (f.kind != FrameKind::Response && f.kind != FrameKind::Error) {
          failPeer(rank, fmt::format("worker '{}' sent a {} frame where responses belong", workers_[rank].name,
                                     static_cast<int>(f.kind)));
          pipe->close();
          return;
        }
        bool refused = f.kind == FrameKind::Error && f.id == 0;
        onResponse(rank, std::move(f));
        if (refused) {
          pipe->close();
          return;
        }
        readResponses(pipe, rank);
      },
      [this, rank](const std::string& why) {
        failPeer(rank, fmt::format("the connection to '{}' broke ({})", workers_[rank].name, why));
      });
}

// ---- receiving -------------------------------------------------------------------------------

void TensorPipeAgent::readFrame(const std::shared_ptr<tp::Pipe>& pipe, int from, OnFrame onFrame, OnError onError) {
  pipe->readDescriptor([this, pipe, from, onFrame = std::move(onFrame),
                        onError = std::move(onError)](const tp::Error& err, tp::Descriptor d) mutable {
    if (err) {
      onError(err.what());
      return;
    }
    auto payload = std::make_shared<std::string>();
    auto storages = std::make_shared<std::vector<std::shared_ptr<Storage>>>();
    tp::Allocation alloc;
    try {
      std::vector<size_t> lens;
      for (const auto& t : d.tensors) {
        if (t.sourceDevice.type != tp::kCpuDeviceType) throw RpcError("a tensor arrived from a non-CPU device");
        lens.push_back(t.length);
      }
      checkMessageShape(d.payloads.size(), d.payloads.empty() ? 0 : d.payloads[0].length, lens, options_.limits);
      payload->resize(d.payloads[0].length);
      alloc.payloads.push_back({payload->data()});
      for (size_t len : lens) {
        auto s = std::make_shared<Storage>(len, Device::cpu());
        alloc.tensors.push_back({tp::CpuBuffer{s->data()}});
        storages->push_back(std::move(s));
      }
    } catch (const std::exception& e) {
      onError(fmt::format("a malformed message arrived: {}", e.what()));
      return;
    }
    pipe->read(std::move(alloc), [this, from, payload, storages, onFrame = std::move(onFrame),
                                  onError = std::move(onError)](const tp::Error& err) mutable {
      if (err) {
        onError(err.what());
        return;
      }
      Frame f;
      try {
        f = decodeFrame(*payload, *storages, options_.limits, from >= 0 ? decoderFor(from) : RRefDecoder());
      } catch (const std::exception& e) {
        onError(fmt::format("a malformed message arrived: {}", e.what()));
        return;
      }
      onFrame(std::move(f));
    });
  });
}

void TensorPipeAgent::acceptNext() {
  listener_->accept([this](const tp::Error& err, std::shared_ptr<tp::Pipe> pipe) {
    if (err) {
      if (running()) COHORT_LOG(Warning, "rpc '{}': accepting a connection failed: {}", self_.name, err.what());
      return;  // the listener is closed (shutdown) or broken
    }
    serve(std::move(pipe));
    acceptNext();
  });
}

void TensorPipeAgent::dropServerPipe(const std::shared_ptr<tp::Pipe>& pipe) {
  pipe->close();
  std::lock_guard<std::mutex> lock(pipesMu_);
  serverPipes_.erase(pipe);
}

void TensorPipeAgent::serve(std::shared_ptr<tp::Pipe> pipe) {
  {
    std::lock_guard<std::mutex> lock(pipesMu_);
    if (closed_) return;
    serverPipes_.insert(pipe);
  }
  // Refuses the connection: an error frame with call id 0, then the pipe closes.
  auto refuse = [this, pipe](const std::string& why) {
    COHORT_LOG(Warning, "rpc '{}': refused a connection: {}", self_.name, why);
    write(pipe, errorFrame(0, "", why), nullptr);
    // Closing at once could drop the refusal unsent; the peer closes its end when it reads it,
    // and shutdown closes whatever is left.
  };
  readFrame(
      pipe, -1,
      [this, pipe, refuse](Frame f) {
        if (f.kind != FrameKind::Hello) {
          refuse("the first message was not a hello");
          return;
        }
        auto it = rankOf_.find(f.worker);
        if (it == rankOf_.end()) {
          refuse(fmt::format("'{}' is not a worker of this job", f.worker));
          return;
        }
        std::string why = checkHelloProof(options_.secret, f.worker, self_.name, f.message, helloGuard_);
        if (!why.empty()) {
          refuse(why);
          return;
        }
        serveRequests(pipe, it->second);
      },
      [this, pipe, refuse](const std::string& why) {
        if (why.rfind("a malformed message", 0) == 0) refuse(why);
        else dropServerPipe(pipe);
      });
}

void TensorPipeAgent::serveRequests(std::shared_ptr<tp::Pipe> pipe, int from) {
  readFrame(
      pipe, from,
      [this, pipe, from](Frame f) {
        if (f.kind != FrameKind::Request) {
          write(pipe,
                errorFrame(0, "", fmt::format("a {} frame arrived where requests belong", static_cast<int>(f.kind))),
                nullptr);
          return;
        }
        std::weak_ptr<tp::Pipe> weak = pipe;
        onRequest(from, std::move(f), [this, weak](EncodedFrame enc) {
          if (auto p = weak.lock()) write(p, std::move(enc), nullptr);
        });
        serveRequests(pipe, from);
      },
      [this, pipe, from](const std::string& why) {
        if (why.rfind("a malformed message", 0) == 0) {
          COHORT_LOG(Warning, "rpc '{}': disconnecting '{}': {}", self_.name, workers_[from].name, why);
          write(pipe, errorFrame(0, "", why), nullptr);
        } else {
          // The peer closing its end (it shut down or died) reads as an end of file; anything
          // else broke a live connection, and the peer will only see it closed: say why here.
          if (running() && why.rfind("eof", 0) != 0 && why.rfind("EOF", 0) != 0)
            COHORT_LOG(Warning, "rpc '{}': the connection from '{}' broke: {}", self_.name, workers_[from].name, why);
          dropServerPipe(pipe);
        }
      });
}

void TensorPipeAgent::closeTransport() {
  {
    std::lock_guard<std::mutex> lock(pipesMu_);
    if (closed_) return;
    closed_ = true;
  }
  if (context_) {
    context_->close();
    context_->join();
  }
  std::lock_guard<std::mutex> lock(pipesMu_);
  clientPipes_.clear();
  serverPipes_.clear();
  listener_.reset();
}

namespace {
const bool kRegistered = [] {
  registerAgentFactory("tensorpipe",
                       [](const std::string& name, int rank, int worldSize, RpcOptions options) -> AgentPtr {
                         auto a = std::make_shared<TensorPipeAgent>(name, rank, worldSize, std::move(options));
                         a->start();
                         return a;
                       });
  return true;
}();
}  // namespace

}  // namespace cohort::rpc
