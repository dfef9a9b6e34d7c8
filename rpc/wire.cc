#include <cohort/rpc/wire.h>

#include <cstring>
#include <limits>

namespace cohort::rpc {

const char* opName(Op op) {
  switch (op) {
    case Op::Call: return "call";
    case Op::RRefCreate: return "rref create";
    case Op::RRefFetch: return "rref fetch";
    case Op::RRefCall: return "rref call";
    case Op::RRefAddRef: return "rref addref";
    case Op::RRefDecRef: return "rref decref";
    case Op::Barrier: return "barrier";
    case Op::Autograd: return "autograd";
  }
  return "unknown op";
}

namespace {

constexpr char kMagic[4] = {'C', 'R', 'P', 'C'};

class Writer {
 public:
  Writer(const RRefEncoder& rrefs, const WireLimits& limits, EncodedFrame& out)
      : rrefs_(rrefs), limits_(limits), out_(out) {}

  template <typename T>
  void pod(T v) {
    out_.payload.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    if (s.size() > std::numeric_limits<uint32_t>::max()) {
      throw RpcError(fmt::format("a string of {} bytes is too long to send", s.size()));
    }
    pod<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.payload.append(s);
  }
  void value(const Value& v, int depth) {
    if (depth > limits_.maxDepth) {
      throw RpcError(fmt::format("value nests deeper than the limit of {}", limits_.maxDepth));
    }
    pod<uint8_t>(static_cast<uint8_t>(v.kind()));
    switch (v.kind()) {
      case Kind::None: break;
      case Kind::Bool: pod<uint8_t>(v.toBool() ? 1 : 0); break;
      case Kind::Int: pod<int64_t>(v.toInt()); break;
      case Kind::Double: pod<double>(v.toDouble()); break;
      case Kind::String: str(v.toStr()); break;
      case Kind::Tensor: tensor(v.toTensor()); break;
      case Kind::List: {
        const List& l = v.toList();
        count(l.size());
        for (const auto& x : l) value(x, depth + 1);
        break;
      }
      case Kind::Dict: {
        const Dict& d = v.toDict();
        count(d.size());
        for (const auto& [k, x] : d) {
          str(k);
          value(x, depth + 1);
        }
        break;
      }
      case Kind::RRef: {
        if (!rrefs_) throw RpcError("an rref cannot be sent here (no agent to count it)");
        RRefWire w = rrefs_(v.toRRef());
        pod<int32_t>(w.owner);
        pod<int32_t>(w.creator);
        pod<uint64_t>(w.local);
        pod<uint8_t>(w.counted ? 1 : 0);
        str(w.typeName);
        break;
      }
    }
  }

 private:
  void count(size_t n) {
    if (n > std::numeric_limits<uint32_t>::max())
      throw RpcError(fmt::format("a container of {} elements is too large to send", n));
    pod<uint32_t>(static_cast<uint32_t>(n));
  }
  void tensor(const Tensor& t) {
    if (!t.defined()) throw RpcError("an undefined tensor cannot be sent");
    if (!t.device().isCpu())
      throw RpcError(fmt::format("only CPU tensors can be sent, got one on {}", t.device().str()));
    if (t.dim() > limits_.maxDims)
      throw RpcError(fmt::format("a tensor of {} dims exceeds the limit of {}", t.dim(), limits_.maxDims));
    pod<uint8_t>(static_cast<uint8_t>(t.dtype()));
    pod<uint8_t>(static_cast<uint8_t>(t.dim()));
    for (int64_t s : t.sizes()) pod<int64_t>(s);
    if (t.nbytes() == 0) {
      pod<uint32_t>(kNoTensorBytes);
      return;
    }
    pod<uint32_t>(static_cast<uint32_t>(out_.tensors.size()));
    out_.tensors.push_back(t.contiguous());
  }

  const RRefEncoder& rrefs_;
  const WireLimits& limits_;
  EncodedFrame& out_;
};

class Reader {
 public:
  Reader(std::string_view in, const std::vector<std::shared_ptr<Storage>>& tensors, const WireLimits& limits,
         const RRefDecoder& rrefs)
      : in_(in), tensors_(tensors), used_(tensors.size(), false), limits_(limits), rrefs_(rrefs) {}

