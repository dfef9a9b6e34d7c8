// Elementwise ops: values against PyTorch for every dtype class, special values, broadcasting,
// dtype rules, and error messages. Gradients are in elementwise_grad_test.cc, in-place ops in
// inplace_test.cc, the vectorized float math's accuracy in vec_math_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include <cohort/cohort.h>

using namespace cohort;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

Tensor make(const std::vector<double>& v, DType dt, const Shape& shape = {}) {
  return fromVector<double>(v, shape).to(dt);
}
std::vector<double> vals(const Tensor& t) { return t.to(DType::Float64).toVector<double>(); }

// Relative tolerance of a comparison with torch per dtype: a few ulp of float32 (both libraries
// approximate), 1e-14 for float64 (both use the C library), one unit in the last place of the
// half types (torch may round an intermediate differently).
double relTol(DType dt) {
  switch (dt) {
    case DType::Float32: return 4e-7;
    case DType::Float64: return 1e-14;
    case DType::Float16: return 1.0 / 1024;
    case DType::BFloat16: return 1.0 / 128;
    default: return 0;
  }
}

::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                                 double atol = 0) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && g == w) continue;
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w)))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g << " want " << w;
  }
  return ::testing::AssertionSuccess();
}

struct Ref {
  const char* op;
  DType dtype;
  std::vector<double> want;
};

