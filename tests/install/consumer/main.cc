// Uses the installed cohort: tensors, autograd, a Future and the config header, and checks the
// results (the exit status is the test's verdict).
#include <cohort/cohort.h>
#include <cohort/config.h>
#include <cohort/core/tensor/tensor.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace {

int failures = 0;

void expectNear(const char* what, double got, double want) {
  if (std::fabs(got - want) > 1e-9 * (1 + std::fabs(want))) {
    std::fprintf(stderr, "FAIL %s: got %.17g, want %.17g\n", what, got, want);
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace cohort;
  // y = sum(w * x + x * x) for w = [1, 2, 3], x = [4, 5, 6]:
  //   y = 4 + 10 + 18 + 16 + 25 + 36 = 109, dy/dw = x, dy/dx = w + 2x.
  Tensor w = fromVector<double>({1, 2, 3}).setRequiresGrad();
  Tensor x = fromVector<double>({4, 5, 6}).setRequiresGrad();
  Tensor y = (w * x + x * x).sum();
  expectNear("y", y.item<double>(), 109);
  y.backward();
  auto gw = w.grad().toVector<double>();
  auto gx = x.grad().toVector<double>();
  for (int i = 0; i < 3; ++i) {
    expectNear("dy/dw", gw[i], 4 + i);
    expectNear("dy/dx", gx[i], (1 + i) + 2 * (4 + i));
  }

  // A matrix product through BLAS: [[1,2],[3,4]] @ [[5],[6]] = [[17],[39]].
  Tensor m = matmul(fromVector<float>({1, 2, 3, 4}, {2, 2}), fromVector<float>({5, 6}, {2, 1}));
  auto mv = m.toVector<float>();
  expectNear("matmul[0]", mv.at(0), 17);
  expectNear("matmul[1]", mv.at(1), 39);

  // The shared Future type, chained.
  Future<int> f;
  Future<std::string> g = f.then([](Future<int> done) { return std::to_string(done.value() * 2); });
  f.setValue(21);
  if (g.value() != "42") {
    std::fprintf(stderr, "FAIL future: got %s\n", g.value().c_str());
    ++failures;
  }

  // Errors are typed and carry the op's shapes.
  try {
    (void)(fromVector<float>({1, 2, 3}) + fromVector<float>({1, 2}));
    std::fprintf(stderr, "FAIL: adding shapes [3] and [2] did not throw\n");
    ++failures;
  } catch (const ValueError& e) {
    if (std::string(e.what()).find("[3]") == std::string::npos) {
      std::fprintf(stderr, "FAIL: error message does not name the shape: %s\n", e.what());
      ++failures;
    }
  }

  std::printf("cohort %s (gloo %d, mpi %d, cuda %d): %s\n", COHORT_VERSION, COHORT_USE_GLOO, COHORT_USE_MPI,
              COHORT_USE_CUDA, failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
