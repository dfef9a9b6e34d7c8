// Elementwise ops on a GPU against the CPU on the same inputs: unary math and activations, ops with
// scalars, binary arithmetic, comparisons, where, maximum/minimum, pow, clamp, the backward
// formulas, the in-place members, copy_/clone/contiguous/to(dtype), fill_ and the factories,
// item(). Every floating dtype (and the integer ones where the op takes them), contiguous,
// transposed, sliced and broadcast operands, empty and 0-dim tensors.
//
// Bit-identical (same value, same sign of zero, NaN where the CPU has NaN: NaN payloads differ
// between x86 and the GPU) where the kernel does the CPU's IEEE operations in the CPU's order:
// + - * /, sqrt, comparisons, copies and casts, fill, relu, abs, clamp, where, maximum/minimum,
// the in-place updates. The transcendentals (exp, log, tanh, erf, pow) come from CUDA's libdevice
// on the GPU and from vec_math.h on the CPU: within a few ulp of each other, checked against a
// tolerance of a few ulp of the dtype. The tests that need a GPU skip without one; the last one
// runs anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cohort/config.h>
#include <cohort/core/ops/dispatch.h>

#include "core/cuda/cuda_test_util.h"
#include "core/test_util.h"

namespace cohort {
namespace {

using testing::kFloatTypes;
using testing::values;
const std::vector<DType> kIntTypes = {DType::Int64, DType::Int32, DType::UInt8};
const std::vector<DType> kAllTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                      DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};

Tensor cuda(const Tensor& t) { return t.to(Device::cuda()); }

std::string name(DType dt, const std::string& what) { return fmt::format("{} {}", dt, what); }

// Bit-identical up to NaN payloads: floating values compared as float64 bits (exact for every
// floating dtype, so -0 and 0 differ), NaN matching any NaN; integers and bools by value.
void expectSame(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_TRUE(got.device().isCuda()) << what << ": the result is on " << fmt::format("{}", got.device());
  const bool fl = isFloating(want.dtype());
  const DType wide = fl ? DType::Float64 : DType::Int64;
  Tensor g = got.to(Device::cpu()).to(wide).contiguous(), w = want.to(wide).contiguous();
  for (int64_t i = 0; i < w.numel(); ++i) {
    bool same;
    double gv, wv;
    if (fl) {
      gv = g.data<double>()[i];
      wv = w.data<double>()[i];
      same = (std::isnan(gv) && std::isnan(wv)) || std::memcmp(&gv, &wv, sizeof(double)) == 0;
    } else {
      gv = static_cast<double>(g.data<int64_t>()[i]);
      wv = static_cast<double>(w.data<int64_t>()[i]);
      same = g.data<int64_t>()[i] == w.data<int64_t>()[i];
    }
    if (!same) {
      ADD_FAILURE() << what << ": first difference at flat index " << i << " of " << w.numel() << ": got " << gv
                    << ", want " << wv;
      return;
    }
  }
}

// Within atol + rtol |want| of the CPU's result, rtol a few ulp of the dtype (the transcendentals);
// equal values (infinities included) and NaN against NaN pass. Prints the worst element.
void expectUlps(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_TRUE(got.device().isCuda()) << what;
  double atol = 0, rtol = 0;
  switch (want.dtype()) {
    case DType::Float64: atol = 1e-13, rtol = 1e-12; break;
    case DType::Float32: atol = 1e-6, rtol = 1e-5; break;
    case DType::Float16: atol = 1e-5, rtol = 2e-3; break;
    case DType::BFloat16: atol = 1e-4, rtol = 1.6e-2; break;
    default: expectSame(got, want, what); return;
  }
  testing::expectClose(got, want, atol, rtol, what);
}

void check(bool exact, const Tensor& got, const Tensor& want, const std::string& what) {
  if (exact) expectSame(got, want, what);
  else expectUlps(got, want, what);
}

// One operand in each layout the kernels distinguish: the CPU tensor and its CUDA twin (same
// strides: a transposed CPU tensor is compared with the same view on the GPU).
struct Case {
  std::string layout;
  Tensor cpu, gpu;
};

std::vector<Case> unaryCases(DType dt, double lo = -4, double hi = 4) {
  std::vector<Case> cs;
  Tensor c = values({6, 7}, dt, 1, lo, hi);
  cs.push_back({"contiguous", c, cuda(c)});
  Tensor t = values({7, 6}, dt, 2, lo, hi);
  cs.push_back({"transposed", t.t(), cuda(t).t()});
  Tensor s = values({6, 14}, dt, 3, lo, hi);
  cs.push_back({"sliced", s.slice(1, 0, 14, 2), cuda(s).slice(1, 0, 14, 2)});
  Tensor e = values({1, 7}, dt, 4, lo, hi);
  cs.push_back({"expanded", e.expand({6, 7}), cuda(e).expand({6, 7})});
  Tensor z = values({0, 7}, dt, 5, lo, hi);
  cs.push_back({"empty", z, cuda(z)});
  Tensor sc = values({}, dt, 6, lo, hi);
  cs.push_back({"0-dim", sc, cuda(sc)});
  Tensor big = values({3, 5, 4, 9}, dt, 7, lo, hi);
  cs.push_back({"4-d permuted", big.permute({2, 0, 3, 1}), cuda(big).permute({2, 0, 3, 1})});
  return cs;
}

// Pairs of operands: same shape, transposed, broadcast both ways, a 0-dim operand, empty.
struct Pair {
  std::string layout;
  Tensor a, b, ga, gb;
};

std::vector<Pair> binaryCases(DType dt, uint64_t seed = 11, double lo = -4, double hi = 4) {
  std::vector<Pair> ps;
  auto add = [&](const std::string& l, const Tensor& a, const Tensor& b) { ps.push_back({l, a, b, cuda(a), cuda(b)}); };
  add("contiguous", values({6, 7}, dt, seed, lo, hi), values({6, 7}, dt, seed + 1, lo, hi));
  add("row broadcast", values({6, 7}, dt, seed + 2, lo, hi), values({7}, dt, seed + 3, lo, hi));
  add("column broadcast", values({6, 1}, dt, seed + 4, lo, hi), values({1, 7}, dt, seed + 5, lo, hi));
  add("0-dim operand", values({5, 3}, dt, seed + 6, lo, hi), values({}, dt, seed + 7, lo, hi));
  add("empty", values({0, 3}, dt, seed + 8, lo, hi), values({0, 3}, dt, seed + 9, lo, hi));
  add("both 0-dim", values({}, dt, seed + 10, lo, hi), values({}, dt, seed + 11, lo, hi));
  Tensor t = values({7, 6}, dt, seed + 12, lo, hi), u = values({6, 7}, dt, seed + 13, lo, hi);
  ps.push_back({"transposed", t.t(), u, cuda(t).t(), cuda(u)});
  return ps;
}

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

struct UnaryOp {
  std::string name;
  Unary f;
  bool exact;
  bool ints;       // also for integer dtypes
  double lo = -4;  // input range
  double hi = 4;
};

// ---- unary ops ---------------------------------------------------------------------------------------

TEST(CudaElementwise, UnaryOpsEveryDtypeAndLayout) {
  COHORT_REQUIRE_GPU();
  const std::vector<UnaryOp> ops = {
      {"neg", [](const Tensor& x) { return neg(x); }, true, true},
      {"abs", [](const Tensor& x) { return abs(x); }, true, true},
      {"relu", [](const Tensor& x) { return relu(x); }, true, true},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, true, false, 0, 9},
      {"sqrt of negatives (NaN)", [](const Tensor& x) { return sqrt(x); }, true, false},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true, false, 0.01, 9},
      {"exp", [](const Tensor& x) { return exp(x); }, false, true},
      {"exp wide", [](const Tensor& x) { return exp(x); }, false, false, -100, 100},
      {"log", [](const Tensor& x) { return log(x); }, false, true, 0.001, 100},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false, true, -20, 20},
      {"tanh", [](const Tensor& x) { return tanh(x); }, false, true},
      {"silu", [](const Tensor& x) { return silu(x); }, false, true},
      {"gelu", [](const Tensor& x) { return gelu(x); }, false, true},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, true); }, false, true},
      {"add scalar", [](const Tensor& x) { return add(x, Scalar(3)); }, true, true},
      {"add float scalar", [](const Tensor& x) { return add(x, Scalar(0.3)); }, true, true},
      {"mul scalar", [](const Tensor& x) { return mul(x, Scalar(-1.7)); }, true, true},
      {"mul int scalar", [](const Tensor& x) { return mul(x, Scalar(3)); }, true, true},
      {"div scalar", [](const Tensor& x) { return div(x, Scalar(0.7)); }, true, true},
      {"rsub scalar", [](const Tensor& x) { return rsub(x, Scalar(2)); }, true, true},
      {"operator- scalar", [](const Tensor& x) { return x - 1.5; }, true, true},
      {"scalar / tensor", [](const Tensor& x) { return 2.0 / x; }, true, false},
      {"clamp both", [](const Tensor& x) { return clamp(x, Scalar(-1), Scalar(2)); }, true, true},
      {"clamp float bounds", [](const Tensor& x) { return clamp(x, Scalar(-1.5), Scalar(2.25)); }, true, true},
      {"clamp min", [](const Tensor& x) { return clamp(x, Scalar(0.5), std::nullopt); }, true, true},
      {"clamp max", [](const Tensor& x) { return clamp(x, std::nullopt, Scalar(1)); }, true, true},
      {"clamp lo > hi", [](const Tensor& x) { return clamp(x, Scalar(2), Scalar(1)); }, true, true},
  };
  for (const UnaryOp& op : ops)
    for (DType dt : kAllTypes) {
      if (dt == DType::Bool) continue;
      if (!isFloating(dt) && !op.ints) continue;
      for (const Case& c : unaryCases(dt, op.lo, op.hi)) {
        std::string what = name(dt, op.name + " " + c.layout);
        Tensor want = op.f(c.cpu), got = op.f(c.gpu);
        check(op.exact || !isFloating(want.dtype()), got, want, what);
      }
    }
}