  template <typename T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    uint32_t n = pod<uint32_t>(what);
    need(n, what);
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  Value value(int depth) {
    if (depth > limits_.maxDepth) fail(fmt::format("value nests deeper than the limit of {}", limits_.maxDepth));
    uint8_t tag = pod<uint8_t>("a value tag");
    switch (static_cast<Kind>(tag)) {
      case Kind::None: return Value();
      case Kind::Bool: {
        uint8_t b = pod<uint8_t>("a bool");
        if (b > 1) fail(fmt::format("bool byte {} is neither 0 nor 1", b));
        return Value(b == 1);
      }
      case Kind::Int: return Value(pod<int64_t>("an int64"));
      case Kind::Double: return Value(pod<double>("a double"));
      case Kind::String: return Value(str("a string"));
      case Kind::Tensor: ++tensorValues_; return Value(tensor());
      case Kind::List: {
        uint32_t n = pod<uint32_t>("a list length");
        // Every element takes at least its tag byte: a count beyond what is left is a lie, and
        // checking it first keeps a forged count from reserving gigabytes.
        if (n > remaining()) fail(fmt::format("list claims {} elements but only {} bytes are left", n, remaining()));
        List l;
        l.reserve(n);
        for (uint32_t i = 0; i < n; ++i) l.push_back(value(depth + 1));
        return Value(std::move(l));
      }
      case Kind::Dict: {
        uint32_t n = pod<uint32_t>("a dict length");
        if (n > remaining() / 5) fail(fmt::format("dict claims {} entries but only {} bytes are left", n, remaining()));
        Dict d;
        const std::string* prev = nullptr;
        for (uint32_t i = 0; i < n; ++i) {
          std::string k = str("a dict key");
          if (prev && !(*prev < k)) fail(fmt::format("dict key \"{}\" is out of order or repeated", k));
          auto it = d.emplace_hint(d.end(), std::move(k), Value());
          it->second = value(depth + 1);
          prev = &it->first;
        }
        return Value(std::move(d));
      }
      case Kind::RRef: {
        RRefWire w;
        w.owner = pod<int32_t>("an rref owner");
        w.creator = pod<int32_t>("an rref creator");
        w.local = pod<uint64_t>("an rref id");
        uint8_t c = pod<uint8_t>("an rref flag");
        if (c > 1) fail(fmt::format("rref flag byte {} is neither 0 nor 1", c));
        w.counted = c == 1;
        w.typeName = str("an rref type name");
        if (w.owner < 0 || w.creator < 0) fail(fmt::format("rref names negative ranks ({}, {})", w.owner, w.creator));
        if (!rrefs_) fail("an rref arrived where none is accepted");
        return Value(rrefs_(w));
      }
    }
    fail(fmt::format("unknown value tag {}", tag));
  }
  void finish() {
    if (pos_ != in_.size()) fail(fmt::format("{} trailing bytes after the frame", in_.size() - pos_));
    for (size_t i = 0; i < used_.size(); ++i) {
      if (!used_[i]) fail(fmt::format("message tensor {} is not referenced by the frame", i));
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw RpcError(fmt::format("malformed RPC frame at byte {}: {}", pos_, why));
  }

  size_t remainingBytes() const { return remaining(); }
  uint32_t tensorValues() const { return tensorValues_; }

 private:
  size_t remaining() const { return in_.size() - pos_; }
  void need(size_t n, const char* what) {
    if (n > remaining()) fail(fmt::format("truncated: {} needs {} bytes, {} left", what, n, remaining()));
  }
  Tensor tensor() {
    uint8_t dt = pod<uint8_t>("a tensor dtype");
    if (dt >= kNumDTypes) fail(fmt::format("unknown dtype {}", dt));
    DType dtype = static_cast<DType>(dt);
    uint8_t ndim = pod<uint8_t>("a tensor rank");
    if (ndim > limits_.maxDims) fail(fmt::format("a tensor of {} dims exceeds the limit of {}", ndim, limits_.maxDims));
    Shape sizes(ndim);
    // numel, guarded against overflow: any product beyond the byte limit is rejected.
    uint64_t numel = 1;
    bool overflow = false;
    for (auto& s : sizes) {
      s = pod<int64_t>("a tensor size");
      if (s < 0) fail(fmt::format("negative tensor size {}", s));
      if (s != 0 && numel > limits_.maxTensorBytes / static_cast<uint64_t>(s)) overflow = true;
      numel *= static_cast<uint64_t>(s);
    }
    uint32_t index = pod<uint32_t>("a tensor index");
    if (index == kNoTensorBytes) {
      // Zero sizes make numel 0 even after an "overflowing" product.
      if (numel != 0) fail(fmt::format("tensor {} has elements but no bytes", shapeStr(sizes)));
      return Tensor(std::make_shared<TensorImpl>(std::make_shared<Storage>(0, Device::cpu()), 0, sizes,
                                                 contiguousStrides(sizes), dtype));
    }
    if (overflow) fail(fmt::format("tensor {} exceeds the byte limit", shapeStr(sizes)));
    if (index >= tensors_.size())
      fail(fmt::format("tensor index {} but the message has {} tensors", index, tensors_.size()));
    if (used_[index]) fail(fmt::format("message tensor {} is referenced twice", index));
    used_[index] = true;
    const auto& storage = tensors_[index];
    uint64_t bytes = numel * elementSize(dtype);
    if (storage->nbytes() != bytes) {
      fail(fmt::format("tensor {} {} needs {} bytes but message tensor {} has {}", dtype, shapeStr(sizes), bytes, index,
                       storage->nbytes()));
    }
    return Tensor(std::make_shared<TensorImpl>(storage, 0, sizes, contiguousStrides(sizes), dtype));
  }

  std::string_view in_;
  size_t pos_ = 0;
  uint32_t tensorValues_ = 0;
  const std::vector<std::shared_ptr<Storage>>& tensors_;
  std::vector<bool> used_;
  const WireLimits& limits_;
  const RRefDecoder& rrefs_;
};

}  // namespace

EncodedFrame encodeFrame(const Frame& frame, const RRefEncoder& rrefs, const WireLimits& limits) {
  EncodedFrame out;
  Writer w(rrefs, limits, out);
  out.payload.append(kMagic, 4);
  w.pod<uint8_t>(kWireVersion);
  w.pod<uint8_t>(static_cast<uint8_t>(frame.kind));
  w.pod<uint8_t>(static_cast<uint8_t>(frame.op));
  w.pod<uint64_t>(frame.id);
  w.str(frame.function);
  w.str(frame.worker);
  w.str(frame.message);
  w.pod<int32_t>(frame.context.owner);
  w.pod<uint64_t>(frame.context.local);
  if (frame.context.sends.size() > std::numeric_limits<uint32_t>::max()) throw RpcError("too many autograd sends");
  w.pod<uint32_t>(static_cast<uint32_t>(frame.context.sends.size()));
  for (const auto& [pos, id] : frame.context.sends) {
    w.pod<uint32_t>(pos);
    w.pod<uint64_t>(id);
  }
  w.value(frame.body, 0);
  if (out.payload.size() > limits.maxPayloadBytes) {
    throw RpcError(fmt::format("the encoded message ({} bytes) exceeds the payload limit of {} bytes",
                               out.payload.size(), limits.maxPayloadBytes));
  }
  size_t total = 0;
  for (const auto& t : out.tensors) total += t.nbytes();
  if (total > limits.maxTensorBytes || out.tensors.size() > limits.maxTensors) {
    throw RpcError(fmt::format("the message's {} tensors ({} bytes) exceed the limits ({} tensors, {} bytes)",
                               out.tensors.size(), total, limits.maxTensors, limits.maxTensorBytes));
  }
  return out;
}

void checkMessageShape(size_t numPayloads, size_t payloadBytes, const std::vector<size_t>& tensorBytes,
                       const WireLimits& limits) {
  if (numPayloads != 1) throw RpcError(fmt::format("malformed RPC message: {} payloads, expected 1", numPayloads));
  if (payloadBytes > limits.maxPayloadBytes) {
    throw RpcError(fmt::format("RPC message payload of {} bytes exceeds the limit of {} bytes", payloadBytes,
                               limits.maxPayloadBytes));
  }
  if (tensorBytes.size() > limits.maxTensors) {
    throw RpcError(
        fmt::format("RPC message with {} tensors exceeds the limit of {}", tensorBytes.size(), limits.maxTensors));
  }
  size_t total = 0;
  for (size_t i = 0; i < tensorBytes.size(); ++i) {
    if (tensorBytes[i] == 0) throw RpcError(fmt::format("malformed RPC message: tensor {} has 0 bytes", i));
    if (tensorBytes[i] > limits.maxTensorBytes - total) {
      throw RpcError(fmt::format("RPC message tensors exceed the limit of {} bytes", limits.maxTensorBytes));
    }
    total += tensorBytes[i];
  }
}

Frame decodeFrame(std::string_view payload, const std::vector<std::shared_ptr<Storage>>& tensors,
                  const WireLimits& limits, const RRefDecoder& rrefs) {
  if (payload.size() > limits.maxPayloadBytes) {
    throw RpcError(fmt::format("RPC message payload of {} bytes exceeds the limit of {} bytes", payload.size(),
                               limits.maxPayloadBytes));
  }
  Reader r(payload, tensors, limits, rrefs);
  char magic[4];
  for (char& c : magic) c = static_cast<char>(r.pod<uint8_t>("the magic"));
  if (std::memcmp(magic, kMagic, 4) != 0) r.fail("bad magic (not a cohort RPC frame)");
  uint8_t version = r.pod<uint8_t>("the version");
  if (version != kWireVersion) r.fail(fmt::format("wire version {}, this build speaks {}", version, kWireVersion));
  Frame f;
  uint8_t kind = r.pod<uint8_t>("the frame kind");
  if (kind < 1 || kind > 4) r.fail(fmt::format("unknown frame kind {}", kind));
  f.kind = static_cast<FrameKind>(kind);
  uint8_t op = r.pod<uint8_t>("the op");
  if (op > static_cast<uint8_t>(Op::Autograd)) r.fail(fmt::format("unknown op {}", op));
  f.op = static_cast<Op>(op);
  f.id = r.pod<uint64_t>("the call id");
  f.function = r.str("the function name");
  f.worker = r.str("the worker name");
  f.message = r.str("the message");
  f.context.owner = r.pod<int32_t>("the autograd context owner");
  f.context.local = r.pod<uint64_t>("the autograd context number");
  if (f.context.owner < -1) r.fail(fmt::format("autograd context owner {} is negative", f.context.owner));
  uint32_t sends = r.pod<uint32_t>("the autograd send count");
  if (sends > 0 && f.context.owner < 0) r.fail("autograd sends without a context");
  // Each send takes 12 bytes: a count beyond what is left is a lie.
  if (sends > r.remainingBytes() / 12)
    r.fail(fmt::format("{} autograd sends claimed but only {} bytes are left", sends, r.remainingBytes()));
  f.context.sends.reserve(sends);
  for (uint32_t i = 0; i < sends; ++i) {
    uint32_t pos = r.pod<uint32_t>("an autograd send position");
    uint64_t id = r.pod<uint64_t>("an autograd send id");
    if (!f.context.sends.empty() && pos <= f.context.sends.back().first)
      r.fail(fmt::format("autograd send position {} is out of order or repeated", pos));
    f.context.sends.emplace_back(pos, id);
  }
  f.body = r.value(0);
  if (!f.context.sends.empty() && f.context.sends.back().first >= r.tensorValues())
    r.fail(fmt::format("autograd send position {} but the body has {} tensors", f.context.sends.back().first,
                       r.tensorValues()));
  r.finish();
  return f;
}

}  // namespace cohort::rpc
