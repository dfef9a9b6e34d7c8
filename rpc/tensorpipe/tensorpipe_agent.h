/*
 * The TensorPipe agent: RpcAgent's transport over TensorPipe (Debian's libtensorpipe).
 *
 * At start it listens on the shm transport (same host) and the uv transport (TCP), publishes its
 * name and addresses in the store under "worker/<rank>" (a name may be claimed once: "name/<n>"),
 * and waits for every worker's record. Each worker opens one pipe to each peer it calls, lazily, on
 * the first call, and reuses it for all later requests; the peer answers on the same pipe. The
 * first message on a pipe is a hello with the caller's name and the shared secret: a peer that
 * names no worker of the job or presents another secret is answered with a refusal and
 * disconnected. Peers on the same host and network namespace use shm, others uv.
 *
 * Messages: payload 0 is the encoded frame (wire.h); each tensor is a TensorPipe tensor handed
 * over from the tensor's own memory (sender) and read into the storage of the tensor it becomes
 * (receiver). Before allocating, the receiver checks the descriptor against the limits; a peer
 * that sends something malformed is answered with an error and disconnected, and the agent goes
 * on serving everyone else.
 *
 * Threads: TensorPipe's loop threads run the read/write callbacks (they decode and do the RRef
 * counting that must keep arrival order, then hand work to the agent's pool). transmit() may be
 * called from any thread.
 */
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <cohort/rpc/agent.h>
#include <cohort/rpc/hello_auth.h>

namespace tensorpipe {
class Context;
class Listener;
class Pipe;
}  // namespace tensorpipe

namespace cohort::rpc {

class TensorPipeAgent : public RpcAgent {
 public:
  TensorPipeAgent(const std::string& name, int rank, int worldSize, RpcOptions options);
  ~TensorPipeAgent() override;

  // Listens, publishes this worker's addresses and waits for all workers (up to initTimeout).
  void start();

  // The transport a peer is reached with ("shm" or "uv"), for tests and logs.
  std::string transportTo(int rank) const;
  // Sends raw bytes as a message on the pipe to `rank`, bypassing the encoder: for tests of how a
  // peer treats malformed input.
  void transmitRawForTesting(int rank, std::string payload);

 protected:
  void transmit(int rank, EncodedFrame frame) override;
  void closeTransport() override;

 private:
  struct Peer {
    std::string hostId;
    std::string shmUrl;
    std::string uvUrl;
  };
  std::shared_ptr<tensorpipe::Pipe> clientPipe(int rank);
  void write(const std::shared_ptr<tensorpipe::Pipe>& pipe, EncodedFrame frame,
             std::function<void(std::string)> onError);
  using OnFrame = std::function<void(Frame)>;
  using OnError = std::function<void(const std::string&)>;
  // Reads one message from `pipe` (decoding rrefs as coming from `from`, -1 before the hello).
  void readFrame(const std::shared_ptr<tensorpipe::Pipe>& pipe, int from, OnFrame onFrame, OnError onError);
  void acceptNext();
  void serve(std::shared_ptr<tensorpipe::Pipe> pipe);
  void serveRequests(std::shared_ptr<tensorpipe::Pipe> pipe, int from);
  void readResponses(std::shared_ptr<tensorpipe::Pipe> pipe, int rank);
  void dropServerPipe(const std::shared_ptr<tensorpipe::Pipe>& pipe);

  std::shared_ptr<tensorpipe::Context> context_;
  std::shared_ptr<tensorpipe::Listener> listener_;
  std::string hostId_;
  bool useShm_ = true;           // RpcOptions::useShm, unless COHORT_RPC_SHM overrides it
  HelloReplayGuard helloGuard_;  // nonces of the hellos accepted lately (hello_auth.h)
  std::vector<Peer> peers_;
  mutable std::mutex pipesMu_;
  std::map<int, std::shared_ptr<tensorpipe::Pipe>> clientPipes_;
  std::set<std::shared_ptr<tensorpipe::Pipe>> serverPipes_;
  bool closed_ = false;
};

}  // namespace cohort::rpc