TEST(CudaElementwise, PowWithScalarExponents) {
  COHORT_REQUIRE_GPU();
  // 0, 1, 2, 3, +-0.5, -1, -2 are exact short forms; other small integers are products in double
  // in the CPU's order (exact too, for float and the half types); the rest, and float64's other
  // integers, go through pow (within a few ulp: the two libraries' pow differ).
  for (double e : {0.0, 1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 4.0, 5.0, 7.0, -3.0, 8.0, -8.0, 1.7, -2.5, 9.0})
    for (DType dt : kFloatTypes)
      for (const Case& c : unaryCases(dt, 0.05, 3)) {
        const bool exact = (std::trunc(e) == e && e >= -2 && e <= 3) || e == 0.5 || e == -0.5 ||
                           (std::trunc(e) == e && std::abs(e) <= 8 && dt != DType::Float64);
        check(exact, pow(c.gpu, Scalar(e)), pow(c.cpu, Scalar(e)), name(dt, fmt::format("pow {} {}", e, c.layout)));
      }
  // Negative bases with integer exponents, through the short forms.
  for (DType dt : kFloatTypes)
    for (double e : {2.0, 3.0, 5.0, -3.0})
      for (const Case& c : unaryCases(dt, -3, -0.05))
        check(dt != DType::Float64 || e == 2 || e == 3, pow(c.gpu, Scalar(e)), pow(c.cpu, Scalar(e)),
              name(dt, fmt::format("pow negative base {} {}", e, c.layout)));
  // Integer tensors, integer exponents (wrapping as on the CPU).
  for (DType dt : kIntTypes)
    for (int64_t e : {0, 1, 2, 3, 7})
      for (const Case& c : unaryCases(dt))
        expectSame(pow(c.gpu, Scalar(e)), pow(c.cpu, Scalar(e)), name(dt, fmt::format("int pow {} {}", e, c.layout)));
  // An integer tensor to a float power becomes float32.
  Tensor i = values({4, 5}, DType::Int64);
  expectUlps(pow(cuda(i), Scalar(0.7)), pow(i, Scalar(0.7)), "int64 ^ 0.7");
}

