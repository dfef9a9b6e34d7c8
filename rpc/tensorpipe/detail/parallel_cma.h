#pragma once

// A TensorPipe channel for CPU tensors between processes of one host, registered by the agent in
// place of TensorPipe's own "cma" channel.
//
// The protocol is cross-memory attach, as in TensorPipe's cma channel: the sender writes a
// descriptor (its pid, the tensor's address and length) on the channel's first connection, the
// receiver reads the bytes straight out of the sender's memory with process_vm_readv and answers
// with an empty completion frame on the second connection, upon which the sender's buffer is
// released. What differs is the copy: TensorPipe's cma context copies every tensor on one thread,
// and one process_vm_readv here moves ~4-5 GB/s (it pins the remote pages one by one), while two
// threads reading halves move ~8.5-9.5 GB/s. This channel splits a tensor of at least
// 2 × kMinChunkBytes into up to `copyThreads` chunks read at once by a small pool of threads.
//
// Whether two processes may use it (same boot, same pid and user namespaces, same uids, ptrace
// allowed) is decided by TensorPipe's cma context, which this one wraps for exactly that: both
// ends advertise its device descriptor, so the channel is chosen only where cma would work, and
// the pipe falls back to the next channel otherwise.
//
// Errors: a failed read (the sender died, unmapped memory) or a descriptor whose length is not the
// one the receiver expects fails that tensor's callback with an error naming the pid, and closes
// the channel so every later operation fails rather than waits.

#include <cstddef>
#include <memory>

namespace tensorpipe::channel {
class Context;
}

namespace cohort::rpc {

// A tensor is split only into chunks of at least this many bytes.
inline constexpr size_t kMinChunkBytes = size_t{1} << 20;

// `copyThreads` (1 to 64): how many threads read one tensor at once.
std::shared_ptr<tensorpipe::channel::Context> createParallelCmaChannel(int copyThreads);

// What this process has received over the channel so far, all agents together (diagnostics, and
// tests that check a tensor really took this path).
struct CmaStats {
  uint64_t tensors = 0;       // received whole
  uint64_t bytes = 0;         // in those tensors
  uint64_t splitTensors = 0;  // of them, read by more than one thread
};
CmaStats cmaStats();

}  // namespace cohort::rpc