// Produced with /usr/bin/python3 (torch 1.13) by /tmp/elem/ref.py: each op applied to
// xs = [-3.5, -1.25, -0.5, 0, 0.3, 1, 2.75, 10] or, for log/sqrt/rsqrt/pow(1.7)/pow(-0.5),
// pos = [0.001, 0.3, 1, 2.5, 7, 100, 1e-20, 3e20], converted to the dtype first. For float16 and
// bfloat16 the reference is torch's float32 result on the half-precision input rounded once to
// the half type (torch 1.13 has no float16 CPU kernels, and its bfloat16 ones round exponents
// and intermediates to bfloat16).
const std::vector<Ref> kRefs = {
    {"exp",
     DType::Float32,
     {0.03019738383591175, 0.2865048050880432, 0.6065306663513184, 1.0, 1.3498587608337402, 2.7182817459106445,
      15.642631530761719, 22026.46484375}},
    {"log",
     DType::Float32,
     {-6.907755374908447, -1.2039728164672852, 0.0, 0.9162907600402832, 1.945910096168518, 4.605170249938965,
      -46.051700592041016, 47.15031433105469}},
    {"sqrt",
     DType::Float32,
     {0.03162277862429619, 0.547722578048706, 1.0, 1.5811388492584229, 2.6457512378692627, 10.0, 1.000000013351432e-10,
      17320507392.0}},
    {"rsqrt",
     DType::Float32,
     {31.622774124145508, 1.8257417678833008, 1.0, 0.6324555277824402, 0.37796449661254883, 0.10000000149011612,
      10000000000.0, 5.773502856354362e-11}},
    {"abs", DType::Float32, {3.5, 1.25, 0.5, 0.0, 0.30000001192092896, 1.0, 2.75, 10.0}},
    {"relu", DType::Float32, {0.0, 0.0, 0.0, 0.0, 0.30000001192092896, 1.0, 2.75, 10.0}},
    {"gelu",
     DType::Float32,
     {-0.0008143335580825806, -0.13206231594085693, -0.1542687863111496, 0.0, 0.1853734254837036, 0.8413447141647339,
      2.7418055534362793, 10.0}},
    {"gelu_tanh",
     DType::Float32,
     {-0.0006161481142044067, -0.13228580355644226, -0.1542859971523285, 0.0, 0.18537093698978424, 0.8411920070648193,
      2.742276668548584, 10.0}},
    {"silu",
     DType::Float32,
     {-0.10259281098842621, -0.27837517857551575, -0.1887703388929367, 0.0, 0.172332763671875, 0.7310585975646973,
      2.584761619567871, 9.99954605102539}},
    {"sigmoid",
     DType::Float32,
     {0.02931223064661026, 0.22270013391971588, 0.3775406777858734, 0.5, 0.5744425058364868, 0.7310585975646973,
      0.9399133324623108, 0.9999545812606812}},
    {"tanh",
     DType::Float32,
     {-0.9981778860092163, -0.8482836484909058, -0.46211716532707214, 0.0, 0.29131263494491577, 0.7615941762924194,
      0.9918597340583801, 1.0}},
    {"pow17",
     DType::Float32,
     {7.94328298070468e-06, 0.12915349006652832, 1.0, 4.747861385345459, 27.331701278686523, 2511.886474609375,
      9.999999319067318e-35, 6.4730082213535335e+34}},
    {"pow2", DType::Float32, {12.25, 1.5625, 0.25, 0.0, 0.09000000357627869, 1.0, 7.5625, 100.0}},
    {"powm05",
     DType::Float32,
     {31.622774124145508, 1.8257417678833008, 1.0, 0.6324555277824402, 0.37796449661254883, 0.10000000149011612,
      10000000000.0, 5.773502856354362e-11}},
    {"exp",
     DType::Float64,
     {0.0301973834223185, 0.2865047968601901, 0.6065306597126334, 1.0, 1.3498588075760032, 2.718281828459045,
      15.642631884188171, 22026.465794806718}},
    {"log",
     DType::Float64,
     {-6.907755278982137, -1.2039728043259361, 0.0, 0.9162907318741551, 1.9459101490553132, 4.605170185988092,
      -46.051701859880914, 47.15031414854902}},
    {"sqrt",
     DType::Float64,
     {0.03162277660168379, 0.5477225575051661, 1.0, 1.5811388300841898, 2.6457513110645907, 10.0, 1e-10,
      17320508075.688774}},
    {"rsqrt",
     DType::Float64,
     {31.622776601683796, 1.8257418583505538, 1.0, 0.6324555320336759, 0.3779644730092272, 0.1, 10000000000.0,
      5.7735026918962574e-11}},
    {"abs", DType::Float64, {3.5, 1.25, 0.5, 0.0, 0.3, 1.0, 2.75, 10.0}},
    {"relu", DType::Float64, {0.0, 0.0, 0.0, 0.0, 0.3, 1.0, 2.75, 10.0}},
    {"gelu",
     DType::Float64,
     {-0.0008142017766243903, -0.13206221708356905, -0.15426876936299344, 0.0, 0.1853734266566858, 0.841344746068543,
      2.7418056511035998, 10.0}},
    {"gelu_tanh",
     DType::Float64,
     {-0.0006161976553737403, -0.13228579703028537, -0.15428599017485606, 0.0, 0.18537092354275922, 0.8411919906082768,
      2.742276855926382, 10.0}},
    {"silu",
     DType::Float64,
     {-0.10259280762974712, -0.27837517353163604, -0.1887703343990727, 0.0, 0.1723327550434977, 0.7310585786300049,
      2.584761712021479, 9.999546021312975}},
    {"sigmoid",
     DType::Float64,
     {0.02931223075135632, 0.22270013882530884, 0.3775406687981454, 0.5, 0.574442516811659, 0.7310585786300049,
      0.9399133498259924, 0.9999546021312976}},
    {"tanh",
     DType::Float64,
     {-0.9981778976111987, -0.8482836399575129, -0.46211715726000974, 0.0, 0.2913126124515909, 0.7615941559557649,
      0.9918597245682077, 0.9999999958776927}},
    {"pow17",
     DType::Float64,
     {7.943282347242818e-06, 0.12915348607498026, 1.0, 4.747861205827337, 27.331701439859053, 2511.88643150958,
      1.0000000000000019e-34, 6.473007839923766e+34}},
    {"pow2", DType::Float64, {12.25, 1.5625, 0.25, 0.0, 0.09, 1.0, 7.5625, 100.0}},
    {"powm05",
     DType::Float64,
     {31.622776601683796, 1.8257418583505538, 1.0, 0.6324555320336759, 0.3779644730092272, 0.1, 10000000000.0,
      5.7735026918962574e-11}},
    {"exp",
     DType::Float16,
     {0.0301971435546875, 0.28662109375, 0.6064453125, 1.0, 1.349609375, 2.71875, 15.640625, 22032.0}},
    {"log", DType::Float16, {-6.90625, -1.2041015625, 0.0, 0.91650390625, 1.9462890625, 4.60546875, -kInf, kInf}},
    {"sqrt", DType::Float16, {0.0316162109375, 0.5478515625, 1.0, 1.5810546875, 2.646484375, 10.0, 0.0, kInf}},
    {"rsqrt", DType::Float16, {31.609375, 1.8251953125, 1.0, 0.63232421875, 0.3779296875, 0.0999755859375, kInf, 0.0}},
    {"abs", DType::Float16, {3.5, 1.25, 0.5, 0.0, 0.300048828125, 1.0, 2.75, 10.0}},
    {"relu", DType::Float16, {0.0, 0.0, 0.0, 0.0, 0.300048828125, 1.0, 2.75, 10.0}},
    {"gelu",
     DType::Float16,
     {-0.0008144378662109375, -0.132080078125, -0.154296875, 0.0, 0.1854248046875, 0.84130859375, 2.7421875, 10.0}},
    {"gelu_tanh",
     DType::Float16,
     {-0.0006160736083984375, -0.13232421875, -0.154296875, 0.0, 0.1854248046875, 0.84130859375, 2.7421875, 10.0}},
    {"silu",
     DType::Float16,
     {-0.10260009765625, -0.2783203125, -0.188720703125, 0.0, 0.17236328125, 0.73095703125, 2.583984375, 10.0}},
    {"sigmoid",
     DType::Float16,
     {0.0293121337890625, 0.22265625, 0.37744140625, 0.5, 0.57421875, 0.73095703125, 0.93994140625, 1.0}},
    {"tanh",
     DType::Float16,
     {-0.998046875, -0.84814453125, -0.462158203125, 0.0, 0.291259765625, 0.76171875, 0.99169921875, 1.0}},
    {"pow17", DType::Float16, {7.927417755126953e-06, 0.129150390625, 1.0, 4.74609375, 27.328125, 2512.0, 0.0, kInf}},
    {"pow2", DType::Float16, {12.25, 1.5625, 0.25, 0.0, 0.09002685546875, 1.0, 7.5625, 100.0}},
    {"powm05", DType::Float16, {31.609375, 1.8251953125, 1.0, 0.63232421875, 0.3779296875, 0.0999755859375, kInf, 0.0}},
    {"exp", DType::BFloat16, {0.0301513671875, 0.287109375, 0.60546875, 1.0, 1.3515625, 2.71875, 15.625, 22016.0}},
    {"log", DType::BFloat16, {-6.90625, -1.203125, 0.0, 0.91796875, 1.9453125, 4.59375, -46.0, 47.25}},
    {"sqrt",
     DType::BFloat16,
     {0.031494140625, 0.546875, 1.0, 1.578125, 2.640625, 10.0, 1.000444171950221e-10, 17314086912.0}},
    {"rsqrt",
     DType::BFloat16,
     {31.625, 1.8203125, 1.0, 0.6328125, 0.37890625, 0.10009765625, 9999220736.0, 5.775291356258094e-11}},
    {"abs", DType::BFloat16, {3.5, 1.25, 0.5, 0.0, 0.30078125, 1.0, 2.75, 10.0}},
    {"relu", DType::BFloat16, {0.0, 0.0, 0.0, 0.0, 0.30078125, 1.0, 2.75, 10.0}},
    {"gelu",
     DType::BFloat16,
     {-0.000812530517578125, -0.1318359375, -0.154296875, 0.0, 0.185546875, 0.83984375, 2.734375, 10.0}},
    {"gelu_tanh",
     DType::BFloat16,
     {-0.00061798095703125, -0.1318359375, -0.154296875, 0.0, 0.185546875, 0.83984375, 2.75, 10.0}},
    {"silu",
     DType::BFloat16,
     {-0.1025390625, -0.279296875, -0.1884765625, 0.0, 0.1728515625, 0.73046875, 2.578125, 10.0}},
    {"sigmoid", DType::BFloat16, {0.029296875, 0.22265625, 0.376953125, 0.5, 0.57421875, 0.73046875, 0.94140625, 1.0}},
    {"tanh", DType::BFloat16, {-1.0, -0.84765625, -0.462890625, 0.0, 0.29296875, 0.76171875, 0.9921875, 1.0}},
    {"pow17",
     DType::BFloat16,
     {7.927417755126953e-06, 0.1298828125, 1.0, 4.75, 27.375, 2512.0, 1.0005807914199311e-34, 6.457919217802692e+34}},
    {"pow2", DType::BFloat16, {12.25, 1.5625, 0.25, 0.0, 0.09033203125, 1.0, 7.5625, 100.0}},
    {"powm05",
     DType::BFloat16,
     {31.625, 1.8203125, 1.0, 0.6328125, 0.37890625, 0.10009765625, 9999220736.0, 5.775291356258094e-11}},
};

