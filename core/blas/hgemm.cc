// oneDNN's matmul primitive and what runs on it: half-width GEMM (blas::hgemm, oneDNN's matmul or
// A and B widened to float32, chosen once per type; blas.h says how) and float32 GEMM with a bias
// (blas::sgemmBias).
#include <cpuid.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

// oneDNN's C API, for the types and signatures of its matmul primitive (Debian's libdnnl-dev); the
// functions themselves are looked up in the library cohort loads, so nothing links against it.
#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <oneapi/dnnl/dnnl.h>
#define COHORT_BLAS_HAVE_DNNL_API 1
#else
#define COHORT_BLAS_HAVE_DNNL_API 0
#endif

#include <cohort/core/blas/blas.h>
#include <cohort/core/blas/detail/loader.h>
#include <cohort/core/tensor/half.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/env.h>
#include <cohort/core/util/logging.h>

namespace cohort::blas {
namespace {

using detail::applyOmpThreads;
using detail::checkArgs;
using detail::Dnnl;
using detail::dnnlLoad;
using detail::DnnlLoad;
using detail::scaleC;
using detail::statusName;

COHORT_ENV_KNOB(kHgemmKnob, "COHORT_HGEMM", "auto",
                "How bfloat16/float16 GEMM runs: auto (oneDNN's matmul when its kernel for the type is an AMX one, "
                "else widened), onednn (oneDNN whenever it has a non-reference matmul), or widen (always widen to "
                "float32 and run the float32 GEMM).");

// ---- half-width GEMM ---------------------------------------------------------------------------

const char* halfName(HalfType t) { return t == HalfType::BFloat16 ? "bfloat16" : "float16"; }

// Widens rows x cols of a half matrix (row stride ld) into a dense float32 buffer.
[[gnu::noinline]] void widen(HalfType t, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * ld;
    float* d = dst + r * cols;
    if (t == HalfType::Float16) halfToFloatN(reinterpret_cast<const cohort::Half*>(s), d, cols);
    else bfloat16ToFloatN(reinterpret_cast<const BFloat16*>(s), d, cols);
  }
}

// Rounds a dense float32 [rows, cols] buffer into a half matrix with row stride ld.
// (GCC 12 claims floatToHalfN's tail loop overflows here, for a count it cannot bound; it is a
// false positive of -Waggressive-loop-optimizations, silenced for this function only.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
[[gnu::noinline]] void narrow(HalfType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * cols;
    uint16_t* d = dst + r * ld;
    if (t == HalfType::Float16) floatToHalfN(s, reinterpret_cast<cohort::Half*>(d), cols);
    else floatToBFloat16N(s, reinterpret_cast<BFloat16*>(d), cols);
  }
}
#pragma GCC diagnostic pop

void hgemmWidened(HalfType t, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  // A and B widened whole (O(mk + kn) work against O(mnk) for the product) into per-thread
  // buffers that are reused from call to call.
  thread_local std::vector<float> wa, wb, wc;
  int64_t aRows = ta == Trans::No ? m : k, aCols = ta == Trans::No ? k : m;
  int64_t bRows = tb == Trans::No ? k : n, bCols = tb == Trans::No ? n : k;
  wa.resize(static_cast<size_t>(aRows * aCols));
  wb.resize(static_cast<size_t>(bRows * bCols));
  widen(t, a, aRows, aCols, lda, wa.data());
  widen(t, b, bRows, bCols, ldb, wb.data());
  if (cFloat32) {
    sgemm(ta, tb, m, n, k, alpha, wa.data(), aCols, wb.data(), bCols, beta, static_cast<float*>(c), ldc);
    return;
  }
  wc.resize(static_cast<size_t>(m * n));
  if (beta != 0.f) widen(t, static_cast<const uint16_t*>(c), m, n, ldc, wc.data());
  sgemm(ta, tb, m, n, k, alpha, wa.data(), aCols, wb.data(), bCols, beta, wc.data(), n);
  narrow(t, wc.data(), m, n, static_cast<uint16_t*>(c), ldc);
}

#if COHORT_BLAS_HAVE_DNNL_API