TEST(CudaElementwise, IntegerInputsOfFloatOpsComputeInFloat32) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kIntTypes) {
    Tensor x = values({5, 4}, dt);
    expectUlps(exp(cuda(x) * 0.01), exp(x * 0.01), name(dt, "exp"));
    expectSame(sqrt(cuda(x)), sqrt(x), name(dt, "sqrt"));
    expectSame(div(cuda(x), cuda(x + 1)), div(x, x + 1), name(dt, "true division"));
    expectSame(div(cuda(x), Scalar(3)), div(x, Scalar(3)), name(dt, "division by a scalar"));
    expectSame(add(cuda(x), Scalar(0.5)), add(x, Scalar(0.5)), name(dt, "plus a float scalar"));
  }
  Tensor b = values({5, 4}, DType::Bool);
  expectSame(add(cuda(b), Scalar(2)), add(b, Scalar(2)), "bool + int scalar -> int64");
}

// ---- binary ops ---------------------------------------------------------------------------------------

struct BinaryOp {
  std::string name;
  Binary f;
  bool exact;
  bool ints;
  bool bools;
  double lo = -4;
  double hi = 4;
};

TEST(CudaElementwise, BinaryOpsEveryDtypeAndLayout) {
  COHORT_REQUIRE_GPU();
  const std::vector<BinaryOp> ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, true, true, true},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, true, true, false},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, true, true, true},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, true, false, false},
      {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, Scalar(0.37)); }, true, false, false},
      {"add int alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, Scalar(3)); }, true, true, false},
      {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, Scalar(-1.3)); }, true, false, false},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, true, true, true},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, true, true, true},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, false, false, false, 0.05, 3},
      {"pow negative bases", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, false, false, false},
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, maximum(a, b)); }, true, true, true},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, true, true, true},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, true, true, true},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, true, true, true},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, true, true, true},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, true, true, true},
      {"where", [](const Tensor& a, const Tensor& b) { return where(gt(a, b), a, b); }, true, true, true},
  };
  for (const BinaryOp& op : ops)
    for (DType dt : kAllTypes) {
      if (!isFloating(dt) && !op.ints) continue;
      if (dt == DType::Bool && !op.bools) continue;
      for (const Pair& p : binaryCases(dt, 11, op.lo, op.hi)) {
        std::string what = name(dt, op.name + " " + p.layout);
        Tensor want = op.f(p.a, p.b), got = op.f(p.ga, p.gb);
        check(op.exact, got, want, what);
      }
    }
  // Integer pow (by squaring, wrapping) and mixed-dtype promotion.
  for (DType dt : {DType::Int64, DType::Int32}) {
    Tensor a = values({5, 6}, dt, 3), e = (values({5, 6}, dt, 4) * 0 + 3).to(dt);
    expectSame(pow(cuda(a), cuda(e)), pow(a, e), name(dt, "integer pow"));
  }
  Tensor f = values({4, 5}, DType::Float32), h = values({4, 5}, DType::BFloat16, 2), i = values({5}, DType::Int32, 3);
  expectSame(cuda(f) + cuda(h), f + h, "float32 + bfloat16");
  expectSame(cuda(h) * cuda(i), h * i, "bfloat16 * int32");
  expectSame(lt(cuda(i), cuda(f)), lt(i, f), "int32 < float32");
}

