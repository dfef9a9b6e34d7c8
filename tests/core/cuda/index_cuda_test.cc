// Indexing ops, embedding and dropout on a GPU against the CPU on the same inputs: index_select,
// gather, scatter_add (and their backwards), masked_fill, tril/triu, one_hot, embedding forward and
// backward, and dropout masks from the same generator state. All bit-identical (the kernels add
// in the CPU's order), for every dtype the op takes; bad indices give the CPU's IndexError. The
// tests that need a GPU skip without one; the last ones run anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <cohort/core/ops/dispatch.h>

#include "core/cuda/cuda_test_util.h"
#include "core/test_util.h"

namespace cohort {
namespace {

using testing::expectBitEqual;

using testing::kFloatTypes;
using testing::values;
const std::vector<DType> kAllTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                      DType::Int64,   DType::Int32,   DType::UInt8,   DType::Bool};

Tensor cuda(const Tensor& t) { return t.to(Device::cuda()); }

std::string name(DType dt, const std::string& what) { return fmt::format("{} {}", dt, what); }

Tensor indices(const std::vector<int64_t>& v, DType dt = DType::Int64, const Shape& s = {}) {
  return fromVector<int64_t>(v, s.empty() ? Shape{static_cast<int64_t>(v.size())} : s).to(dt);
}

// Random indices in [0, bound) of shape s.
Tensor randomIndices(const Shape& s, int64_t bound, DType dt = DType::Int64, uint64_t seed = 7) {
  Generator g(seed);
  return (rand(s, {}, &g) * static_cast<double>(bound)).to(DType::Int64).to(dt);
}

// ---- index_select --------------------------------------------------------------------------------

TEST(CudaIndex, IndexSelectEveryDtypeDimAndLayout) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    Tensor a = values({4, 5, 6}, dt);
    for (DType it : {DType::Int64, DType::Int32}) {
      for (int64_t dim = 0; dim < 3; ++dim) {
        Tensor idx = indices({3, 0, 3, 1}, it);
        expectBitEqual(indexSelect(cuda(a), dim, cuda(idx)), indexSelect(a, dim, idx),
                       name(dt, "dim " + std::to_string(dim)));
      }
    }
    // Non-contiguous input, 0-d index, empty index, 0-d input.
    Tensor at = a.transpose(0, 2);
    expectBitEqual(indexSelect(cuda(at), 1, cuda(indices({4, 4, 0}))), indexSelect(at, 1, indices({4, 4, 0})),
                   name(dt, "transposed"));
    Tensor i0 = scalarTensor(2, {.dtype = DType::Int64});
    expectBitEqual(indexSelect(cuda(a), 2, cuda(i0)), indexSelect(a, 2, i0), name(dt, "0-d index"));
    Tensor ie = empty({0}, {.dtype = DType::Int64});
    expectBitEqual(indexSelect(cuda(a), 1, cuda(ie)), indexSelect(a, 1, ie), name(dt, "empty index"));
    Tensor s = values({}, dt);
    Tensor z = fromVector<int64_t>({0}, {1});
    expectBitEqual(indexSelect(cuda(s), 0, cuda(z)), indexSelect(s, 0, z), name(dt, "0-d input"));
  }
}

TEST(CudaIndex, IndexSelectBackwardAddsInTheCpuOrder) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (int64_t dim : {0, 1}) {
      // Many repeats of few rows: long sums whose rounding depends on the order.
      Tensor idx = randomIndices({300}, dim == 0 ? 7 : 5, DType::Int32);
      Tensor a = values({7, 5}, dt).setRequiresGrad();
      Tensor ac = cuda(a.detach()).setRequiresGrad();
      Shape gs = dim == 0 ? Shape{300, 5} : Shape{7, 300};
      Tensor g = values(gs, dt, 3);
      indexSelect(a, dim, idx).backward(g);
      indexSelect(ac, dim, cuda(idx)).backward(cuda(g));
      expectBitEqual(ac.grad(), a.grad(), name(dt, "dim " + std::to_string(dim)));
    }
  }
}

// ---- gather / scatter_add ------------------------------------------------------------------------

