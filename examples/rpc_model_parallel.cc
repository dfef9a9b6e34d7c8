// A model split across two workers with remote references: "stage0" holds the first half of an
// MLP, "stage1" the second. The driver never touches the activations between the stages: it asks
// stage0 for a remote reference to its output, passes that reference to stage1, which fetches the
// activations from stage0 itself, and the driver fetches only the final output. Every
// micro-batch's pipeline is issued asynchronously, so the two stages work on different
// micro-batches at once. The result is checked against the same model run in one process.
//
//   build-*/examples/rpc_model_parallel [--micro-batches 8]
//
// (Inference only: training across stages needs distributed autograd, which cohort does not have yet.)
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <CLI/CLI.hpp>

#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/ops.h>
#include <cohort/distributed/store/file_store.h>
#include <cohort/rpc/rpc.h>

using namespace cohort;

namespace {

// Both halves are built from fixed seeds, so every process (and the single-process check) has the
// same weights.
struct Stage {
  Generator gen;  // declared first: initialised before the layers draw from it
  nn::Linear a, b;
  Stage(uint64_t seed, int64_t in, int64_t hidden, int64_t out)
      : gen(seed), a(in, hidden, true, &gen), b(hidden, out, true, &gen) {}
  Tensor forward(const Tensor& x) { return b.forward(a.forward(x).relu()); }
};
Stage& stage0() {
  static Stage s(11, 32, 64, 64);
  return s;
}
Stage& stage1() {
  static Stage s(21, 64, 64, 10);
  return s;
}

void registerStages() {
  rpc::registerFunction("stage0_forward", [](Tensor x) { return stage0().forward(x).relu(); });
  // Takes a reference: the activations come straight from stage0, never through the driver.
  rpc::registerFunction("stage1_forward", [](rpc::RRef<Tensor> h) { return stage1().forward(h.toHere()); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a model split across two workers with RRefs"};
  int microBatches = 8;
  app.add_option("--micro-batches", microBatches, "micro-batches of 16 rows")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  registerStages();

  char tmpl[] = "/tmp/cohort_rpc_mp_XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto options = [&] {
    rpc::RpcOptions o;
    o.store = std::make_shared<dist::FileStore>(dir + "/store");
    return o;
  };
  const char* names[] = {"driver", "stage0", "stage1"};
  std::vector<pid_t> pids;
  for (int rank = 1; rank < 3; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      rpc::init(names[rank], rank, 3, options());
      rpc::shutdown();  // serves until the driver is done
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  rpc::init("driver", 0, 3, options());
  Generator gen(5);
  Tensor input = randn({int64_t{16} * microBatches, 32}, {}, &gen);
  std::vector<Future<Tensor>> outs;
  for (const Tensor& mb : input.chunk(microBatches, 0)) {
    rpc::RRef<Tensor> h = rpc::remote<Tensor>("stage0", "stage0_forward", mb.contiguous());
    rpc::RRef<Tensor> y = rpc::remote<Tensor>("stage1", "stage1_forward", h);
    outs.push_back(y.toHereAsync());
  }
  std::vector<Tensor> parts;
  for (auto& f : outs) parts.push_back(f.value());
  rpc::shutdown();
  int code = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 1;
  }
  std::filesystem::remove_all(dir);

  Tensor pipelined = cat(parts, 0);
  Tensor local = stage1().forward(stage0().forward(input).relu());
  double diff = pipelined.sub(local).abs().max().itemDouble();
  std::printf("%d micro-batches through stage0 -> stage1: output %s, max |pipelined - single process| = %g\n",
              microBatches, shapeStr(pipelined.sizes()).c_str(), diff);
  return code == 0 && diff < 1e-5 ? 0 : 1;
}