const std::vector<double> kXs = {-3.5, -1.25, -0.5, 0.0, 0.3, 1.0, 2.75, 10.0};
const std::vector<double> kPos = {0.001, 0.3, 1.0, 2.5, 7.0, 100.0, 1e-20, 3e20};

const std::map<std::string, std::pair<std::function<Tensor(const Tensor&)>, const std::vector<double>*>> kOps = {
    {"exp", {[](const Tensor& t) { return exp(t); }, &kXs}},
    {"log", {[](const Tensor& t) { return log(t); }, &kPos}},
    {"sqrt", {[](const Tensor& t) { return sqrt(t); }, &kPos}},
    {"rsqrt", {[](const Tensor& t) { return rsqrt(t); }, &kPos}},
    {"abs", {[](const Tensor& t) { return abs(t); }, &kXs}},
    {"relu", {[](const Tensor& t) { return relu(t); }, &kXs}},
    {"gelu", {[](const Tensor& t) { return gelu(t); }, &kXs}},
    {"gelu_tanh", {[](const Tensor& t) { return gelu(t, true); }, &kXs}},
    {"silu", {[](const Tensor& t) { return silu(t); }, &kXs}},
    {"sigmoid", {[](const Tensor& t) { return sigmoid(t); }, &kXs}},
    {"tanh", {[](const Tensor& t) { return tanh(t); }, &kXs}},
    {"pow17", {[](const Tensor& t) { return pow(t, 1.7); }, &kPos}},
    {"pow2", {[](const Tensor& t) { return pow(t, 2); }, &kXs}},
    {"powm05", {[](const Tensor& t) { return pow(t, -0.5); }, &kPos}},
};

}  // namespace