TEST(CudaIndex, GatherEveryDtypeAndLayout) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    Tensor a = values({4, 5, 6}, dt);
    for (int64_t dim = 0; dim < 3; ++dim) {
      Shape is = {3, 4, 5};
      Tensor idx = randomIndices(is, a.sizes()[static_cast<size_t>(dim)], DType::Int64, 11 + dim);
      expectBitEqual(gather(cuda(a), dim, cuda(idx)), gather(a, dim, idx), name(dt, "dim " + std::to_string(dim)));
    }
    Tensor at = a.permute({2, 0, 1});  // [6, 4, 5], non-contiguous
    Tensor idx = randomIndices({6, 4, 2}, 5, DType::Int32);
    expectBitEqual(gather(cuda(at), 2, cuda(idx)), gather(at, 2, idx), name(dt, "permuted"));
    Tensor idxT = randomIndices({2, 4, 6}, 5).transpose(0, 2);  // non-contiguous index
    expectBitEqual(gather(cuda(at), 2, cuda(idxT)), gather(at, 2, idxT), name(dt, "transposed index"));
    Tensor s = values({}, dt);
    Tensor z = scalarTensor(0, {.dtype = DType::Int64});
    expectBitEqual(gather(cuda(s), 0, cuda(z)), gather(s, 0, z), name(dt, "0-d"));
    Tensor ie = empty({0, 5, 6}, {.dtype = DType::Int64});
    expectBitEqual(gather(cuda(a), 0, cuda(ie)), gather(a, 0, ie), name(dt, "empty"));
  }
}

TEST(CudaIndex, ScatterAddAndGatherBackward) {
  COHORT_REQUIRE_GPU();
  for (DType dt :
       {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64, DType::Int32, DType::UInt8}) {
    Tensor a = values({5, 6}, dt);
    for (int64_t dim : {0, 1}) {
      // Many collisions along dim: index larger than a along dim.
      Tensor idx = randomIndices({40, 6}, 5, DType::Int64, 5 + dim);
      if (dim == 1) idx = randomIndices({5, 40}, 6, DType::Int32, 9);
      Tensor src = values(idx.sizes(), dt, 4);
      expectBitEqual(scatterAdd(cuda(a), dim, cuda(idx), cuda(src)), scatterAdd(a, dim, idx, src),
                     name(dt, "dim " + std::to_string(dim)));
    }
    // src larger than index, non-contiguous src.
    Tensor idx = randomIndices({3, 2}, 5);
    Tensor src = values({6, 4}, dt, 6).transpose(0, 1);  // [4, 6]
    expectBitEqual(scatterAdd(cuda(a), 0, cuda(idx), cuda(src)), scatterAdd(a, 0, idx, src), name(dt, "strided src"));
  }
  for (DType dt : kFloatTypes) {
    Tensor a = values({5, 6}, dt).setRequiresGrad();
    Tensor ac = cuda(a.detach()).setRequiresGrad();
    Tensor idx = randomIndices({50, 6}, 5);
    Tensor g = values({50, 6}, dt, 8);
    gather(a, 0, idx).backward(g);
    gather(ac, 0, cuda(idx)).backward(cuda(g));
    expectBitEqual(ac.grad(), a.grad(), name(dt, "gather backward"));
  }
}

// ---- masked_fill / tril / triu / one_hot ---------------------------------------------------------

TEST(CudaIndex, MaskedFillBroadcastAndStrided) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    Tensor a = values({4, 6}, dt);
    Tensor mask = values({4, 6}, DType::Bool, 2);
    Scalar v = dt == DType::Bool ? Scalar(true) : Scalar(2.5);
    expectBitEqual(maskedFill(cuda(a), cuda(mask), v), maskedFill(a, mask, v), name(dt, "same shape"));
    Tensor row = values({6}, DType::Bool, 3);  // broadcast mask
    expectBitEqual(maskedFill(cuda(a), cuda(row), v), maskedFill(a, row, v), name(dt, "broadcast mask"));
    Tensor at = values({6, 4}, dt).transpose(0, 1);
    expectBitEqual(maskedFill(cuda(at), cuda(mask), v), maskedFill(at, mask, v), name(dt, "transposed input"));
    Tensor s = values({}, dt);
    Tensor m0 = values({}, DType::Bool, 5);
    expectBitEqual(maskedFill(cuda(s), cuda(m0), v), maskedFill(s, m0, v), name(dt, "0-d"));
    Tensor e = empty({0, 6}, {.dtype = dt});
    expectBitEqual(maskedFill(cuda(e), cuda(row), v), maskedFill(e, row, v), name(dt, "empty"));
  }
}

TEST(CudaIndex, TriangleAndOneHot) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kAllTypes) {
    Tensor a = values({2, 5, 7}, dt);
    for (int64_t k : {-2, 0, 3, 10}) {
      expectBitEqual(tril(cuda(a), k), tril(a, k), name(dt, "tril " + std::to_string(k)));
      expectBitEqual(triu(cuda(a), k), triu(a, k), name(dt, "triu " + std::to_string(k)));
    }
    Tensor at = a.transpose(1, 2);
    expectBitEqual(tril(cuda(at), 1), tril(at, 1), name(dt, "tril transposed"));
  }
  for (DType it : {DType::Int64, DType::Int32}) {
    Tensor idx = randomIndices({3, 4}, 6, it);
    expectBitEqual(oneHot(cuda(idx), -1), oneHot(idx, -1), "oneHot inferred");
    expectBitEqual(oneHot(cuda(idx), 9), oneHot(idx, 9), "oneHot 9 classes");
  }
}