// oneDNN's matmul primitive, reached through the library dnnlLoad() opened.
struct DnnlMatmul {
  decltype(&dnnl_engine_create) engineCreate = nullptr;
  decltype(&dnnl_stream_create) streamCreate = nullptr;
  decltype(&dnnl_stream_wait) streamWait = nullptr;
  decltype(&dnnl_memory_desc_init_by_strides) mdInit = nullptr;
  decltype(&dnnl_matmul_desc_init) matmulInit = nullptr;
  decltype(&dnnl_primitive_attr_create) attrCreate = nullptr;
  decltype(&dnnl_primitive_attr_destroy) attrDestroy = nullptr;
  decltype(&dnnl_primitive_attr_set_output_scales) attrScales = nullptr;
  decltype(&dnnl_primitive_attr_set_post_ops) attrPostOps = nullptr;
  decltype(&dnnl_primitive_attr_set_scratchpad_mode) attrScratchpad = nullptr;
  decltype(&dnnl_primitive_desc_query_md) pdQueryMd = nullptr;
  decltype(&dnnl_memory_desc_get_size) mdSize = nullptr;
  decltype(&dnnl_post_ops_create) postOpsCreate = nullptr;
  decltype(&dnnl_post_ops_destroy) postOpsDestroy = nullptr;
  decltype(&dnnl_post_ops_append_sum) postOpsSum = nullptr;
  decltype(&dnnl_primitive_desc_create) pdCreate = nullptr;
  decltype(&dnnl_primitive_desc_destroy) pdDestroy = nullptr;
  decltype(&dnnl_primitive_desc_query) pdQuery = nullptr;
  decltype(&dnnl_primitive_create) primCreate = nullptr;
  decltype(&dnnl_primitive_destroy) primDestroy = nullptr;
  decltype(&dnnl_primitive_execute) execute = nullptr;
  decltype(&dnnl_memory_create) memCreate = nullptr;
  decltype(&dnnl_memory_destroy) memDestroy = nullptr;
  decltype(&dnnl_memory_set_data_handle) memSetHandle = nullptr;
  const Dnnl* lib = nullptr;
  dnnl_engine_t engine = nullptr;
};

struct DnnlMatmulLoad {
  const DnnlMatmul* api = nullptr;
  std::string error;
};

const DnnlMatmulLoad& dnnlMatmulLoad() {
  static const DnnlMatmulLoad* l = [] {
    auto* out = new DnnlMatmulLoad();
    const DnnlLoad& d = dnnlLoad();
    if (d.lib == nullptr) {
      out->error = d.error;
      return out;
    }
    auto* api = new DnnlMatmul();
    api->lib = d.lib;
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(d.lib->handle, name));
      if (fn == nullptr) {
        ok = false;
        if (out->error.empty()) out->error = fmt::format("oneDNN has no {}", name);
      }
    };
    get(api->engineCreate, "dnnl_engine_create");
    get(api->streamCreate, "dnnl_stream_create");
    get(api->streamWait, "dnnl_stream_wait");
    get(api->mdInit, "dnnl_memory_desc_init_by_strides");
    get(api->matmulInit, "dnnl_matmul_desc_init");
    get(api->attrCreate, "dnnl_primitive_attr_create");
    get(api->attrDestroy, "dnnl_primitive_attr_destroy");
    get(api->attrScales, "dnnl_primitive_attr_set_output_scales");
    get(api->attrPostOps, "dnnl_primitive_attr_set_post_ops");
    get(api->attrScratchpad, "dnnl_primitive_attr_set_scratchpad_mode");
    get(api->pdQueryMd, "dnnl_primitive_desc_query_md");
    get(api->mdSize, "dnnl_memory_desc_get_size");
    get(api->postOpsCreate, "dnnl_post_ops_create");
    get(api->postOpsDestroy, "dnnl_post_ops_destroy");
    get(api->postOpsSum, "dnnl_post_ops_append_sum");
    get(api->pdCreate, "dnnl_primitive_desc_create");
    get(api->pdDestroy, "dnnl_primitive_desc_destroy");
    get(api->pdQuery, "dnnl_primitive_desc_query");
    get(api->primCreate, "dnnl_primitive_create");
    get(api->primDestroy, "dnnl_primitive_destroy");
    get(api->execute, "dnnl_primitive_execute");
    get(api->memCreate, "dnnl_memory_create");
    get(api->memDestroy, "dnnl_memory_destroy");
    get(api->memSetHandle, "dnnl_memory_set_data_handle");
    if (ok) {
      dnnl_status_t st = api->engineCreate(&api->engine, dnnl_cpu, 0);
      if (st != dnnl_success) {
        ok = false;
        out->error = fmt::format("oneDNN's CPU engine could not be created (status {})", statusName(st));
      }
    }
    if (!ok) {
      delete api;
      return out;
    }
    out->api = api;
    return out;
  }();
  return *l;
}