TEST(CudaElementwise, SpecialValues) {
  COHORT_REQUIRE_GPU();
  const double inf = INFINITY, nan = NAN;
  std::vector<double> v = {0.0, -0.0, 1.0, -1.0, inf, -inf, nan, 1e-40, -3.5, 65504, 70000, 1e30};
  for (DType dt : kFloatTypes) {
    Tensor x = fromVector<double>(v, {static_cast<int64_t>(v.size())}).to(dt);
    Tensor y = fromVector<double>(std::vector<double>(v.rbegin(), v.rend()), {static_cast<int64_t>(v.size())}).to(dt);
    Tensor gx = cuda(x), gy = cuda(y);
    expectSame(gx, x, name(dt, "round trip"));
    for (auto [n, f] : std::vector<std::pair<std::string, Unary>>{{"neg", [](const Tensor& t) { return neg(t); }},
                                                                  {"abs", [](const Tensor& t) { return abs(t); }},
                                                                  {"relu", [](const Tensor& t) { return relu(t); }},
                                                                  {"sqrt", [](const Tensor& t) { return sqrt(t); }},
                                                                  {"rsqrt", [](const Tensor& t) { return rsqrt(t); }}})
      expectSame(f(gx), f(x), name(dt, "special " + n));
    for (auto [n, f] :
         std::vector<std::pair<std::string, Unary>>{{"exp", [](const Tensor& t) { return exp(t); }},
                                                    {"log", [](const Tensor& t) { return log(t); }},
                                                    {"tanh", [](const Tensor& t) { return tanh(t); }},
                                                    {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
                                                    {"gelu", [](const Tensor& t) { return gelu(t); }},
                                                    {"gelu tanh", [](const Tensor& t) { return gelu(t, true); }},
                                                    {"silu", [](const Tensor& t) { return silu(t); }}})
      expectUlps(f(gx), f(x), name(dt, "special " + n));
    expectSame(gx + gy, x + y, name(dt, "special add"));
    expectSame(gx * gy, x * y, name(dt, "special mul"));
    expectSame(gx / gy, x / y, name(dt, "special div"));
    expectSame(maximum(gx, gy), maximum(x, y), name(dt, "special maximum"));
    expectSame(minimum(gx, gy), minimum(x, y), name(dt, "special minimum"));
    expectSame(lt(gx, gy), lt(x, y), name(dt, "special lt"));
    expectSame(eq(gx, gy), eq(x, y), name(dt, "special eq"));
    expectSame(ne(gx, gy), ne(x, y), name(dt, "special ne"));
    expectSame(clamp(gx, Scalar(-2), Scalar(2)), clamp(x, Scalar(-2), Scalar(2)), name(dt, "special clamp"));
    expectUlps(pow(gx, gy), pow(x, y), name(dt, "special pow"));
    for (DType to : kAllTypes) {
      if (!isFloating(to)) continue;  // float -> int of inf/NaN/out of range is undefined
      expectSame(cuda(x).to(to), x.to(to), name(dt, fmt::format("special to {}", to)));
    }
    expectSame(cuda(x).to(DType::Bool), x.to(DType::Bool), name(dt, "special to bool"));
  }
}

// ---- backward formulas -----------------------------------------------------------------------------

Tensor gradOf(const Unary& f, const Tensor& x, const Tensor& g) {
  Tensor leaf = x.detach();
  leaf.setRequiresGrad(true);
  f(leaf).backward(g);
  return leaf.grad();
}

TEST(CudaElementwise, BackwardFormulas) {
  COHORT_REQUIRE_GPU();
  const std::vector<UnaryOp> ops = {
      {"relu", [](const Tensor& x) { return relu(x); }, true, false},
      {"abs", [](const Tensor& x) { return abs(x); }, true, false},
      {"clamp", [](const Tensor& x) { return clamp(x, Scalar(-1), Scalar(1.5)); }, true, false},
      {"clamp min", [](const Tensor& x) { return clamp(x, Scalar(-1), std::nullopt); }, true, false},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, true, false, 0.1, 9},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, true, false, 0.1, 9},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, false, false},
      {"tanh", [](const Tensor& x) { return tanh(x); }, false, false},
      {"silu", [](const Tensor& x) { return silu(x); }, false, false},
      {"gelu", [](const Tensor& x) { return gelu(x); }, false, false},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, true); }, false, false},
      {"exp", [](const Tensor& x) { return exp(x); }, false, false},
      {"log", [](const Tensor& x) { return log(x); }, false, false, 0.1, 9},
      {"pow 2.5", [](const Tensor& x) { return pow(x, Scalar(2.5)); }, false, false, 0.1, 3},
      {"pow 3", [](const Tensor& x) { return pow(x, Scalar(3)); }, false, false},
      {"neg", [](const Tensor& x) { return neg(x); }, true, false},
      {"mul scalar", [](const Tensor& x) { return x * 3.0; }, true, false},
      {"div scalar", [](const Tensor& x) { return x / 3.0; }, true, false},
  };
  for (const UnaryOp& op : ops)
    for (DType dt : kFloatTypes)
      for (const Case& c : unaryCases(dt, op.lo, op.hi)) {
        if (c.layout == "expanded") continue;  // its gradient is a sum (another family's kernel)
        Tensor g = values(c.cpu.sizes(), dt, 99);
        std::string what = name(dt, op.name + " backward " + c.layout);
        Tensor want = gradOf(op.f, c.cpu.contiguous(), g), got = gradOf(op.f, c.gpu.contiguous(), cuda(g));
        check(op.exact, got, want, what);
      }
}

