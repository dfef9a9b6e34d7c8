/*
 * Autocast: mixed precision without rewriting the model. Inside a scope
 *
 *   {
 *     amp::Autocast guard(DeviceType::CPU, DType::BFloat16);   // or DType::Float16
 *     Tensor loss = functional::crossEntropy(model->forward(x), y);
 *   }
 *   loss.backward();
 *
 * each op on a tensor of that device type runs in the precision its policy gives it:
 *   LowerPrecision  matrix products, linear, conv2d, attention: float32 inputs are cast to the
 *                   scope's dtype (bfloat16 or float16) and the op runs there (float32 accumulation
 *                   inside the GEMM, see blas::hgemm);
 *   Float32         ops that lose accuracy in 16 bits (losses always; on CUDA also softmax,
 *                   log_softmax, layer_norm, exp, log, pow, rsqrt, sum, norm): half inputs are cast
 *                   to float32, so the output is float32;
 *   Promote         ops taking several floating tensors that must agree (cat, stack, layer_norm):
 *                   all are cast to the widest floating dtype among them;
 *   Passthrough     everything else runs in its inputs' dtype (binary ops still promote as always).
 * float64 tensors, integer tensors and tensors on other device types are never cast. The policy
 * is data: one table (policyTable()), one row per op with a class per device type, printable
 * (policyTableString()) and checked op by op against PyTorch 1.13's torch.autocast("cpu") in the
 * tests. The CPU column is PyTorch's CPU policy; the CUDA column is PyTorch's CUDA policy.
 *
 * Casts are ordinary differentiable ops, so the backward runs in the dtypes the forward chose and
 * a float32 weight gets a float32 gradient. A float32 leaf tensor that requires grad (a weight) is
 * cast once per scope: the cast is cached (keyed by tensor and version, so an in-place update
 * inside the scope is seen) until the outermost enabled scope on the thread ends.
 *
 * Scopes nest: an inner Autocast(device, dtype, {.enabled = false}) turns autocast off for its
 * extent, and each scope restores the state it found. The state is per thread, like PyTorch's:
 * work handed to another thread (a DataLoader worker, the RPC agent) does not inherit it. The
 * autograd engine runs backward functions with autocast off, whatever scope is open.
 *
 * How ops take part: the entry of each op whose class is not Passthrough on some device starts
 * with COHORT_AUTOCAST (below); when no scope is open that costs one thread-local load.
 */
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/core/tensor/tensor.h>

namespace cohort::amp {

enum class CastPolicy { Passthrough, LowerPrecision, Float32, Promote };
const char* castPolicyName(CastPolicy p);  // "passthrough", "lower_precision", "float32", "promote"

// One op's row: its name as cohort spells it (the function's name) and its class on each device.
struct OpPolicy {
  std::string_view op;
  CastPolicy cpu;
  CastPolicy cuda;
};

// Every differentiable math op of ops.h and functional.h, in a fixed order.
std::span<const OpPolicy> policyTable();
// The row for `op`; NotSupportedError when the table has no such op.
const OpPolicy& policyFor(std::string_view op);
// The table as aligned text, one op per line.
std::string policyTableString();

struct AutocastOptions {
  bool enabled = true;
  bool cacheEnabled = true;  // cache the casts of float32 leaf tensors that require grad
};

// RAII scope (see above). dtype must be BFloat16 or Float16 (ValueError otherwise); device must
// be CPU or CUDA.
class Autocast {
 public:
  explicit Autocast(DeviceType device = DeviceType::CPU, DType dtype = DType::BFloat16, AutocastOptions options = {});
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType device_;
  bool prevEnabled_;
  DType prevDType_;
  bool prevCache_;
};

// This thread's autocast settings, to re-establish where the work continues: activation
// checkpointing recomputes its forward under the settings the forward had, though the backward
// that runs it has autocast off.
struct AutocastState {
  bool enabled[kNumDeviceTypes] = {};
  DType dtype[kNumDeviceTypes] = {DType::BFloat16, DType::BFloat16};
  bool cacheEnabled = true;
};
AutocastState currentState();
// Puts `state` in force on this thread for its extent (not excluded, even inside a backward
// function), then restores everything it found.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& state);
  ~AutocastStateGuard();
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState prev_;
  unsigned prevFlags_;
  bool counted_;
};