// One shape's primitive, built on first use and kept. A and B are `type` (or float32 with f32),
// C float32 with cFloat32 or f32; with bias a float32 [n] vector is added to every row. The BLAS
// thread count is part of the key: oneDNN sizes a primitive's work split (and so, for a large k,
// its summation order) for the OpenMP thread count at creation, so a primitive is only ever run
// with the count it was built for, and one job's results never depend on which thread count
// happened to build a shape first.
struct MatmulKey {
  HalfType type;
  bool cFloat32;
  Trans ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  bool f32 = false;
  bool bias = false;
  int threads = 1;
  bool operator==(const MatmulKey& o) const {
    return type == o.type && cFloat32 == o.cFloat32 && ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k &&
           lda == o.lda && ldb == o.ldb && ldc == o.ldc && floatBits(alpha) == floatBits(o.alpha) &&
           floatBits(beta) == floatBits(o.beta) && f32 == o.f32 && bias == o.bias && threads == o.threads;
  }
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& key) const {
    size_t h = static_cast<size_t>(key.type) * 2 + static_cast<size_t>(key.cFloat32);
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(key.threads) * 4 + static_cast<uint64_t>(key.f32) * 2 + static_cast<uint64_t>(key.bias));
    mix(static_cast<uint64_t>(key.ta) * 2 + static_cast<uint64_t>(key.tb));
    mix((static_cast<uint64_t>(floatBits(key.alpha)) << 32) | floatBits(key.beta));
    return h;
  }
};

// A primitive's scratch memory is the caller's (oneDNN's user scratchpad mode): with the library's
// own, primitives run at once from several threads (ranks that are threads, RPC workers) overwrote
// each other's scratch and came out wrong or different from run to run.
struct MatmulPrim {
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_desc_t a{}, b{}, c{}, bias{}, scratch{};
  size_t scratchBytes = 0;
  std::string impl;  // oneDNN's implementation name, e.g. "brg:avx512_core_bf16"
};