TEST(Elementwise, UnaryValuesMatchTorchForEveryFloatDtype) {
  for (const Ref& r : kRefs) {
    SCOPED_TRACE(std::string(r.op) + " " + dtypeName(r.dtype));
    const auto& [fn, input] = kOps.at(r.op);
    Tensor x = make(*input, r.dtype);
    Tensor y = fn(x);
    EXPECT_EQ(y.dtype(), r.dtype);
    EXPECT_EQ(y.sizes(), x.sizes());
    // Values that underflow in a half type may differ by one subnormal step: allow that much.
    double atol = r.dtype == DType::Float16 ? 6e-8 : (r.dtype == DType::BFloat16 ? 1e-38 : 1e-300);
    // gelu's formula 0.5 x (1 + erf(x / sqrt 2)) cancels for negative x: both libraries are off
    // by about one float ulp of (1 + erf) times |x| there.
    std::string op = r.op;
    if ((op == "gelu" || op == "gelu_tanh") && r.dtype == DType::Float32) atol = 3e-7;
    EXPECT_TRUE(close(vals(y), r.want, relTol(r.dtype), atol));
  }
}

TEST(Elementwise, UnaryOnNonContiguousInputMatchesContiguous) {
  Generator g(3);
  Tensor base = randn({6, 5}, {}, &g) * 3.0;
  Tensor t = base.t();  // non-contiguous
  for (const auto& [name, op] : kOps) {
    SCOPED_TRACE(name);
    Tensor in = name == "log" || name == "sqrt" || name == "rsqrt" || name == "pow17" || name == "powm05" ? abs(t) : t;
    EXPECT_EQ(vals(op.first(in)), vals(op.first(in.contiguous())));
  }
  // Expanded (stride 0) input.
  Tensor row = fromVector<float>({-1.0f, 0.5f, 2.0f}).unsqueeze(0).expand({4, 3});
  EXPECT_EQ(vals(exp(row)), vals(exp(row.contiguous())));
}

TEST(Elementwise, IntegerInputsToFloatOpsComputeInFloat32) {
  Tensor i = fromVector<int64_t>({-2, 0, 1, 3});
  // torch.exp(torch.tensor([-2, 0, 1, 3])) etc., float32 results.
  Tensor e = exp(i);
  EXPECT_EQ(e.dtype(), DType::Float32);
  EXPECT_TRUE(close(vals(e), {0.1353352832366127, 1.0, 2.718281828459045, 20.085536923187668}, 3e-7));
  EXPECT_EQ(sigmoid(i).dtype(), DType::Float32);
  EXPECT_TRUE(close(vals(sigmoid(i)), {0.11920292202211755, 0.5, 0.7310585786300049, 0.9525741268224334}, 3e-7));
  EXPECT_EQ(sqrt(fromVector<int32_t>({4, 9})).dtype(), DType::Float32);
  EXPECT_EQ(vals(sqrt(fromVector<int32_t>({4, 9}))), (std::vector<double>{2, 3}));
  EXPECT_EQ(log(fromVector<uint8_t>({1})).dtype(), DType::Float32);
  EXPECT_EQ(tanh(fromVector<bool>({true, false})).dtype(), DType::Float32);
  // abs and relu keep integer dtypes.
  Tensor a = abs(fromVector<int32_t>({-3, 0, 5}));
  EXPECT_EQ(a.dtype(), DType::Int32);
  EXPECT_EQ(a.toVector<int32_t>(), (std::vector<int32_t>{3, 0, 5}));
  Tensor r = relu(fromVector<int64_t>({-3, 0, 5}));
  EXPECT_EQ(r.dtype(), DType::Int64);
  EXPECT_EQ(r.toVector<int64_t>(), (std::vector<int64_t>{0, 0, 5}));
}

