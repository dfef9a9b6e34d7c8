/*
 * The RPC wire format: how a Frame (a request, response, error or hello) becomes one byte payload
 * plus a list of tensors, and back. The agent hands the payload and the tensors to TensorPipe as
 * one message: tensor bytes are never copied into the payload (a non-contiguous tensor is made
 * contiguous first; nothing else is copied), and the receiver reads each tensor straight into the
 * storage of the tensor it will become.
 *
 * Payload layout (little-endian): "CRPC" magic, version u8, kind u8, op u8, id u64, then the
 * strings function, worker, message (u32 length + bytes each), the context tag (owner i32,
 * number u64, send count u32, then per send: tensor position u32, send id u64), then the body
 * value tree:
 *   tag u8 = Kind; bool u8 (0/1); int i64; double f64; string u32 len + bytes;
 *   tensor: dtype u8, ndim u8, sizes i64 x ndim, tensor index u32 (0xffffffff: no bytes, numel 0);
 *   list: u32 count + items; dict: u32 count + (u32 len + key, value) in strictly increasing key order;
 *   rref: owner i32, creator i32, local id u64, counted u8, type name (u32 len + bytes).
 *
 * Decoding trusts nothing: every length is checked against what is left and against WireLimits,
 * every tag, dtype and bool byte is checked, each tensor of the message is referenced exactly
 * once with a byte length equal to numel x element size, nesting is bounded, the context tag's
 * positions are increasing and name tensors of the body (none without a context), and trailing bytes
 * are an error. Malformed input of any kind throws RpcError saying what was wrong and where; it
 * never reads out of bounds or allocates more than the limits allow.
 *
 * Threads: pure functions, callable from any thread.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/core/tensor/storage.h>
#include <cohort/core/tensor/tensor.h>
#include <cohort/rpc/value.h>

namespace cohort::rpc {

inline constexpr uint8_t kWireVersion = 2;
inline constexpr uint32_t kNoTensorBytes = 0xffffffffu;

enum class FrameKind : uint8_t { Hello = 1, Request = 2, Response = 3, Error = 4 };
// What a request asks for: a registered function, or one of the agent's own RRef operations.
enum class Op : uint8_t { Call = 0, RRefCreate, RRefFetch, RRefCall, RRefAddRef, RRefDecRef, Barrier, Autograd };
const char* opName(Op op);

// Distributed autograd's part of a request or response (rpc/autograd.h): the context it was sent
// in (owner -1: none) and, for each tensor of the body that requires grad, its position among the
// body's tensors (in encoding order, counting every tensor) and the id of the send recorded for it.
struct ContextTag {
  int32_t owner = -1;
  uint64_t local = 0;
  std::vector<std::pair<uint32_t, uint64_t>> sends;  // strictly increasing positions
};

struct Frame {
  FrameKind kind = FrameKind::Request;
  Op op = Op::Call;
  uint64_t id = 0;
  std::string function;  // Request: the function; Error: the function that failed
  std::string worker;    // Hello: the sender's name; Error: the worker that raised
  std::string message;   // Error: what went wrong; Hello: proof of the shared secret (hello_auth.h)
  Value body;            // Request: the arguments (a list); Response: the result
  ContextTag context;    // Request, Response: distributed autograd's context and sends
};

// Limits a receiver enforces before it allocates anything.
struct WireLimits {
  size_t maxPayloadBytes = size_t{256} << 20;  // the encoded tree (strings, lists, metadata)
  size_t maxTensorBytes = size_t{4} << 30;     // all tensors of one message together
  size_t maxTensors = 65536;
  int maxDepth = 64;  // nesting of lists, dicts
  int maxDims = 16;
};

// How an RRef travels: its identity, and whether the sender already counted the receiver's
// reference at the owner (rref.h explains the protocol).
struct RRefWire {
  int32_t owner = -1;
  int32_t creator = -1;
  uint64_t local = 0;
  bool counted = false;
  std::string typeName;
};
using RRefEncoder = std::function<RRefWire(const std::shared_ptr<RRefHandle>&)>;
using RRefDecoder = std::function<std::shared_ptr<RRefHandle>(const RRefWire&)>;

struct EncodedFrame {
  std::string payload;
  std::vector<Tensor> tensors;  // contiguous CPU tensors with nbytes() > 0, in index order
};

// Throws RpcError for values that cannot travel (a CUDA tensor, a tree deeper than the limits,
// a string over 4 GiB, an rref without an encoder).
EncodedFrame encodeFrame(const Frame& frame, const RRefEncoder& rrefs = {}, const WireLimits& limits = {});

// Checks a message's shape before anything is allocated: one payload within the limit, tensor
// count and lengths (each > 0) within the limits.
void checkMessageShape(size_t numPayloads, size_t payloadBytes, const std::vector<size_t>& tensorBytes,
                       const WireLimits& limits);

// `tensors` hold the received bytes of each message tensor (their nbytes are the lengths).
Frame decodeFrame(std::string_view payload, const std::vector<std::shared_ptr<Storage>>& tensors,
                  const WireLimits& limits = {}, const RRefDecoder& rrefs = {});

}  // namespace cohort::rpc
