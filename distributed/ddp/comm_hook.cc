#include <cohort/distributed/ddp/comm_hook.h>

#include <cohort/core/ops/ops.h>
#include <cohort/core/util/check.h>

namespace cohort::dist {

Tensor GradBucket::gradient(size_t i) const {
  COHORT_CHECK(i < parameters.size(), "GradBucket::gradient({}) of a bucket with {} parameters", i, parameters.size());
  const Tensor& p = parameters[i];
  return buffer.narrow(0, offsets[i], p.numel()).view(p.sizes());
}

Future<Tensor> firstOutput(const WorkPtr& work) {
  return work->future().then([](Future<std::vector<Tensor>> f) -> Tensor { return f.value().at(0); });
}

namespace {

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  Future<Tensor> run(ProcessGroup& pg, GradBucket& bucket) override {
    return firstOutput(pg.allreduce(bucket.buffer, {.op = ReduceOp::Avg}));
  }
};

class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType wire) : wire_(wire) {}
  std::string name() const override { return wire_ == DType::Float16 ? "fp16_compress" : "bf16_compress"; }
  Future<Tensor> run(ProcessGroup& pg, GradBucket& bucket) override {
    if (bucket.buffer.dtype() == wire_) return firstOutput(pg.allreduce(bucket.buffer, {.op = ReduceOp::Avg}));
    Tensor compressed = bucket.buffer.to(wire_);
    Tensor out = bucket.buffer;
    return pg.allreduce(compressed, {.op = ReduceOp::Avg})->future().then([out](Future<std::vector<Tensor>> f) mutable {
      out.copy_(f.value().at(0));
      return out;
    });
  }

 private:
  DType wire_;
};

class FunctionHook final : public CommHook {
 public:
  FunctionHook(std::string name, std::function<Future<Tensor>(ProcessGroup&, GradBucket&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  Future<Tensor> run(ProcessGroup& pg, GradBucket& bucket) override { return fn_(pg, bucket); }

 private:
  std::string name_;
  std::function<Future<Tensor>(ProcessGroup&, GradBucket&)> fn_;
};

}  // namespace

CommHookPtr allreduceHook() { return std::make_shared<AllreduceHook>(); }
CommHookPtr fp16CompressHook() { return std::make_shared<CompressHook>(DType::Float16); }
CommHookPtr bf16CompressHook() { return std::make_shared<CompressHook>(DType::BFloat16); }

CommHookPtr makeCommHook(std::string name, std::function<Future<Tensor>(ProcessGroup&, GradBucket&)> fn) {
  COHORT_CHECK_T(ValueError, fn != nullptr, "makeCommHook(\"{}\"): the function is empty", name);
  return std::make_shared<FunctionHook>(std::move(name), std::move(fn));
}

}  // namespace cohort::dist