// Builds the primitive for `key`; null with `why` set when oneDNN has no implementation for it.
std::shared_ptr<MatmulPrim> buildMatmul(const DnnlMatmul& api, const MatmulKey& key, std::string* why) {
  auto p = std::make_shared<MatmulPrim>();
  const char* typeName = key.f32 ? "float32" : halfName(key.type);
  dnnl_data_type_t in = key.f32 ? dnnl_f32 : key.type == HalfType::BFloat16 ? dnnl_bf16 : dnnl_f16;
  dnnl_data_type_t outType = key.cFloat32 || key.f32 ? dnnl_f32 : in;
  dnnl_dims_t aDims = {key.m, key.k}, bDims = {key.k, key.n}, cDims = {key.m, key.n}, biasDims = {1, key.n};
  dnnl_dims_t aStr = {key.ta == Trans::No ? key.lda : 1, key.ta == Trans::No ? 1 : key.lda};
  dnnl_dims_t bStr = {key.tb == Trans::No ? key.ldb : 1, key.tb == Trans::No ? 1 : key.ldb};
  dnnl_dims_t cStr = {key.ldc, 1}, biasStr = {key.n, 1};
  dnnl_matmul_desc_t desc;
  if (api.mdInit(&p->a, 2, aDims, in, aStr) != dnnl_success || api.mdInit(&p->b, 2, bDims, in, bStr) != dnnl_success ||
      api.mdInit(&p->c, 2, cDims, outType, cStr) != dnnl_success ||
      (key.bias && api.mdInit(&p->bias, 2, biasDims, dnnl_f32, biasStr) != dnnl_success) ||
      api.matmulInit(&desc, &p->a, &p->b, key.bias ? &p->bias : nullptr, &p->c) != dnnl_success) {
    *why = "oneDNN rejected the matmul's memory layout";
    return nullptr;
  }
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t postOps = nullptr;
  api.attrCreate(&attr);
  api.attrScratchpad(attr, dnnl_scratchpad_mode_user);
  if (key.alpha != 1.f) api.attrScales(attr, 1, 0, &key.alpha);
  if (key.beta != 0.f) {
    api.postOpsCreate(&postOps);
    api.postOpsSum(postOps, key.beta);
    api.attrPostOps(attr, postOps);
  }
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_status_t st = api.pdCreate(&pd, &desc, attr, api.engine, nullptr);
  if (postOps) api.postOpsDestroy(postOps);
  api.attrDestroy(attr);
  if (st != dnnl_success) {
    *why = fmt::format("oneDNN has no {} matmul on this CPU (status {})", typeName, statusName(st));
    return nullptr;
  }
  const char* impl = nullptr;
  if (api.pdQuery(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) p->impl = impl;
  if (const dnnl_memory_desc_t* scratch = api.pdQueryMd(pd, dnnl_query_scratchpad_md, 0)) {
    p->scratch = *scratch;
    p->scratchBytes = api.mdSize(scratch);
  }
  st = api.primCreate(&p->prim, pd);
  api.pdDestroy(pd);
  if (st != dnnl_success) {
    *why = fmt::format("oneDNN could not create its {} matmul (status {})", typeName, statusName(st));
    return nullptr;
  }
  return p;
}

// Built primitives, most recently used first; at most kMatmulCacheSize are kept.
constexpr size_t kMatmulCacheSize = 512;
struct MatmulCache {
  std::mutex mu;
  std::list<std::pair<MatmulKey, std::shared_ptr<MatmulPrim>>> order;
  std::unordered_map<MatmulKey, decltype(order)::iterator, MatmulKeyHash> index;
};

MatmulCache& matmulCache() {
  static auto* cache = new MatmulCache();  // never destroyed: primitives may be in use at exit
  return *cache;
}

std::shared_ptr<MatmulPrim> cachedMatmul(const DnnlMatmul& api, const MatmulKey& key, std::string* why) {
  MatmulCache& cache = matmulCache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.index.find(key);
    if (it != cache.index.end()) {
      cache.order.splice(cache.order.begin(), cache.order, it->second);
      return it->second->second;
    }
  }
  std::shared_ptr<MatmulPrim> p = buildMatmul(api, key, why);
  if (!p) return nullptr;
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.index.find(key);
  if (it != cache.index.end()) return it->second->second;  // another thread built it meanwhile
  cache.order.emplace_front(key, p);
  cache.index[key] = cache.order.begin();
  if (cache.order.size() > kMatmulCacheSize) {
    auto& last = cache.order.back();
    cache.index.erase(last.first);
    // The primitive is destroyed when its last user lets go of it.
    cache.order.pop_back();
  }
  return p;
}

// Whether hgemm runs `t` on oneDNN: decided once per type, from the kernel oneDNN's matmul would
// run and the CPU's vendor, never from timing. oneDNN must have a non-reference matmul for it, and
// with COHORT_HGEMM=auto it must be either an AMX kernel (its implementation name says "amx"):
// AMX tiles multiply bf16 several times faster than the float32 FMA units; or, for bfloat16, its
// AVX512-BF16 kernel on an AMD CPU: Zen 4 issues the bf16 dot product at twice its float32 FMA
// rate (465 against 216 GFLOP/s widened at 1024^3 on one core, docs/benchmarks.md). Otherwise
// hgemm widens to float32 (the float32 GEMM plus an O(n^2) conversion): Intel's AVX512-BF16
// without AMX issues the bf16 dot product at the FMA rate, where widening is faster (117.7 against
// 79.1 GFLOP/s at 1024^3 on one core). The two paths sum in different orders, so a choice made by
// timing, which load can flip from run to run, would make two runs of one job round differently.
bool amdCpu() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
}

struct NativeProbe {
  bool ok = false;
  std::string why;   // why not, when !ok
  std::string impl;  // oneDNN's implementation name
  std::string how;   // how the choice was made, for describe()
};

bool runMatmul(const DnnlMatmul& api, MatmulKey key, const void* a, const void* b, const float* bias, void* c,
               std::string* why);