TEST(Elementwise, SpecialValues) {
  Tensor s = make({kInf, -kInf, kNaN, 0.0, -0.0}, DType::Float32);
  EXPECT_TRUE(close(vals(exp(s)), {kInf, 0.0, kNaN, 1.0, 1.0}, 0));
  EXPECT_TRUE(close(vals(log(s)), {kInf, kNaN, kNaN, -kInf, -kInf}, 0));
  EXPECT_TRUE(close(vals(sqrt(s)), {kInf, kNaN, kNaN, 0.0, 0.0}, 0));
  EXPECT_TRUE(close(vals(rsqrt(s)), {0.0, kNaN, kNaN, kInf, -kInf}, 0));
  EXPECT_TRUE(close(vals(tanh(s)), {1.0, -1.0, kNaN, 0.0, 0.0}, 0));
  EXPECT_TRUE(close(vals(sigmoid(s)), {1.0, 0.0, kNaN, 0.5, 0.5}, 0));
  EXPECT_TRUE(close(vals(relu(s)), {kInf, 0.0, kNaN, 0.0, 0.0}, 0));
  EXPECT_TRUE(close(vals(gelu(s)), {kInf, kNaN, kNaN, 0.0, 0.0}, 0));  // -inf * 0 = nan, as torch
  EXPECT_TRUE(close(vals(silu(s)), {kInf, kNaN, kNaN, 0.0, 0.0}, 0));
  EXPECT_TRUE(close(vals(abs(s)), {kInf, kInf, kNaN, 0.0, 0.0}, 0));
  EXPECT_FALSE(std::signbit(vals(abs(make({-0.0}, DType::Float32)))[0]));
  EXPECT_TRUE(std::signbit(vals(tanh(make({-0.0}, DType::Float32)))[0]));
  // Large arguments: exp overflows to inf and underflows through the subnormals to 0.
  Tensor big = make({88.0, 89.0, -87.0, -100.0, -104.0, -200.0}, DType::Float32);
  EXPECT_TRUE(close(vals(exp(big)), {std::exp(88.0), kInf, std::exp(-87.0), std::exp(-100.0), 0.0, 0.0}, 2e-6, 2e-45));
  // sigmoid of a large negative number is tiny, not 0/nan.
  EXPECT_TRUE(close(vals(sigmoid(make({-80.0, 80.0}, DType::Float32))), {1.8048513878454153e-35, 1.0}, 1e-6));
}

TEST(Elementwise, PowScalarAndTensor) {
  // torch.pow(torch.tensor([1, 2, 3]), 3) -> int64 [1, 8, 27]; ints to negative powers refused.
  Tensor i = fromVector<int64_t>({1, 2, 3, -2});
  Tensor p = pow(i, 3);
  EXPECT_EQ(p.dtype(), DType::Int64);
  EXPECT_EQ(p.toVector<int64_t>(), (std::vector<int64_t>{1, 8, 27, -8}));
  EXPECT_THROW(pow(i, -1), ValueError);
  // Integer tensor to a float power -> float32: torch.pow(torch.tensor([1,2,3,-2]), 0.5)
  Tensor pf = pow(i, 0.5);
  EXPECT_EQ(pf.dtype(), DType::Float32);
  EXPECT_TRUE(close(vals(pf), {1.0, 1.4142135623730951, 1.7320508075688772, kNaN}, 2e-7));
  // Bool to an integer power -> int64 (torch.pow(torch.tensor([True, False]), 2)).
  EXPECT_EQ(pow(fromVector<bool>({true, false}), 2).dtype(), DType::Int64);
  // Tensor exponent with broadcasting: torch.pow(a[:, None], b) for a = [2, 0.5], b = [-1, 0, 3].
  Tensor a = fromVector<float>({2.0f, 0.5f}, {2, 1});
  Tensor b = fromVector<float>({-1.0f, 0.0f, 3.0f});
  Tensor ab = pow(a, b);
  EXPECT_EQ(ab.sizes(), (Shape{2, 3}));
  EXPECT_EQ(vals(ab), (std::vector<double>{0.5, 1.0, 8.0, 2.0, 1.0, 0.125}));
  // Integer tensor ^ integer tensor, negative exponents as torch: only 1 and -1 survive.
  Tensor ib = pow(fromVector<int64_t>({-2, -1, 0, 1, 2}), fromVector<int64_t>({-1, -1, -1, -1, -1}));
  EXPECT_EQ(ib.toVector<int64_t>(), (std::vector<int64_t>{0, -1, 0, 1, 0}));
  EXPECT_EQ(pow(fromVector<int32_t>({3}), fromVector<int32_t>({4})).toVector<int32_t>(), (std::vector<int32_t>{81}));
  // IEEE special cases follow std::pow.
  std::vector<double> xs = {-2.0, -0.0, 0.0, 1.0, -1.0, kInf, -kInf, kNaN, 0.5, -8.0};
  std::vector<double> ys = {0.5, 3.0, -1.0, kNaN, kInf, -2.0, 3.0, 0.0, -kInf, 1.0 / 3};
  Tensor r = pow(make(xs, DType::Float32), make(ys, DType::Float32));
  std::vector<double> want;
  for (size_t k = 0; k < xs.size(); ++k) want.push_back(std::pow(static_cast<float>(xs[k]), static_cast<float>(ys[k])));
  EXPECT_TRUE(close(vals(r), want, 0));
  EXPECT_TRUE(std::signbit(vals(pow(make({-0.0}, DType::Float32), 3.0))[0]));
  // float64 and bfloat16 keep their dtype.
  EXPECT_EQ(pow(make({2.0}, DType::Float64), 0.3).dtype(), DType::Float64);
  EXPECT_DOUBLE_EQ(vals(pow(make({2.0}, DType::Float64), 0.3))[0], std::pow(2.0, 0.3));
  EXPECT_EQ(pow(make({2.0}, DType::BFloat16), make({3.0}, DType::Float32)).dtype(), DType::Float32);
  EXPECT_THROW(pow(fromVector<bool>({true}), fromVector<bool>({true})), ValueError);
}

