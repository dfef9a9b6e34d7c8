// Fused SGD and Adam/AdamW steps: one pass per parameter with the arithmetic of
// core/optim/detail/update_math.h, the CPU loop's, through intrinsics that nvcc never contracts
// into FMAs other than the explicit ones, so each element's result is bit-identical to the CPU's.
#include <cohort/core/cuda/detail/optim_kernels.h>
#include <cohort/core/cuda/detail/storage_types.cuh>

namespace cohort::cuda::detail {
namespace {

using optim::detail::AdamScalars;
using optim::detail::SgdScalars;
using storage::Elem;
using storage::gridFor;
using storage::kThreads;

// update_math.h's M on the device: correctly rounded operations, no contraction.
struct DeviceMath {
  __device__ static float fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
  __device__ static double fma(double a, double b, double c) { return __fma_rn(a, b, c); }
  __device__ static float mul(float a, float b) { return __fmul_rn(a, b); }
  __device__ static double mul(double a, double b) { return __dmul_rn(a, b); }
  __device__ static float div(float a, float b) { return __fdiv_rn(a, b); }
  __device__ static double div(double a, double b) { return __ddiv_rn(a, b); }
  __device__ static float add(float a, float b) { return __fadd_rn(a, b); }
  __device__ static double add(double a, double b) { return __dadd_rn(a, b); }
  __device__ static float sqrt(float a) { return __fsqrt_rn(a); }
  __device__ static double sqrt(double a) { return __dsqrt_rn(a); }
};
using M = DeviceMath;

template <typename T, bool kMomentum>
__global__ void sgdKernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
                          const SgdScalars s) {
  using A = typename Elem<T>::Acc;
  const A negLr = static_cast<A>(-s.lr), wd = static_cast<A>(s.weightDecay), mom = static_cast<A>(s.momentum);
  const A damp = static_cast<A>(1.0 - s.dampening);
  const A sign = s.maximize ? A(-1) : A(1);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const A pv = Elem<T>::load(p[i]);
    const A d = optim::detail::sgdDirection<M>(Elem<T>::load(g[i]), pv, sign, wd);
    A upd = d;
    if constexpr (kMomentum) {
      A b = s.firstStep ? d : optim::detail::sgdBuffer<M>(Elem<T>::load(buf[i]), d, mom, damp);
      const T stored = Elem<T>::store(b);
      buf[i] = stored;
      b = Elem<T>::load(stored);  // the buffer as kept in T, as on the CPU
      upd = s.nesterov ? optim::detail::sgdNesterov<M>(d, b, mom) : b;
    }
    p[i] = Elem<T>::store(optim::detail::sgdApply<M>(pv, negLr, upd));
  }
}

template <typename T, bool kDecoupled, bool kAmsgrad>
__global__ void adamKernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                           T* __restrict__ vmax, int64_t n, const AdamScalars s) {
  using A = typename Elem<T>::Acc;
  const A decay = static_cast<A>(s.decay), wd = static_cast<A>(s.wd);
  const A b1 = static_cast<A>(s.beta1), omb1 = static_cast<A>(s.oneMinusBeta1);
  const A b2 = static_cast<A>(s.beta2), omb2 = static_cast<A>(s.oneMinusBeta2);
  const A bc2 = static_cast<A>(s.bc2Sqrt), eps = static_cast<A>(s.eps), negStep = static_cast<A>(s.negStepSize);
  const A sign = s.maximize ? A(-1) : A(1);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const A pv = Elem<T>::load(p[i]);
    const A gv = optim::detail::adamGrad<M>(Elem<T>::load(g[i]), pv, sign, wd, kDecoupled);
    const A mv = optim::detail::adamExpAvg<M>(Elem<T>::load(m[i]), gv, b1, omb1);
    const A vv = optim::detail::adamExpAvgSq<M>(Elem<T>::load(v[i]), gv, b2, omb2);
    m[i] = Elem<T>::store(mv);
    v[i] = Elem<T>::store(vv);
    A denomSrc = vv;
    if constexpr (kAmsgrad) {
      const A mx = optim::detail::adamMax(Elem<T>::load(vmax[i]), vv);
      vmax[i] = Elem<T>::store(mx);
      denomSrc = mx;
    }
    const A denom = optim::detail::adamDenom<M>(denomSrc, bc2, eps);
    p[i] = Elem<T>::store(optim::detail::adamApply<M>(pv, mv, denom, negStep, decay, kDecoupled));
  }
}

}  // namespace

void launchSgdStep(ElemType type, void* p, const void* g, void* buf, int64_t n, const SgdScalars& s,
                   cudaStream_t stream) {
  if (n <= 0) return;
  storage::dispatchFloat(type, [&]<typename T>() {
    auto* pp = static_cast<T*>(p);
    auto* gp = static_cast<const T*>(g);
    auto* bp = static_cast<T*>(buf);
    if (bp != nullptr) sgdKernel<T, true><<<gridFor(n), kThreads, 0, stream>>>(pp, gp, bp, n, s);
    else sgdKernel<T, false><<<gridFor(n), kThreads, 0, stream>>>(pp, gp, bp, n, s);
  });
}

void launchAdamStep(ElemType type, void* p, const void* g, void* m, void* v, void* vmax, int64_t n,
                    const AdamScalars& s, cudaStream_t stream) {
  if (n <= 0) return;
  storage::dispatchFloat(type, [&]<typename T>() {
    auto* pp = static_cast<T*>(p);
    auto* gp = static_cast<const T*>(g);
    auto* mp = static_cast<T*>(m);
    auto* vp = static_cast<T*>(v);
    auto* xp = static_cast<T*>(vmax);
    const unsigned grid = gridFor(n);
    if (s.decoupled) {
      if (s.amsgrad) adamKernel<T, true, true><<<grid, kThreads, 0, stream>>>(pp, gp, mp, vp, xp, n, s);
      else adamKernel<T, true, false><<<grid, kThreads, 0, stream>>>(pp, gp, mp, vp, xp, n, s);
    } else {
      if (s.amsgrad) adamKernel<T, false, true><<<grid, kThreads, 0, stream>>>(pp, gp, mp, vp, xp, n, s);
      else adamKernel<T, false, false><<<grid, kThreads, 0, stream>>>(pp, gp, mp, vp, xp, n, s);
    }
  });
}

}  // namespace cohort::cuda::detail