const NativeProbe& nativeProbe(HalfType t) {
  static const NativeProbe* probes[2] = {nullptr, nullptr};
  static std::once_flag once[2];
  int i = t == HalfType::BFloat16 ? 0 : 1;
  std::call_once(once[i], [&] {
    std::string mode = kHgemmKnob.str();
    if (mode != "auto" && mode != "onednn" && mode != "widen")  // (not remembered: every call says so)
      throw ValueError(fmt::format("environment variable COHORT_HGEMM='{}' is not one of auto, onednn, widen", mode));
    auto* p = new NativeProbe();
    probes[i] = p;
    if (mode == "widen") {
      p->why = "COHORT_HGEMM=widen";
      return;
    }
    const DnnlMatmulLoad& l = dnnlMatmulLoad();
    if (l.api == nullptr) {
      p->why = l.error;
      return;
    }
    constexpr int64_t kN = 512;
    MatmulKey key{t, false, Trans::No, Trans::No, kN, kN, kN, kN, kN, kN, 1.f, 0.f};
    std::shared_ptr<MatmulPrim> prim = buildMatmul(*l.api, key, &p->why);
    if (!prim) return;
    p->impl = prim->impl;
    l.api->primDestroy(prim->prim);
    if (mode == "onednn" && prim->impl.find("ref") == std::string::npos) {
      p->ok = true;
      p->how = "COHORT_HGEMM=onednn";
      return;
    }
    p->ok = detail::autoUsesOneDnn(t, prim->impl, amdCpu(), &p->how, &p->why);
    COHORT_LOG(Debug, "hgemm {}: {}", halfName(t), p->ok ? "oneDNN matmul, " + p->how : p->why);
  });
  return *probes[i];
}

// A primitive as one thread runs it: its memory objects are made once and pointed at each call's
// matrices (dnnl_memory_set_data_handle), so a call allocates nothing. For the small tiles of fused
// attention, creating and destroying four memory objects per call cost as much as the product.
struct ThreadMatmul {
  std::shared_ptr<MatmulPrim> prim;
  dnnl_memory_t a = nullptr, b = nullptr, c = nullptr, bias = nullptr, scratch = nullptr;
};

// The calling thread's primitives by key, in front of the shared cache (no lock on a hit). Holding
// a primitive here keeps it alive after the shared cache lets it go; past kThreadMatmuls entries the
// thread starts over.
constexpr size_t kThreadMatmuls = 256;
struct ThreadMatmuls {
  const DnnlMatmul* api = nullptr;
  std::unordered_map<MatmulKey, ThreadMatmul, MatmulKeyHash> map;
  void clear() {
    for (auto& [key, t] : map)
      for (dnnl_memory_t m : {t.a, t.b, t.c, t.bias, t.scratch})
        if (m) api->memDestroy(m);
    map.clear();
  }
  ~ThreadMatmuls() { clear(); }
};

// Runs `key`'s primitive on the calling thread's stream; false (nothing written) when oneDNN has no
// primitive for it, and then `why` says why. A failed execution is an Error.
bool runMatmul(const DnnlMatmul& api, MatmulKey key, const void* a, const void* b, const float* bias, void* c,
               std::string* why) {
  applyOmpThreads(*api.lib);  // the count the primitive is built for and run with
  key.threads = numThreads();
  thread_local ThreadMatmuls mine;
  mine.api = &api;
  auto it = mine.map.find(key);
  if (it == mine.map.end()) {
    std::shared_ptr<MatmulPrim> p = cachedMatmul(api, key, why);
    if (!p) return false;
    if (mine.map.size() >= kThreadMatmuls) mine.clear();
    ThreadMatmul t;
    t.prim = std::move(p);
    api.memCreate(&t.a, &t.prim->a, api.engine, DNNL_MEMORY_NONE);
    api.memCreate(&t.b, &t.prim->b, api.engine, DNNL_MEMORY_NONE);
    api.memCreate(&t.c, &t.prim->c, api.engine, DNNL_MEMORY_NONE);
    if (key.bias) api.memCreate(&t.bias, &t.prim->bias, api.engine, DNNL_MEMORY_NONE);
    if (t.prim->scratchBytes > 0) api.memCreate(&t.scratch, &t.prim->scratch, api.engine, DNNL_MEMORY_NONE);
    it = mine.map.emplace(key, t).first;
  }
  ThreadMatmul& t = it->second;
  thread_local dnnl_stream_t stream = [&] {
    dnnl_stream_t s = nullptr;
    dnnl_status_t st = api.streamCreate(&s, api.engine, dnnl_stream_default_flags);
    if (st != dnnl_success) throw Error(fmt::format("oneDNN could not create a stream (status {})", statusName(st)));
    return s;
  }();
  api.memSetHandle(t.a, const_cast<void*>(a));
  api.memSetHandle(t.b, const_cast<void*>(b));
  api.memSetHandle(t.c, c);
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, t.a}, {DNNL_ARG_WEIGHTS, t.b}, {DNNL_ARG_DST, t.c}};
  int nargs = 3;
  if (key.bias) {
    api.memSetHandle(t.bias, const_cast<float*>(bias));
    args[nargs++] = {DNNL_ARG_BIAS, t.bias};
  }
  if (t.scratch) {
    // This thread's scratch, grown as needed and kept (64-byte aligned).
    thread_local std::vector<std::max_align_t> scratch;
    thread_local void* aligned = nullptr;
    const size_t need = t.prim->scratchBytes + 64;
    if (scratch.size() * sizeof(std::max_align_t) < need) {
      scratch.assign((need + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t), std::max_align_t{});
      aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
    }
    api.memSetHandle(t.scratch, aligned);
    args[nargs++] = {DNNL_ARG_SCRATCHPAD, t.scratch};
  }
  dnnl_status_t st = api.execute(t.prim->prim, stream, nargs, args);
  if (st == dnnl_success) st = api.streamWait(stream);
  if (st != dnnl_success)
    throw Error(fmt::format("oneDNN's {} matmul failed with status {} for m={} n={} k={}",
                            key.f32 ? "float32" : halfName(key.type), statusName(st), key.m, key.n, key.k));
  return true;
}