TEST(Elementwise, PowSmallIntegerScalarExponentsAreCorrectlyRounded) {
  // float32 x^k for integer |k| <= 8 is computed by products in double and one rounding
  // (core/ops/elementwise.cc): within 0.5 ulp (+ 2^-26) of the exact power, on a spread of
  // magnitudes from subnormal to near overflow, negative bases and signed zeros / infinities.
  std::vector<float> xs;
  for (float v = 1e-6f; v < 1e6f; v *= 1.0137f) {
    xs.push_back(v);
    xs.push_back(-v * 0.7071f);
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-40f,
                            -1e-40f,
                            3e38f,
                            -3e38f,
                            1e-30f};
  xs.insert(xs.end(), std::begin(specials), std::end(specials));
  Tensor x = fromVector<float>(xs);
  for (int k : {-8, -7, -5, -4, -3, 4, 5, 6, 7, 8}) {
    const std::vector<float> got = pow(x, k).toVector<float>();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = std::pow(static_cast<double>(xs[i]), k);  // exact for these in double but for rounding
      const float wf = static_cast<float>(want);
      if (std::isinf(wf) || wf == 0.0f) {
        EXPECT_EQ(got[i], wf) << xs[i] << "^" << k;
        EXPECT_EQ(std::signbit(got[i]), std::signbit(std::pow(xs[i], static_cast<float>(k)))) << xs[i] << "^" << k;
        continue;
      }
      const double a = std::abs(static_cast<double>(wf));
      const double ulp = a < std::numeric_limits<float>::min() ? std::numeric_limits<float>::denorm_min()
                                                               : std::nextafter(static_cast<float>(a), INFINITY) - a;
      EXPECT_LE(std::abs(got[i] - want) / ulp, 0.5 + 1.5e-8) << xs[i] << "^" << k;
    }
  }
  // float16/bfloat16 take the same kernel (compute in float, round once): torch.pow(
  // torch.tensor([1.5, -3.0], dtype=torch.bfloat16), 5) -> [7.59375, -243.0].
  EXPECT_EQ(vals(pow(make({1.5, -3.0}, DType::BFloat16), 5)), (std::vector<double>{7.59375, -243.0}));
  // float64 keeps the C library pow.
  EXPECT_DOUBLE_EQ(vals(pow(make({1.1}, DType::Float64), 7))[0], std::pow(1.1, 7));
}

TEST(Elementwise, Clamp) {
  Tensor x = make({-2.0, -0.5, 0.0, 0.7, 3.0, kNaN}, DType::Float32);
  EXPECT_TRUE(close(vals(clamp(x, -1.0, 1.0)), {-1.0, -0.5, 0.0, 0.7, 1.0, kNaN}, 1e-7));
  EXPECT_TRUE(close(vals(clamp(x, -1.0, std::nullopt)), {-1.0, -0.5, 0.0, 0.7, 3.0, kNaN}, 1e-7));
  EXPECT_TRUE(close(vals(clamp(x, std::nullopt, 0.5)), {-2.0, -0.5, 0.0, 0.5, 0.5, kNaN}, 1e-7));
  // min > max: every element becomes max (torch.clamp(x, 2, 1)).
  EXPECT_TRUE(close(vals(clamp(x, 2.0, 1.0)), {1, 1, 1, 1, 1, kNaN}, 0));
  // Integer tensors: integer bounds keep the dtype, a float bound gives float32
  // (torch.clamp(torch.tensor([1, 2, 3]), min=1.5) -> [1.5, 2., 3.]).
  Tensor i = fromVector<int64_t>({1, 2, 3});
  EXPECT_EQ(clamp(i, 2, std::nullopt).toVector<int64_t>(), (std::vector<int64_t>{2, 2, 3}));
  Tensor f = clamp(i, 1.5, std::nullopt);
  EXPECT_EQ(f.dtype(), DType::Float32);
  EXPECT_EQ(vals(f), (std::vector<double>{1.5, 2, 3}));
  EXPECT_EQ(vals(clamp(make({0.1, 5.0}, DType::BFloat16), 0.0, 1.0)),
            (std::vector<double>{static_cast<float>(BFloat16(0.1f)), 1.0}));
  try {
    clamp(x, std::nullopt, std::nullopt);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("clamp"), std::string::npos);
  }
}