// ---- bad indices ---------------------------------------------------------------------------------

// The same IndexError (type and message) on both devices, and the GPU stays usable afterwards.
template <typename F>
void expectSameIndexError(F&& op, const Tensor& a, const Tensor& idx, const std::string& part) {
  std::string cpu = testing::messageOf<IndexError>([&] { op(a, idx); });
  std::string gpu = testing::messageOf<IndexError>([&] { op(cuda(a), cuda(idx)); });
  EXPECT_EQ(gpu, cpu);
  EXPECT_TRUE(testing::contains(gpu, part)) << gpu;
}

TEST(CudaIndex, BadIndicesRaiseIndexErrorOnBothDevices) {
  COHORT_REQUIRE_GPU();
  Tensor a = values({4, 5}, DType::Float32);
  for (DType it : {DType::Int64, DType::Int32}) {
    Tensor tooBig = indices({0, 1, 7, 9}, it);  // the first bad one is named
    Tensor negative = indices({0, -1, 2}, it);
    auto sel = [](const Tensor& x, const Tensor& i) { return indexSelect(x, 0, i); };
    expectSameIndexError(sel, a, tooBig, "index 7 is out of range for dim 0 of size 4");
    expectSameIndexError(sel, a, negative, "index -1");
    auto gat = [](const Tensor& x, const Tensor& i) { return gather(x, 1, i.view({1, -1})); };
    expectSameIndexError(gat, a, tooBig, "index 7 is out of range for dim 1 of size 5");
    auto sca = [](const Tensor& x, const Tensor& i) {
      Tensor ii = i.view({1, -1});
      return scatterAdd(x, 1, ii, onesLike(ii).to(x.dtype()).to(x.device()));
    };
    expectSameIndexError(sca, a, tooBig, "scatterAdd: index 7");
    auto emb = [](const Tensor& w, const Tensor& i) { return nn::functional::embedding(i, w); };
    expectSameIndexError(emb, a, tooBig, "embedding: index 7 is out of range for a weight of shape [4, 5]");
    auto hot = [](const Tensor&, const Tensor& i) { return oneHot(i, 3); };
    expectSameIndexError(hot, a, indices({0, 5, 1}, it), "label 5 is out of range for 3 classes");
    expectSameIndexError(hot, a, negative, "label -1 at position 1 is negative");
  }
  // Still working: the error came from a host-side check, not a device fault.
  expectBitEqual(indexSelect(cuda(a), 0, cuda(indices({3}))), indexSelect(a, 0, indices({3})), "after errors");
}

// ---- embedding -----------------------------------------------------------------------------------

TEST(CudaEmbedding, ForwardAndDeterministicBackward) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (DType it : {DType::Int64, DType::Int32}) {
      Tensor w = values({11, 16}, dt).setRequiresGrad();
      Tensor wc = cuda(w.detach()).setRequiresGrad();
      // Heavy repetition (a padding-like row 0 in half the positions): order-sensitive sums.
      Tensor idx = randomIndices({8, 129}, 11, it, 21);
      idx =
          maskedFill(idx, randomIndices({8, 129}, 2, DType::Int64, 22).eq(scalarTensor(0, {.dtype = DType::Int64})), 0);
      Tensor out = nn::functional::embedding(idx, w);
      Tensor outc = nn::functional::embedding(cuda(idx), wc);
      expectBitEqual(outc, out, name(dt, "forward"));
      Tensor g = values({8, 129, 16}, dt, 23);
      out.backward(g);
      outc.backward(cuda(g));
      expectBitEqual(wc.grad(), w.grad(), name(dt, "backward"));
      // Twice: the same bits (no atomics).
      Tensor wc2 = cuda(w.detach()).setRequiresGrad();
      nn::functional::embedding(cuda(idx), wc2).backward(cuda(g));
      expectBitEqual(wc2.grad(), wc.grad().to(Device::cpu()), name(dt, "backward repeated"));
    }
  }
  // Non-contiguous indices, 0-d indices, empty indices, an empty weight.
  Tensor w = values({6, 3}, DType::Float32);
  Tensor idxT = randomIndices({4, 5}, 6).transpose(0, 1);
  expectBitEqual(nn::functional::embedding(cuda(idxT), cuda(w)), nn::functional::embedding(idxT, w), "transposed");
  Tensor i0 = scalarTensor(4, {.dtype = DType::Int64});
  expectBitEqual(nn::functional::embedding(cuda(i0), cuda(w)), nn::functional::embedding(i0, w), "0-d");
  Tensor ie = empty({0, 2}, {.dtype = DType::Int64});
  expectBitEqual(nn::functional::embedding(cuda(ie), cuda(w)), nn::functional::embedding(ie, w), "empty");
  Tensor wEmpty = values({6, 0}, DType::Float32);
  expectBitEqual(nn::functional::embedding(cuda(i0), cuda(wEmpty)), nn::functional::embedding(i0, wEmpty),
                 "empty rows");
}

