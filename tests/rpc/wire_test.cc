// The RPC wire format: every kind of value round-trips exactly (tensors of every dtype, sizes 0 and
// up, nested lists and dicts), tensors travel beside the payload without being copied into it, and
// malformed input of every kind — truncated, corrupted, random, lying about lengths — is an
// RpcError, never a crash (the ASan build checks that nothing is read out of bounds).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include <cohort/core/ops/ops.h>
#include <cohort/rpc/value.h>
#include <cohort/rpc/wire.h>

namespace cohort::rpc {
namespace {

// What the receiver would hold: the payload and one storage per message tensor.
struct Received {
  std::string payload;
  std::vector<std::shared_ptr<Storage>> tensors;
};
Received transmit(const EncodedFrame& e) {
  Received r{e.payload, {}};
  for (const auto& t : e.tensors) {
    auto s = std::make_shared<Storage>(t.nbytes(), Device::cpu());
    std::memcpy(s->data(), t.dataPtr(), t.nbytes());
    r.tensors.push_back(s);
  }
  return r;
}
Frame roundTrip(const Frame& f, const WireLimits& limits = {}) {
  Received r = transmit(encodeFrame(f, {}, limits));
  return decodeFrame(r.payload, r.tensors, limits);
}
Value roundTrip(const Value& v) {
  Frame f;
  f.body = v;
  return roundTrip(f).body;
}

Tensor sample(DType dtype, const Shape& shape) {
  Tensor t = arange(0, static_cast<double>(shapeNumel(shape)), 1, {.dtype = DType::Float64});
  return t.to(dtype).reshape(shape).contiguous();
}

TEST(RpcWire, ScalarsAndStrings) {
  for (const Value& v : {Value(), Value(true), Value(false), Value(int64_t{-7}), Value(int64_t{INT64_MIN}), Value(3.25),
                         Value(-0.0), Value(std::string()), Value(std::string("héllo\0x", 8))}) {
    EXPECT_EQ(roundTrip(v), v) << v.describe();
  }
  double nan = std::numeric_limits<double>::quiet_NaN();
  Value n = roundTrip(Value(nan));
  EXPECT_TRUE(std::isnan(n.toDouble()));
}

TEST(RpcWire, HeaderFieldsRoundTrip) {
  Frame f;
  f.kind = FrameKind::Error;
  f.op = Op::RRefFetch;
  f.id = 0xfedcba9876543210ull;
  f.function = "add";
  f.worker = "ps";
  f.message = "boom";
  Frame g = roundTrip(f);
  EXPECT_EQ(g.kind, FrameKind::Error);
  EXPECT_EQ(g.op, Op::RRefFetch);
  EXPECT_EQ(g.id, f.id);
  EXPECT_EQ(g.function, "add");
  EXPECT_EQ(g.worker, "ps");
  EXPECT_EQ(g.message, "boom");
}

TEST(RpcWire, TensorsOfEveryDTypeAndSize) {
  for (int d = 0; d < kNumDTypes; ++d) {
    DType dtype = static_cast<DType>(d);
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{3, 0, 2}, Shape{1}, Shape{5, 7}, Shape{2, 3, 4}}) {
      Tensor t = sample(dtype, shape);
      Value back = roundTrip(Value(t));
      ASSERT_EQ(back.kind(), Kind::Tensor);
      EXPECT_EQ(back.toTensor().dtype(), dtype);
      EXPECT_EQ(back.toTensor().sizes(), shape);
      EXPECT_EQ(back, Value(t)) << dtypeName(dtype) << " " << shapeStr(shape);
    }
  }
}

TEST(RpcWire, TensorBytesTravelBesideThePayloadWithoutCopies) {
  Tensor big = sample(DType::Float32, {1024, 256});
  Frame f;
  f.body = Value(List{Value(big), Value(big.slice(0, 0, 10))});
  EncodedFrame e = encodeFrame(f);
  ASSERT_EQ(e.tensors.size(), 2u);
  EXPECT_EQ(e.tensors[0].dataPtr(), big.dataPtr());  // the caller's memory itself
  EXPECT_LT(e.payload.size(), 200u);                 // only metadata in the payload
  // A non-contiguous tensor is made contiguous (the one copy) and arrives equal.
  Tensor tr = big.slice(1, 0, 8).t();
  f.body = Value(tr);
  Value back = roundTrip(f).body;
  EXPECT_EQ(back, Value(tr.contiguous()));
}

TEST(RpcWire, NestedListsAndDicts) {
  Dict inner{{"w", Value(sample(DType::BFloat16, {4}))}, {"step", Value(int64_t{3})}};
  Value v(List{Value(inner), Value(List{}), Value(Dict{}), Value(List{Value(List{Value("deep")})}),
               Value(sample(DType::Int64, {2, 2}))});
  EXPECT_EQ(roundTrip(v), v);
}