TEST(CudaElementwise, BinaryBackwardFormulas) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    // Ties included: maximum/minimum split the gradient in half there.
    Tensor a = values({5, 6}, dt, 1, 0.1, 3), b = values({5, 6}, dt, 2, 0.1, 3);
    Tensor bt = where(lt(a, b), a, b);  // some ties with a
    Tensor g = values({5, 6}, dt, 3);
    auto grads = [&](const Binary& f, const Tensor& x, const Tensor& y, const Tensor& gg) {
      Tensor lx = x.detach(), ly = y.detach();
      lx.setRequiresGrad(true);
      ly.setRequiresGrad(true);
      f(lx, ly).backward(gg);
      return std::make_pair(lx.grad(), ly.grad());
    };
    const std::vector<std::tuple<std::string, Binary, bool>> ops = {
        {"maximum", [](const Tensor& x, const Tensor& y) { return maximum(x, y); }, true},
        {"minimum", [](const Tensor& x, const Tensor& y) { return minimum(x, y); }, true},
        {"mul", [](const Tensor& x, const Tensor& y) { return x * y; }, true},
        {"div", [](const Tensor& x, const Tensor& y) { return x / y; }, true},
        {"pow", [](const Tensor& x, const Tensor& y) { return pow(x, y); }, false},
        {"where", [](const Tensor& x, const Tensor& y) { return where(gt(x, y), x, y); }, true},
        {"sub alpha", [](const Tensor& x, const Tensor& y) { return sub(x, y, Scalar(2)); }, true},
    };
    for (const auto& [n, f, exact] : ops) {
      auto [wa, wb] = grads(f, a, bt, g);
      auto [ga, gb] = grads(f, cuda(a), cuda(bt), cuda(g));
      check(exact, ga, wa, name(dt, n + " backward (first)"));
      check(exact, gb, wb, name(dt, n + " backward (second)"));
    }
  }
}

// ---- in-place members ---------------------------------------------------------------------------------

using Inplace = std::function<void(Tensor&, const Tensor&, const Tensor&)>;