// ---- dropout -------------------------------------------------------------------------------------

TEST(CudaDropout, SameGeneratorStateGivesTheSameMask) {
  COHORT_REQUIRE_GPU();
  for (DType dt : kFloatTypes) {
    for (double p : {0.1, 0.5, 0.9}) {
      for (int64_t n : {1, 3, 4, 1001, 70000}) {
        Tensor x = values({n}, dt);
        Generator gCpu(1234), gGpu(1234);
        // Advance both by one draw first, so the counter offset is tested too.
        nn::functional::dropout(values({5}, dt), p, true, &gCpu);
        nn::functional::dropout(cuda(values({5}, dt)), p, true, &gGpu);
        EXPECT_EQ(gCpu.state(), gGpu.state());
        Tensor want = nn::functional::dropout(x, p, true, &gCpu);
        Tensor got = nn::functional::dropout(cuda(x), p, true, &gGpu);
        expectBitEqual(got, want, name(dt, fmt::format("p {} n {}", p, n)));
        EXPECT_EQ(gCpu.state(), gGpu.state()) << "the same number of Philox blocks reserved";
      }
    }
  }
  // Non-contiguous input, 0-d and empty inputs.
  Tensor x = values({6, 5}, DType::Float32).transpose(0, 1);
  Generator a(9), b(9);
  expectBitEqual(nn::functional::dropout(cuda(x), 0.3, true, &b), nn::functional::dropout(x, 0.3, true, &a),
                 "transposed");
  Tensor s = values({}, DType::Float32);
  expectBitEqual(nn::functional::dropout(cuda(s), 0.3, true, &b), nn::functional::dropout(s, 0.3, true, &a), "0-d");
  Tensor e = empty({0, 3}, {.dtype = DType::Float32});
  expectBitEqual(nn::functional::dropout(cuda(e), 0.3, true, &b), nn::functional::dropout(e, 0.3, true, &a), "empty");
}

// ---- without a GPU -------------------------------------------------------------------------------

// Every op of this file has a CUDA kernel registered in a CUDA build; without CUDA, a CUDA tensor
// cannot be made at all, and the op names say what is missing.
TEST(CudaIndexNoGpu, KernelsAreRegisteredInCudaBuilds) {
  std::vector<std::string> ops = dispatch::opsWithKernels(DeviceType::CUDA);
  if (ops.empty()) GTEST_SKIP() << "this build has no CUDA kernels";
  for (const char* op : {"indexSelect", "indexSelect backward", "gather", "scatterAdd", "maskedFill", "tril", "triu",
                         "oneHot", "embedding", "embedding backward", "dropout", "SGD.step", "Adam.step", "AdamW.step"})
    EXPECT_NE(std::find(ops.begin(), ops.end(), op), ops.end()) << op << " has no CUDA kernel";
}

TEST(CudaIndexNoGpu, CpuPathsUnchangedByTheDispatch) {
  // The CPU results these kernels are compared against, checked by hand on a small case.
  Tensor a = arange(0, 6, 1, {.dtype = DType::Float32}).view({2, 3});
  Tensor idx = fromVector<int64_t>({2, 2, 0}, {3});
  EXPECT_EQ(indexSelect(a, 1, idx).toVector<float>(), (std::vector<float>{2, 2, 0, 5, 5, 3}));
  Tensor w = a.detach().setRequiresGrad();
  Tensor out = nn::functional::embedding(fromVector<int64_t>({1, 1, 0}, {3}), w);
  out.backward(onesLike(out));
  // Shape [2, 3] weight, indices 1, 1, 0: row 1 gets two rows of ones, row 0 one.
  EXPECT_EQ(w.grad().toVector<float>(), (std::vector<float>{1, 1, 1, 2, 2, 2}));
}

}  // namespace
}  // namespace cohort