TEST(RpcWire, TypedConversions) {
  std::map<std::string, std::vector<int32_t>> m{{"a", {1, 2}}, {"b", {}}};
  EXPECT_EQ(fromValue<decltype(m)>(roundTrip(toValue(m))), m);
  std::tuple<int, std::string, double> t{4, "x", 0.5};
  EXPECT_EQ((fromValue<std::tuple<int, std::string, double>>(roundTrip(toValue(t)))), t);
  EXPECT_EQ(fromValue<std::optional<int>>(Value()), std::nullopt);
  try {
    fromValue<std::vector<int64_t>>(toValue(std::vector<std::string>{"a"}), "argument 1");
    FAIL() << "a string converted to int64";
  } catch (const RpcError& e) {
    EXPECT_STREQ(e.what(), "argument 1[0]: expected int64, got string of 1 bytes");
  }
  try {
    fromValue<int8_t>(Value(int64_t{300}), "argument 2");
    FAIL();
  } catch (const RpcError& e) {
    EXPECT_STREQ(e.what(), "argument 2: integer 300 is out of range for int8");
  }
}

// ---- malformed input -----------------------------------------------------------------------

template <typename F>
std::string decodeError(F&& decode) {
  try {
    decode();
  } catch (const RpcError& e) {
    return e.what();
  }
  return "";
}

TEST(RpcWire, EveryTruncationIsAnRpcError) {
  Frame f;
  f.function = "fn";
  f.body = Value(List{Value(Dict{{"k", Value(2.0)}}), Value("text"), Value(sample(DType::Int32, {3}))});
  Received r = transmit(encodeFrame(f));
  for (size_t n = 0; n < r.payload.size(); ++n) {
    std::string msg = decodeError([&] { decodeFrame(std::string_view(r.payload).substr(0, n), r.tensors); });
    EXPECT_NE(msg, "") << "a payload cut to " << n << " bytes decoded";
  }
  EXPECT_NE(decodeError([&] { decodeFrame(r.payload + "x", r.tensors); }).find("1 trailing bytes"), std::string::npos);
}

TEST(RpcWire, LiesAboutTensorsAreRejected) {
  Frame f;
  f.body = Value(sample(DType::Float32, {4}));
  Received r = transmit(encodeFrame(f));
  // The message tensor is shorter than the shape says.
  auto shortStorage = std::make_shared<Storage>(12, Device::cpu());
  EXPECT_NE(decodeError([&] {
              decodeFrame(r.payload, {shortStorage});
            }).find("needs 16 bytes but message tensor 0 has 12"),
            std::string::npos);
  // No tensor at all, or one too many.
  EXPECT_NE(decodeError([&] { decodeFrame(r.payload, {}); }).find("tensor index 0 but the message has 0 tensors"),
            std::string::npos);
  auto extra = r.tensors;
  extra.push_back(std::make_shared<Storage>(4, Device::cpu()));
  EXPECT_NE(decodeError([&] { decodeFrame(r.payload, extra); }).find("message tensor 1 is not referenced"),
            std::string::npos);
  // A shape whose byte count overflows.
  Frame g;
  g.body = Value(sample(DType::Float32, {2, 2}));
  std::string p = encodeFrame(g).payload;
  size_t sizesAt = p.size() - 4 - 16;  // ... sizes (2 x i64), index u32
  int64_t huge = int64_t{1} << 62;
  std::memcpy(&p[sizesAt], &huge, 8);
  std::memcpy(&p[sizesAt + 8], &huge, 8);
  EXPECT_NE(decodeError([&] {
              decodeFrame(p, {std::make_shared<Storage>(16, Device::cpu())});
            }).find("exceeds the byte limit"),
            std::string::npos);
}