TEST(CudaElementwise, InplaceMembers) {
  COHORT_REQUIRE_GPU();
  const std::vector<std::tuple<std::string, Inplace, bool>> ops = {
      {"add_", [](Tensor& s, const Tensor& o, const Tensor&) { s.add_(o); }, true},
      {"add_ alpha", [](Tensor& s, const Tensor& o, const Tensor&) { s.add_(o, Scalar(-0.25)); }, false},
      {"add_ scalar", [](Tensor& s, const Tensor&, const Tensor&) { s.add_(Scalar(2)); }, true},
      {"sub_", [](Tensor& s, const Tensor& o, const Tensor&) { s.sub_(o); }, true},
      {"sub_ alpha", [](Tensor& s, const Tensor& o, const Tensor&) { s.sub_(o, Scalar(0.1)); }, false},
      {"mul_", [](Tensor& s, const Tensor& o, const Tensor&) { s.mul_(o); }, true},
      {"mul_ scalar", [](Tensor& s, const Tensor&, const Tensor&) { s.mul_(Scalar(0.9)); }, false},
      {"div_", [](Tensor& s, const Tensor& o, const Tensor&) { s.div_(o); }, false},
      {"div_ scalar", [](Tensor& s, const Tensor&, const Tensor&) { s.div_(Scalar(1.1)); }, false},
      {"addcmul_", [](Tensor& s, const Tensor& o, const Tensor& p) { s.addcmul_(o, p, Scalar(0.3)); }, false},
      {"addcdiv_", [](Tensor& s, const Tensor& o, const Tensor& p) { s.addcdiv_(o, p, Scalar(-0.3)); }, false},
      {"lerp_ near", [](Tensor& s, const Tensor& o, const Tensor&) { s.lerp_(o, Scalar(0.1)); }, false},
      {"lerp_ far", [](Tensor& s, const Tensor& o, const Tensor&) { s.lerp_(o, Scalar(0.9)); }, false},
      {"clamp_", [](Tensor& s, const Tensor&, const Tensor&) { s.clamp_(Scalar(-1), Scalar(1)); }, true},
      {"sqrt_", [](Tensor& s, const Tensor&, const Tensor&) { s.sqrt_(); }, false},
      {"maskedFill_", [](Tensor& s, const Tensor& o, const Tensor& p) { s.maskedFill_(gt(o, p), Scalar(-7.5)); },
       false},
  };
  for (const auto& [n, f, ints] : ops)
    for (DType dt : kAllTypes) {
      if (dt == DType::Bool || (!isFloating(dt) && !ints)) continue;
      for (DType other : {dt, DType::Float32}) {
        if (!isFloating(dt) && other != dt) continue;
        for (int layout = 0; layout < 3; ++layout) {
          // self contiguous, self transposed, other broadcast.
          Tensor base = layout == 1 ? values({7, 6}, dt, 1, 0.5, 4) : values({6, 7}, dt, 1, 0.5, 4);
          Tensor cs = layout == 1 ? base.clone().t() : base.clone();
          Tensor gs = layout == 1 ? cuda(base).t() : cuda(base);
          Tensor o = layout == 2 ? values({7}, other, 2, 0.5, 4) : values({6, 7}, other, 2, 0.5, 4);
          Tensor p = values({6, 7}, other, 3, 0.5, 4);
          f(cs, o, p);
          Tensor go = cuda(o), gp = cuda(p);
          f(gs, go, gp);
          expectSame(gs, cs, name(dt, fmt::format("{} layout {} with {}", n, layout, other)));
        }
      }
    }
}

// ---- copies, casts, fill, factories, item ---------------------------------------------------------------

TEST(CudaElementwise, CopyBetweenEveryDtypePairAndLayout) {
  COHORT_REQUIRE_GPU();
  for (DType from : kAllTypes)
    for (DType to : kAllTypes) {
      Tensor x = values({6, 7}, from, 5, -300, 300);
      if (isFloating(from) && !isFloating(to)) x = values({6, 7}, from, 5, 0, 250);  // in range of every int
      std::string what = fmt::format("{} -> {}", from, to);
      expectSame(cuda(x).to(to), x.to(to), what + " contiguous");
      // Into a transposed destination, from a transposed source, broadcast, 0-dim, empty.
      Tensor dst = zeros({7, 6}, {.dtype = to}).t(), gdst = zeros({7, 6}, {.dtype = to, .device = Device::cuda()}).t();
      dst.copy_(x);
      gdst.copy_(cuda(x));
      expectSame(gdst, dst, what + " into transposed");
      Tensor xt = values({7, 6}, from, 6, 0, 100);
      expectSame(cuda(xt).t().to(to), xt.t().to(to), what + " from transposed");
      expectSame(cuda(xt).t().contiguous().to(to), xt.t().contiguous().to(to), what + " contiguous() then to");
      Tensor row = values({7}, from, 7, 0, 100);
      Tensor bdst = empty({6, 7}, {.dtype = to}), gbdst = empty({6, 7}, {.dtype = to, .device = Device::cuda()});
      bdst.copy_(row);
      gbdst.copy_(cuda(row));
      expectSame(gbdst, bdst, what + " broadcast");
      Tensor s = values({}, from, 8, 0, 100);
      expectSame(cuda(s).to(to), s.to(to), what + " 0-dim");
      Tensor e = values({0, 4}, from);
      expectSame(cuda(e).to(to), e.to(to), what + " empty");
    }
}