void hgemmDnnl(const DnnlMatmul& api, const MatmulKey& key, const uint16_t* a, const uint16_t* b, void* c) {
  std::string why;
  if (!runMatmul(api, key, a, b, nullptr, c, &why))
    hgemmWidened(key.type, key.cFloat32, key.ta, key.tb, key.m, key.n, key.k, key.alpha, a, key.lda, b, key.ldb,
                 key.beta, c, key.ldc);
}

#endif  // COHORT_BLAS_HAVE_DNNL_API

// Whether the native path runs `t`, and why not.
bool nativeHalf(HalfType t, std::string* why) {
#if COHORT_BLAS_HAVE_DNNL_API
  const NativeProbe& p = nativeProbe(t);
  if (!p.ok && why) *why = p.why;
  return p.ok;
#else
  (void)t;
  if (why) *why = "cohort was built without oneDNN's headers (Debian package libdnnl-dev)";
  return false;
#endif
}

// How the native path runs `t`, for describe(): oneDNN's implementation and how it was chosen.
std::string nativeHalfDetails(HalfType t) {
#if COHORT_BLAS_HAVE_DNNL_API
  return fmt::format("{}; {}", nativeProbe(t).impl, nativeProbe(t).how);
#else
  (void)t;
  return "";
#endif
}

void hgemmChecked(bool native, HalfType t, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k,
                  float alpha, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c,
                  int64_t ldc) {
  checkArgs("hgemm", ta, tb, m, n, k, lda, ldb, ldc);
  COHORT_CHECK_T(ValueError, (a != nullptr || m * k == 0) && (b != nullptr || k * n == 0) && c != nullptr,
                 "hgemm: a null matrix pointer (m={} n={} k={})", m, n, k);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.f) {
    if (cFloat32) return scaleC(beta, static_cast<float*>(c), m, n, ldc);
    std::vector<float> tmp(static_cast<size_t>(m * n));
    if (beta != 0.f) widen(t, static_cast<const uint16_t*>(c), m, n, ldc, tmp.data());
    scaleC(beta, tmp.data(), m, n, n);
    narrow(t, tmp.data(), m, n, static_cast<uint16_t*>(c), ldc);
    return;
  }
#if COHORT_BLAS_HAVE_DNNL_API
  if (native) {
    MatmulKey key{t, cFloat32, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta};
    return hgemmDnnl(*dnnlMatmulLoad().api, key, a, b, c);
  }
#else
  (void)native;
