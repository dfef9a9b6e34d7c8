/*
 * The TCPStore wire format's building blocks, shared by the client (tcp_store.cc) and the server
 * (tcp_store_server.cc). The protocol itself is described in tcp_store.h. Everything here is
 * plain byte handling: no sockets, no threads.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/distributed/store/store.h>

namespace cohort::dist::tcp {

inline constexpr uint32_t kMagic = 0x54534843;  // the bytes "CHST" read as a little-endian u32
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kLengthSize = 4;
// A hello frame is small: the fixed fields and a token of at most kMaxTokenSize bytes.
inline constexpr size_t kMaxTokenSize = 4096;
inline constexpr size_t kMaxHelloFrame = 64 + kMaxTokenSize;

enum class Op : uint8_t {
  Hello = 1,
  Set = 2,
  Get = 3,
  Add = 4,
  CompareSet = 5,
  Check = 6,
  Delete = 7,
  NumKeys = 8,
  Wait = 9,
  Cancel = 10,
};
const char* opName(uint8_t op);
// The token of COHORT_STORE_TOKEN ("" when unset): the knob lives in tcp_store_server.cc.
std::string defaultToken();

enum class Status : uint8_t {
  Ok = 0,
  ValueError = 1,  // the request was well formed but its arguments were not (add on a non-integer)
  Refused = 2,     // the hello was refused (version, token); the server closes the connection
};

// A malformed frame: the server drops the connection, the client marks it broken.
class ProtocolError : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The largest frame a server with these limits accepts after the hello: a compareSet (one key,
// two values) or a wait/check whose keys fit in the same room.
inline size_t maxRequestFrame(size_t maxKey, size_t maxValue) { return 64 + maxKey + 2 * maxValue; }
// The largest reply: one value, or an error message.
inline size_t maxReplyFrame(size_t maxValue) { return 64 + 65536 + maxValue; }

// Builds one frame: the u32 length is filled in by finish().
class FrameWriter {
 public:
  FrameWriter() : buf_(kLengthSize, 0) {}
  FrameWriter& u8(uint8_t v) { return raw(&v, 1); }
  FrameWriter& u16(uint16_t v) { return le(v); }
  FrameWriter& u32(uint32_t v) { return le(v); }
  FrameWriter& i64(int64_t v) { return le(static_cast<uint64_t>(v)); }
  FrameWriter& str(std::string_view s) { return u32(static_cast<uint32_t>(s.size())).raw(s.data(), s.size()); }
  FrameWriter& bytes(const Bytes& b) { return u32(static_cast<uint32_t>(b.size())).raw(b.data(), b.size()); }
  FrameWriter& keys(const std::vector<std::string>& ks) {
    u32(static_cast<uint32_t>(ks.size()));
    for (const auto& k : ks) str(k);
    return *this;
  }
  size_t size() const { return buf_.size(); }
  Bytes finish() {
    uint32_t n = static_cast<uint32_t>(buf_.size() - kLengthSize);
    for (size_t i = 0; i < 4; ++i) buf_[i] = static_cast<uint8_t>(n >> (8 * i));
    return std::move(buf_);
  }

 private:
  template <typename T>
  FrameWriter& le(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  FrameWriter& raw(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  Bytes buf_;
};

inline uint32_t readLength(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Reads the fields of one frame body; every read checks the bounds and throws ProtocolError.
class FrameReader {
 public:
  FrameReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return static_cast<uint8_t>(le<uint8_t>()); }
  uint16_t u16() { return le<uint16_t>(); }
  uint32_t u32() { return le<uint32_t>(); }
  int64_t i64() { return static_cast<int64_t>(le<uint64_t>()); }
  // A string field of at most `limit` bytes; `what` names it in the error.
  std::string str(size_t limit, const char* what) {
    auto [p, n] = field(limit, what);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  Bytes bytes(size_t limit, const char* what) {
    auto [p, n] = field(limit, what);
    return Bytes(p, p + n);
  }
  std::vector<std::string> keys(size_t limit) {
    uint32_t n = u32();
    // Each key takes at least its 4-byte length: a count the frame cannot hold is a lie.
    if (n > remaining() / 4) throw ProtocolError("key count " + std::to_string(n) + " does not fit in the frame");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) out.push_back(str(limit, "key"));
    return out;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void expectEnd() const {
    if (p_ != end_) throw ProtocolError(std::to_string(remaining()) + " unexpected trailing bytes");
  }

 private:
  template <typename T>
  T le() {
    if (remaining() < sizeof(T)) throw ProtocolError("frame truncated");
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p_[i]) << (8 * i));
    p_ += sizeof(T);
    return v;
  }
  std::pair<const uint8_t*, size_t> field(size_t limit, const char* what) {
    uint32_t n = u32();
    if (n > limit)
      throw ProtocolError(std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit of " +
                          std::to_string(limit));
    if (n > remaining()) throw ProtocolError(std::string(what) + " runs past the end of the frame");
    const uint8_t* p = p_;
    p_ += n;
    return {p, n};
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace cohort::dist::tcp