TEST(CudaElementwise, CopyAcrossDevicesCloneContiguous) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    Tensor x = values({5, 8}, dt);
    // CPU -> CUDA into a strided destination, with a dtype change.
    Tensor gdst = zeros({8, 5}, {.dtype = DType::Float64, .device = Device::cuda()}).t();
    gdst.copy_(x.t().t());
    expectSame(gdst, x.to(DType::Float64), name(dt, "cpu -> cuda copy_"));
    // CUDA (non-contiguous) -> CPU.
    Tensor cdst = empty({8, 5}, {.dtype = dt});
    cdst.copy_(cuda(x).t());
    expectSame(cuda(cdst), x.t().contiguous(), name(dt, "cuda -> cpu copy_"));
    // clone and contiguous keep the device and the values.
    Tensor view = cuda(x).t();
    Tensor cl = view.clone(), ct = view.contiguous();
    EXPECT_TRUE(ct.isContiguous());
    expectSame(cl, x.t().clone(), name(dt, "clone"));
    expectSame(ct, x.t().contiguous(), name(dt, "contiguous"));
    // Sliced views copied to the host.
    expectSame(cuda(x).slice(1, 1, 8, 3).to(Device::cpu()).to(Device::cuda()), x.slice(1, 1, 8, 3),
               name(dt, "slice to cpu"));
  }
  // copy_ records for autograd: the gradient of the source comes back on the source's device.
  Tensor src = values({3, 4}, DType::Float32).to(Device::cuda()).detach();
  src.setRequiresGrad(true);
  Tensor dst = zeros({3, 4}, {.device = Device::cuda()});
  dst.copy_(src);
  (dst * 2.0).backward(ones({3, 4}, {.device = Device::cuda()}));
  expectSame(src.grad(), full({3, 4}, 2.0), "copy_ backward");
}

TEST(CudaElementwise, FillAndFactories) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    const TensorOptions on{.dtype = dt, .device = Device::cuda()};
    const TensorOptions cpu{.dtype = dt};
    expectSame(zeros({3, 5}, on), zeros({3, 5}, cpu), name(dt, "zeros"));
    expectSame(ones({3, 5}, on), ones({3, 5}, cpu), name(dt, "ones"));
    expectSame(zeros({}, on), zeros({}, cpu), name(dt, "0-dim zeros"));
    expectSame(zeros({0, 5}, on), zeros({0, 5}, cpu), name(dt, "empty zeros"));
    for (double v : {2.5, -0.0, 300.7, 1e-8})
      expectSame(full({4, 3}, v, on), full({4, 3}, v, cpu), name(dt, fmt::format("full {}", v)));
    expectSame(full({2, 2}, Scalar(7), on), full({2, 2}, Scalar(7), cpu), name(dt, "full int"));
    // fill_ of a strided view leaves the rest alone.
    Tensor c = values({6, 8}, dt), g = cuda(c);
    c.slice(1, 0, 8, 3).fill_(Scalar(1));
    g.slice(1, 0, 8, 3).fill_(Scalar(1));
    expectSame(g, c, name(dt, "fill_ of a slice"));
    c.t().zero_();
    g.t().zero_();
    expectSame(g, c, name(dt, "zero_ of a transposed view"));
    Tensor z = values({4, 4}, dt), gz = cuda(z);
    expectSame(zerosLike(gz), zerosLike(z), name(dt, "zerosLike"));
    expectSame(onesLike(gz), onesLike(z), name(dt, "onesLike"));
    expectSame(fullLike(gz, Scalar(3)), fullLike(z, Scalar(3)), name(dt, "fullLike"));
  }
}

TEST(CudaElementwise, Item) {
  COHORT_REQUIRE_GPU();
  Tensor x = fromVector<float>({1.5f, -2.25f, 3.0f}, {3}).to(Device::cuda());
  EXPECT_EQ(x.slice(0, 1, 2).item<float>(), -2.25f);
  EXPECT_EQ((x * 2.0).slice(0, 2, 3).reshape({}).item<double>(), 6.0);
  EXPECT_EQ(full({}, Scalar(int64_t{1} << 40), {.dtype = DType::Int64, .device = Device::cuda()}).item<int64_t>(),
            int64_t{1} << 40);
  EXPECT_EQ(full({1, 1}, Scalar(true), {.dtype = DType::Bool, .device = Device::cuda()}).item<bool>(), true);
  EXPECT_EQ(full({}, 0.1, {.dtype = DType::BFloat16, .device = Device::cuda()}).item<float>(),
            full({}, 0.1, {.dtype = DType::BFloat16}).item<float>());
  EXPECT_THROW(x.item<float>(), ValueError);  // three elements
}