TEST(Elementwise, WhereBroadcastsAllThree) {
  Tensor c = fromVector<bool>({true, false, true}, {3, 1});  // [3, 1]
  Tensor a = fromVector<float>({1, 2, 3, 4}, {1, 4});        // [1, 4]
  Tensor b = scalarTensor(-1.0, {.dtype = DType::Float64});  // [] promotes to float64
  Tensor w = where(c, a, b);
  EXPECT_EQ(w.sizes(), (Shape{3, 4}));
  EXPECT_EQ(w.dtype(), DType::Float64);
  EXPECT_EQ(vals(w), (std::vector<double>{1, 2, 3, 4, -1, -1, -1, -1, 1, 2, 3, 4}));
  // Integer operands stay integer; a non-contiguous condition.
  Tensor cond = fromVector<bool>({true, false, false, true}, {2, 2}).t();
  Tensor wi = where(cond, fromVector<int64_t>({1, 2, 3, 4}, {2, 2}), fromVector<int64_t>({0}));
  EXPECT_EQ(wi.toVector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 4}));
  EXPECT_THROW(where(fromVector<float>({1}), a, a), ValueError);
  try {
    where(fromVector<bool>({true, false}), fromVector<float>({1, 2, 3}), b);
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("where"), std::string::npos) << m;
    EXPECT_NE(m.find("[2]"), std::string::npos) << m;
    EXPECT_NE(m.find("[3]"), std::string::npos) << m;
  }
}

TEST(Elementwise, MaximumMinimum) {
  // torch.maximum / torch.minimum propagate NaN.
  Tensor a = make({1.0, kNaN, -3.0, 2.0}, DType::Float32);
  Tensor b = make({2.0, 0.0, kNaN, 2.0}, DType::Float32);
  EXPECT_TRUE(close(vals(maximum(a, b)), {2.0, kNaN, kNaN, 2.0}, 0));
  EXPECT_TRUE(close(vals(minimum(a, b)), {1.0, kNaN, kNaN, 2.0}, 0));
  // Broadcast and promotion: int [3] with float [2, 1].
  Tensor m = maximum(fromVector<int64_t>({0, 5, 10}), fromVector<float>({3.5f, 7.0f}, {2, 1}));
  EXPECT_EQ(m.dtype(), DType::Float32);
  EXPECT_EQ(vals(m), (std::vector<double>{3.5, 5, 10, 7, 7, 10}));
  EXPECT_EQ(minimum(fromVector<int32_t>({4, -2}), fromVector<int32_t>({1, 9})).toVector<int32_t>(),
            (std::vector<int32_t>{1, -2}));
  EXPECT_EQ(vals(maximum(make({1.5, -2.0}, DType::Float16), make({1.0, -1.0}, DType::Float16))),
            (std::vector<double>{1.5, -1.0}));
}