// Whether autocast is on for `device` on this thread, and its dtype there.
bool isEnabled(DeviceType device = DeviceType::CPU);
DType autocastDType(DeviceType device = DeviceType::CPU);
// Number of cached weight casts on this thread (tests; 0 outside any scope).
size_t cachedCasts();

namespace detail {

// Bit 0: some device has autocast on; bit 1: excluded (inside an op already cast, or backward).
extern thread_local unsigned tlsState;
inline bool active() { return tlsState == 1u; }

// Turns autocast off on this thread for its extent (nested ops, backward functions).
class ExcludeGuard {
 public:
  ExcludeGuard() : prev_(tlsState) { tlsState |= 2u; }
  ~ExcludeGuard() { tlsState = prev_; }
  ExcludeGuard(const ExcludeGuard&) = delete;
  ExcludeGuard& operator=(const ExcludeGuard&) = delete;

 private:
  unsigned prev_;
};

// What an op's eligible tensors are cast to (nothing when !cast).
struct CastPlan {
  bool cast = false;
  DType target = DType::Float32;
  bool lower = false;  // LowerPrecision: leaf weights go through the cache
};

// Eligible: a defined floating tensor, not float64, on a device type with autocast on. `widest`
// becomes the promotion of the eligible dtypes seen (valid once `any`), `device` the first one's.
void collect(const Tensor& t, DType& widest, DeviceType& device, bool& any);
inline void collect(const std::vector<Tensor>& ts, DType& widest, DeviceType& device, bool& any) {
  for (const Tensor& t : ts) collect(t, widest, device, any);
}
template <typename T>
void collect(const T&, DType&, DeviceType&, bool&) {}

CastPlan plan(const OpPolicy& policy, DType widest, DeviceType device);
Tensor castTensor(const Tensor& t, const CastPlan& p);

inline Tensor castArg(const Tensor& t, const CastPlan& p) { return castTensor(t, p); }
inline std::vector<Tensor> castArg(const std::vector<Tensor>& ts, const CastPlan& p) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(castTensor(t, p));
  return out;
}
template <typename T>
requires(!std::is_same_v<std::decay_t<T>, Tensor> &&
         !std::is_same_v<std::decay_t<T>, std::vector<Tensor>>) const T& castArg(const T& v, const CastPlan&) {
  return v;
}

// Casts `args` by `policy` and calls `fn` with autocast excluded.
template <typename Fn, typename... Args>
decltype(auto) call(const OpPolicy& policy, Fn&& fn, const Args&... args) {
  DType widest = DType::Float32;
  DeviceType device = DeviceType::CPU;
  bool any = false;
  (collect(args, widest, device, any), ...);
  CastPlan p = any ? plan(policy, widest, device) : CastPlan{};
  ExcludeGuard exclude;
  if (!p.cast) return fn(args...);
  return fn(castArg(args, p)...);
}

}  // namespace detail
}  // namespace cohort::amp

// At the entry of op `name` (a string literal naming a row of the policy table), with the op's own
// function and its parameters: when autocast is on, re-enters the op with the arguments cast and
// autocast excluded, and returns its result.
#define COHORT_AUTOCAST(name, fn, ...)                                                                      \
  do {                                                                                                      \
    if (::cohort::amp::detail::active()) {                                                                  \
      static const ::cohort::amp::OpPolicy& cohortAutocastPolicy = ::cohort::amp::policyFor(name);          \
      return ::cohort::amp::detail::call(                                                                   \
          cohortAutocastPolicy, [&](const auto&... cohortArgs) { return fn(cohortArgs...); }, __VA_ARGS__); \
    }                                                                                                       \
  } while (0)