TEST(CudaElementwise, LargeTensorsUse64BitIndices) {
  COHORT_REQUIRE_GPU();
  // 2^31 + 2^25 one-byte elements: both the flat and the strided paths pass 2^31.
  const int64_t rows = (int64_t{1} << 25) + (int64_t{1} << 19), cols = 64;
  Tensor a = zeros({rows, cols}, {.dtype = DType::UInt8, .device = Device::cuda()});
  a.add_(Scalar(3));                     // contiguous
  Tensor b = a.t().transpose(0, 1) + a;  // same layout, contiguous
  Tensor c = a.t() * 2;                  // strided read, transposed shape
  EXPECT_EQ(a.slice(0, rows - 1, rows).slice(1, cols - 1, cols).item<int64_t>(), 3);
  EXPECT_EQ(b.slice(0, rows - 1, rows).slice(1, cols - 1, cols).item<int64_t>(), 6);
  EXPECT_EQ(c.slice(0, cols - 1, cols).slice(1, rows - 1, rows).item<int64_t>(), 6);
  EXPECT_EQ(c.slice(0, 17, 18).slice(1, rows - 5, rows - 4).item<int64_t>(), 6);
}

TEST(CudaElementwise, StreamOrder) {
  COHORT_REQUIRE_GPU();
  // Results of kernels queued on a non-default stream are read back in order.
  cuda::Stream s = cuda::streamFromPool();
  cuda::StreamGuard guard(s);
  Tensor x = full({1 << 20}, 1.0, {.device = Device::cuda()});
  for (int i = 0; i < 10; ++i) x.mul_(Scalar(2.0));
  EXPECT_EQ(x.slice(0, (1 << 20) - 1, 1 << 20).item<double>(), 1024.0);
}

void cpuOnlyKernel(Tensor&, const Tensor&) {}

// An op whose device has no kernel is refused by name, on a real device tensor.
TEST(CudaElementwise, AnOpWithoutAKernelOnTheDeviceIsRefusedByName) {
  if (!cuda::isAvailable()) GTEST_SKIP() << "needs a CUDA device to make a CUDA tensor";
  static const dispatch::Register<dispatch::UnaryKernel> kCpuOnly{"test.cpuOnly", DeviceType::CPU, &cpuOnlyKernel};
  Tensor x = zeros({2}, {.device = Device::cuda()}), out = zeros({2}, {.device = Device::cuda()});
  testing::expectError<NotSupportedError>(
      [&] { dispatch::kernel<dispatch::UnaryKernel>("test.cpuOnly", x.device())(out, x); }, {"test.cpuOnly", "cuda:0"});
}

// ---- runs anywhere ------------------------------------------------------------------------------------

TEST(CudaElementwise, KernelsRegisteredInCudaBuilds) {
  if (!COHORT_USE_CUDA) GTEST_SKIP() << "this build has no CUDA";
  std::vector<std::string> ops = dispatch::opsWithKernels(DeviceType::CUDA);
  for (const char* op : {"neg",
                         "abs",
                         "relu",
                         "exp",
                         "log",
                         "sqrt",
                         "rsqrt",
                         "sigmoid",
                         "tanh",
                         "silu",
                         "gelu",
                         "gelu_tanh",
                         "add",
                         "sub",
                         "mul",
                         "div",
                         "rsub",
                         "pow",
                         "maximum",
                         "minimum",
                         "eq",
                         "ne",
                         "lt",
                         "le",
                         "gt",
                         "ge",
                         "where",
                         "clamp",
                         "clamp_",
                         "clamp backward",
                         "relu backward",
                         "sigmoid backward",
                         "tanh backward",
                         "silu backward",
                         "gelu backward",
                         "gelu_tanh backward",
                         "sqrt backward",
                         "sqrt_ backward",
                         "rsqrt backward",
                         "abs backward",
                         "pow backward (base)",
                         "pow backward (exponent)",
                         "maximum backward",
                         "minimum backward",
                         "addcmul_",
                         "addcdiv_",
                         "lerp_",
                         "fill_",
                         "copy_"})
    EXPECT_TRUE(std::find(ops.begin(), ops.end(), op) != ops.end()) << op << " has no CUDA kernel";
  // Each kernel is found under the signature its op calls it with.
  EXPECT_NE(dispatch::find<dispatch::BinaryKernel>("add", Device::cuda()), nullptr);
  EXPECT_NE(dispatch::find<dispatch::BinaryScalarKernel>("add", Device::cuda()), nullptr);
  EXPECT_NE(dispatch::find<dispatch::ScalarKernel>("add", Device::cuda()), nullptr);
  EXPECT_NE(dispatch::find<dispatch::UnaryKernel>("gelu_tanh", Device::cuda()), nullptr);
  EXPECT_EQ(dispatch::find<dispatch::UnaryKernel>("add", Device::cuda()), nullptr);
}

}  // namespace
}  // namespace cohort