// Distributed autograd's tag: the context and, per tensor that requires grad, its position among
// the body's tensors and its send id.
TEST(RpcWire, AutogradContextTagRoundTripsAndLiesAreRejected) {
  Frame f;
  f.body =
      Value(List{Value(sample(DType::Float32, {2})), Value(int64_t{3}),
                 Value(Dict{{"a", Value(sample(DType::Float32, {0}))}, {"b", Value(sample(DType::Float64, {3}))}})});
  f.context.owner = 2;
  f.context.local = 0x123456789ull;
  f.context.sends = {{0, 7}, {2, 0xffffffffffull}};
  Frame g = roundTrip(f);
  EXPECT_EQ(g.context.owner, 2);
  EXPECT_EQ(g.context.local, 0x123456789ull);
  EXPECT_EQ(g.context.sends, f.context.sends);
  EXPECT_EQ(g.body, f.body);
  EXPECT_EQ(roundTrip(Frame{}).context.owner, -1);  // none by default

  auto errorOf = [](Frame bad) {
    try {
      roundTrip(bad);
    } catch (const RpcError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Frame outOfRange = f;
  outOfRange.context.sends = {{3, 1}};  // the body has 3 tensors: positions 0..2
  EXPECT_NE(errorOf(outOfRange).find("autograd send position 3 but the body has 3 tensors"), std::string::npos);
  Frame unordered = f;
  unordered.context.sends = {{2, 1}, {0, 2}};
  EXPECT_NE(errorOf(unordered).find("out of order or repeated"), std::string::npos);
  Frame orphan = f;
  orphan.context.owner = -1;
  EXPECT_NE(errorOf(orphan).find("autograd sends without a context"), std::string::npos);
  Frame negative = f;
  negative.context.owner = -5;
  negative.context.sends.clear();
  EXPECT_NE(errorOf(negative).find("is negative"), std::string::npos);
}

TEST(RpcWire, ForgedCountsAndTagsAreRejected) {
  Frame f;
  f.body = Value(List{Value(int64_t{1})});
  std::string p = encodeFrame(f).payload;
  size_t countAt = p.size() - 4 - 1 - 8;  // list count u32, then tag + int64
  uint32_t forged = 0xffffffffu;
  std::string q = p;
  std::memcpy(&q[countAt], &forged, 4);
  EXPECT_NE(decodeError([&] { decodeFrame(q, {}); }).find("list claims 4294967295 elements"), std::string::npos);
  q = p;
  q[countAt + 4] = 42;  // the element's tag
  EXPECT_NE(decodeError([&] { decodeFrame(q, {}); }).find("unknown value tag 42"), std::string::npos);
  q = p;
  q[0] = 'X';
  EXPECT_NE(decodeError([&] { decodeFrame(q, {}); }).find("bad magic"), std::string::npos);
  // An rref where no decoder accepts one.
  Frame r;
  r.body = Value();
  std::string s = encodeFrame(r).payload;
  s.back() = static_cast<char>(Kind::RRef);
  s += std::string(4 + 4 + 8 + 1 + 4, '\0');
  EXPECT_NE(decodeError([&] { decodeFrame(s, {}); }).find("an rref arrived where none is accepted"), std::string::npos);
}

TEST(RpcWire, DepthAndSizeLimits) {
  Value deep;
  for (int i = 0; i < 100; ++i) deep = Value(List{deep});
  Frame f;
  f.body = deep;
  EXPECT_THROW(encodeFrame(f), RpcError);
  WireLimits loose;
  loose.maxDepth = 1000;
  Received r = transmit(encodeFrame(f, {}, loose));
  EXPECT_NE(decodeError([&] { decodeFrame(r.payload, r.tensors); }).find("nests deeper than the limit of 64"),
            std::string::npos);
  WireLimits small;
  small.maxPayloadBytes = 64;
  f.body = Value(std::string(100, 'x'));
  EXPECT_NE(decodeError([&] { encodeFrame(f, {}, small); }).find("exceeds the payload limit of 64 bytes"),
            std::string::npos);
  EXPECT_THROW(checkMessageShape(1, 65, {}, small), RpcError);
  EXPECT_THROW(checkMessageShape(2, 10, {}, small), RpcError);
  EXPECT_THROW(checkMessageShape(1, 10, {0}, small), RpcError);
  small.maxTensorBytes = 100;
  EXPECT_THROW(checkMessageShape(1, 10, {60, 41}, small), RpcError);
  EXPECT_NO_THROW(checkMessageShape(1, 10, {60, 40}, small));
}

TEST(RpcWire, RandomCorruptionNeverCrashes) {
  Frame f;
  f.function = "train_step";
  f.body = Value(List{Value(Dict{{"a", Value(sample(DType::Float16, {3, 3}))}, {"b", Value(List{Value(true)})}}),
                      Value(sample(DType::UInt8, {5})), Value("xyz"), Value(1.5)});
  Received r = transmit(encodeFrame(f));
  std::mt19937_64 rng(1234);
  int rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string p = r.payload;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) p[rng() % p.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) p.resize(rng() % p.size());
    try {
      decodeFrame(p, r.tensors);
    } catch (const RpcError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  // Pure noise.
  for (int iter = 0; iter < 5000; ++iter) {
    std::string p(rng() % 128, '\0');
    for (auto& c : p) c = static_cast<char>(rng());
    if (p.size() >= 4) std::memcpy(p.data(), "CRPC", 4);
    if (p.size() >= 5) p[4] = kWireVersion;
    EXPECT_NE(decodeError([&] { decodeFrame(p, {}); }), "") << "noise decoded";
  }
}

}  // namespace
}  // namespace cohort::rpc