TEST(Elementwise, ComparisonsGiveBoolAndBroadcast) {
  Tensor a = fromVector<float>({1.0f, 2.0f, 3.0f});
  Tensor b = fromVector<int64_t>({2}, {1, 1});
  Tensor less = lt(a, b);
  EXPECT_EQ(less.dtype(), DType::Bool);
  EXPECT_EQ(less.sizes(), (Shape{1, 3}));
  EXPECT_EQ(less.toVector<bool>(), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(le(a, b).toVector<bool>(), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(gt(a, b).toVector<bool>(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(ge(a, b).toVector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(eq(a, b).toVector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(ne(a, b).toVector<bool>(), (std::vector<bool>{true, false, true}));
  // NaN compares unequal to everything, itself included.
  Tensor n = make({kNaN}, DType::Float64);
  EXPECT_FALSE(eq(n, n).item<bool>());
  EXPECT_TRUE(ne(n, n).item<bool>());
  EXPECT_FALSE(le(n, n).item<bool>());
  // A 0.1 float32 vs 0.1 float64 compare in float64: different (as torch).
  EXPECT_FALSE(eq(make({0.1}, DType::Float32), make({0.1}, DType::Float64)).item<bool>());
  // Members, a transposed operand and bool inputs.
  Tensor m = fromVector<int32_t>({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(m.t().gt(m).toVector<bool>(), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(eq(fromVector<bool>({true, false}), fromVector<bool>({true, true})).toVector<bool>(),
            (std::vector<bool>{true, false}));
  try {
    lt(fromVector<float>({1, 2, 3}), fromVector<float>({1, 2}));
    FAIL() << "expected an error";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("lt"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
  }
}

TEST(Elementwise, BadInputsGiveTypedErrors) {
  EXPECT_THROW(exp(Tensor()), ValueError);
  EXPECT_THROW(abs(fromVector<bool>({true})), ValueError);
  EXPECT_THROW(relu(fromVector<bool>({true})), ValueError);
  EXPECT_THROW(clamp(fromVector<bool>({true}), 0, 1), ValueError);
  EXPECT_THROW(maximum(fromVector<float>({1, 2}), fromVector<float>({1, 2, 3})), ValueError);
  EXPECT_THROW(pow(fromVector<float>({1, 2}), fromVector<float>({1, 2, 3})), ValueError);
}

TEST(Elementwise, HalfTypesComputeInFloatAndRoundOnce) {
  // Each result is the exact value of the op at the (half-precision) input, rounded once to the
  // half type: compare against double std:: results rounded to Half / BFloat16.
  std::vector<float> xs = {0.3f, -1.7f, 2.25f, 5.5f, 0.01f};
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(dtypeName(dt));
    auto round = [dt](double v) {
      float f = static_cast<float>(v);
      return dt == DType::Float16 ? static_cast<double>(static_cast<float>(Half(f)))
                                  : static_cast<double>(static_cast<float>(BFloat16(f)));
    };
    Tensor x = fromVector<float>(xs).to(dt);
    std::vector<double> in = vals(x);
    std::vector<double> wantExp, wantTanh, wantSig, wantSq;
    for (double v : in) {
      wantExp.push_back(round(std::exp(v)));
      wantTanh.push_back(round(std::tanh(v)));
      wantSig.push_back(round(1.0 / (1.0 + std::exp(-v))));
      wantSq.push_back(round(v * v));
    }
    EXPECT_EQ(vals(exp(x)), wantExp);
    EXPECT_EQ(vals(tanh(x)), wantTanh);
    EXPECT_EQ(vals(sigmoid(x)), wantSig);
    EXPECT_EQ(vals(pow(x, 2)), wantSq);
    EXPECT_EQ(exp(x).dtype(), dt);
  }
  Tensor bf = make({1.0, 2.0, 0.5, 1024.0}, DType::BFloat16);
  EXPECT_EQ(vals(sqrt(pow(bf, 2))), (std::vector<double>{1.0, 2.0, 0.5, 1024.0}));
}

TEST(Elementwise, LongHalfTensorsGiveTheElementLoopsBits) {
  // float16 binary and unary ops on contiguous tensors run block by block through the bulk
  // conversions; every element must still be the float result rounded once, as the element loop
  // gives it: lengths around the block size, a broadcast scalar operand, special values, and an
  // in-place op whose output is its input.
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    for (int64_t n : {int64_t{17}, int64_t{255}, int64_t{256}, int64_t{1000}}) {
      SCOPED_TRACE(fmt::format("{} n={}", dtypeName(dt), n));
      Generator g(11);
      Tensor a = (randn({n}, {}, &g) * 300.0).to(dt), b = randn({n}, {}, &g).to(dt);
      if (n > 4) {
        a.narrow(0, 0, 1).fill_(Scalar(std::numeric_limits<double>::infinity()));
        a.narrow(0, 1, 1).fill_(Scalar(std::numeric_limits<double>::quiet_NaN()));
        b.narrow(0, 2, 1).fill_(Scalar(0.0));
      }
      auto round = [dt](float v) {
        return dt == DType::Float16 ? static_cast<float>(Half(v)) : static_cast<float>(BFloat16(v));
      };
      const std::vector<double> av = vals(a), bv = vals(b);
      std::vector<double> sum, quot, scaled, rel;
      for (int64_t i = 0; i < n; ++i) {
        const float x = static_cast<float>(av[i]), y = static_cast<float>(bv[i]);
        sum.push_back(round(x + y));
        quot.push_back(round(x / y));
        scaled.push_back(round(x * 0.5f));
        rel.push_back(std::isnan(x) ? x : round(x > 0 ? x : 0.f));  // relu propagates NaN
      }
      auto same = [](const std::vector<double>& got, const std::vector<double>& want) {
        for (size_t i = 0; i < want.size(); ++i) {
          const bool nan = std::isnan(want[i]);
          if (nan ? !std::isnan(got[i]) : got[i] != want[i]) return false;
        }
        return got.size() == want.size();
      };
      EXPECT_TRUE(same(vals(add(a, b)), sum));
      EXPECT_TRUE(same(vals(div(a, b)), quot));
      EXPECT_TRUE(same(vals(mul(a, Scalar(0.5))), scaled));
      EXPECT_TRUE(same(vals(relu(a)), rel));
      Tensor c = a.clone();
      c.add_(b);
      EXPECT_TRUE(same(vals(c), sum));
    }
  }
}