#endif
  hgemmWidened(t, cFloat32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

namespace detail {

bool autoUsesOneDnn(HalfType t, const std::string& impl, bool amd, std::string* how, std::string* why) {
  auto set = [](std::string* out, std::string text) {
    if (out) *out = std::move(text);
  };
  // oneDNN's reference implementations are correct but far slower than widening to float32.
  if (impl.find("ref") != std::string::npos) {
    set(why, fmt::format("oneDNN's only {} matmul here is its reference implementation ({})", halfName(t), impl));
    return false;
  }
  if (impl.find("amx") != std::string::npos) {
    set(how, fmt::format("oneDNN's AMX kernel ({})", impl));
    return true;
  }
  if (t == HalfType::BFloat16 && amd && impl.find("avx512_core_bf16") != std::string::npos) {
    set(how, fmt::format("oneDNN's AVX512-BF16 kernel ({}) on an AMD CPU", impl));
    return true;
  }
  set(why, fmt::format("oneDNN's {} matmul here ({}) is neither an AMX kernel nor AVX512-BF16 on an AMD CPU "
                       "(COHORT_HGEMM=onednn would use it)",
                       halfName(t), impl));
  return false;
}

std::string halfDescription(HalfType t) {
  std::string why;
  if (nativeHalf(t, &why)) return fmt::format("oneDNN matmul ({})", nativeHalfDetails(t));
  return fmt::format("widened to float32 ({})", why);
}

}  // namespace detail

bool hgemmNative(HalfType type, std::string* why) { return nativeHalf(type, why); }

void hgemm(HalfType type, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
           const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  bool native = nativeHalf(type, nullptr);
  if (!native) {
    // Said once, at Info: the widened path runs at about float32 speed, which is either the best
    // this CPU offers (measured) or what a missing oneDNN leaves.
    static std::once_flag said[2];
    std::call_once(said[type == HalfType::BFloat16 ? 0 : 1], [type] {
      std::string why;
      nativeHalf(type, &why);
      COHORT_LOG(Info, "{} matrix products widen their inputs to float32 (about float32 speed): {}", halfName(type),
                 why);
    });
  }
  hgemmChecked(native, type, cFloat32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void hgemmFallback(HalfType type, bool cFloat32, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, float alpha,
                   const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  hgemmChecked(false, type, cFloat32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

// sgemmBias's and hgemmBias's argument checks (ValueError naming `op`); whether there is a C to write.
bool checkBiasArgs(const char* op, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                   int64_t ldc, const void* a, const void* b, const float* bias, const void* c) {
  checkArgs(op, ta, tb, m, n, k, lda, ldb, ldc);
  COHORT_CHECK_T(ValueError, (a != nullptr || m * k == 0) && (b != nullptr || k * n == 0) && c != nullptr,
                 "{}: a null matrix pointer (m={} n={} k={})", op, m, n, k);
  COHORT_CHECK_T(ValueError, bias != nullptr || n == 0, "{}: a null bias (n={})", op, n);
  return m > 0 && n > 0;
}

}  // namespace

void hgemmBias(HalfType type, Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
               const uint16_t* b, int64_t ldb, const float* bias, uint16_t* c, int64_t ldc) {
  if (!checkBiasArgs("hgemmBias", ta, tb, m, n, k, lda, ldb, ldc, a, b, bias, c)) return;
#if COHORT_BLAS_HAVE_DNNL_API
  if (k > 0 && nativeHalf(type, nullptr)) {
    MatmulKey key{type, false, ta, tb, m, n, k, lda, ldb, ldc, 1.f, 0.f};
    key.bias = true;
    std::string why;
    if (runMatmul(*dnnlMatmulLoad().api, key, a, b, bias, c, &why)) return;
  }
#endif
  std::vector<uint16_t> row(static_cast<size_t>(n));
  narrow(type, bias, 1, n, row.data(), n);
  for (int64_t i = 0; i < m; ++i) std::copy(row.begin(), row.end(), c + i * ldc);
  hgemm(type, false, ta, tb, m, n, k, 1.f, a, lda, b, ldb, 1.f, c, ldc);
}

void sgemmBias(Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, const float* bias, float* c, int64_t ldc) {
  if (!checkBiasArgs("sgemmBias", ta, tb, m, n, k, lda, ldb, ldc, a, b, bias, c)) return;
#if COHORT_BLAS_HAVE_DNNL_API
  // One BLAS thread only: with more, oneDNN's matmul starts an OpenMP team even for a small
  // product (dnnl_sgemm keeps those on the calling thread), and a process forked after that
  // hangs at its first parallel region.
  if (k > 0 && numThreads() == 1 && sgemmBackend() == Backend::OneDnn) {
    if (const DnnlMatmul* api = dnnlMatmulLoad().api) {
      MatmulKey key{HalfType::BFloat16, true, ta, tb, m, n, k, lda, ldb, ldc, 1.f, 0.f};
      key.f32 = true;
      key.bias = true;
      std::string why;
      if (runMatmul(*api, key, a, b, bias, c, &why)) return;
    }
  }
#endif
  for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, c + i * ldc);
  sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 1.f, c, ldc);
}

}  // namespace cohort::blas
