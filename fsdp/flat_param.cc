#include <cohort/fsdp/flat_param.h>

#include <algorithm>

#include <fmt/format.h>

#include <cohort/core/autograd/grad_mode.h>
#include <cohort/core/autograd/node.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/profiler/record.h>
#include <cohort/core/util/check.h>
#include <cohort/core/util/error.h>
#include <cohort/core/util/logging.h>

namespace cohort::fsdp {

Tensor viewOfStorage(const std::shared_ptr<Storage>& storage, int64_t offset, const Shape& shape, DType dtype) {
  return Tensor(std::make_shared<TensorImpl>(storage, offset, shape, contiguousStrides(shape), dtype));
}

FlatParamHandle::FlatParamHandle(std::string label, std::vector<FlatParamInfo> params, FlatParamGroups groups,
                                 DType shardDtype, DType computeDtype, DType reduceDtype)
    : label_(std::move(label)), params_(std::move(params)), groups_(std::move(groups)), shardDtype_(shardDtype),
      computeDtype_(computeDtype), reduceDtype_(reduceDtype) {
  COHORT_CHECK(!params_.empty(), "FlatParamHandle '{}': a unit needs at least one parameter", label_);
  device_ = params_.front().param.device();
  autograd::NoGradGuard noGrad;
  for (auto& p : params_) {
    p.offset = numel_;
    p.numel = shapeNumel(p.shape);
    numel_ += p.numel;
  }
  const int64_t s = shardSize();
  paddedNumel_ = (numel_ + s - 1) / s * s;
  shardNumel_ = paddedNumel_ / s;
  const int64_t lo = shardRank() * shardNumel_, hi = lo + shardNumel_;

  // This rank's shard of the flat buffer, from the module's current values; padding is zero.
  shard_ = zeros({shardNumel_}, {.dtype = shardDtype_, .device = device_});
  for (auto& p : params_) {
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b < e) {
      Tensor src = p.param.detach().reshape({-1}).narrow(0, b - p.offset, e - b);
      shard_.narrow(0, b - lo, e - b).copy_(src);
    }
  }
  shard_.setRequiresGrad(true);
  setMemoryCategory(shard_, MemoryCategory::Parameters);

  aliased_ = s == 1 && computeDtype_ == shardDtype_;
  if (aliased_) {
    fullStorage_ = shard_.storage();
    gathered_ = true;
  } else {
    fullStorage_ = std::make_shared<Storage>(static_cast<size_t>(paddedNumel_) * elementSize(computeDtype_), device_);
    fullStorage_->setCategory(MemoryCategory::Parameters);  // kept across release and re-gather
    fullStorage_->release();
  }
  fullStorage_->setReleasedNote(fmt::format(
      "it is the full parameter buffer of FSDP unit '{}', which exists only while the unit runs forward and "
      "backward (the values live in the shards); read or write the full parameters inside "
      "FullyShardedDataParallel::SummonFullParams, or take fsdp::fullStateDict",
      label_));
  fullFlat_ = viewOfStorage(fullStorage_, 0, {paddedNumel_}, computeDtype_);
  const std::string note = fmt::format(
      "is managed by FullyShardedDataParallel (unit '{}'): its gradient goes to the unit's flat shard, not to "
      "its .grad; build the optimizer over the FSDP module's parameters() (the shards), and clip with "
      "FullyShardedDataParallel::clipGradNorm",
      label_);
  for (auto& p : params_) {
    // The parameter keeps its TensorImpl: every handle to it now views the flat buffer.
    nn::replaceTensorData(p.param, viewOfStorage(fullStorage_, p.offset, p.shape, computeDtype_));
    p.param.setGrad(Tensor());
    autograd::setManagedBy(p.param, note);
  }
}

void FlatParamHandle::checkParams() const {
  for (const auto& p : params_) {
    for (size_t k = 0; k < p.slots.size(); ++k) {
      const auto& [module, local] = p.slots[k];
      if (!module->hasParameter(local) || module->parameter(local).impl() != p.param.impl())
        throw ValueError(fmt::format(
            "FSDP unit '{}': parameter '{}' was replaced in its module after wrapping (replaceParameter); FSDP "
            "trains the tensor it wrapped, so the new one would never be trained. Replace parameters before "
            "wrapping the model",
            label_, p.names[k]));
    }
    const TensorImpl& impl = *p.param.impl();
    if (impl.storage != fullStorage_ || impl.offset != p.offset || impl.dtype != computeDtype_ ||
        impl.sizes != p.shape || !impl.contiguous)
      throw ValueError(fmt::format(
          "FSDP unit '{}': parameter '{}' no longer views the unit's flat buffer (its storage or dtype was changed "
          "after wrapping, e.g. by Module::to or replaceTensorData), so it would not be trained; convert the "
          "model before wrapping, or use FSDPOptions::mixedPrecision",
          label_, p.name));
  }
}

void FlatParamHandle::restParams() {
  for (auto& p : params_) {
    if (!p.param.impl()->autograd) continue;
    autograd::AutogradMeta& m = *p.param.impl()->autograd;
    m.gradFn = nullptr;
    m.outputNr = 0;
  }
}

FlatParamHandle::~FlatParamHandle() {
  // A gather or reduction still in flight writes into our buffers: let each finish first, also when the
  // other failed. A destructor must not throw, so a failure is logged with what it was.
  auto settle = [this](const auto& work, const char* what) {
    if (!work) return;
    try {
      work->wait();
    } catch (const std::exception& e) {
      COHORT_LOG(Warning, "FSDP flat parameter of {} parameters: the {} still in flight at destruction failed: {}",
                 params_.size(), what, e.what());
    } catch (...) {
      COHORT_LOG(Warning,
                 "FSDP flat parameter of {} parameters: the {} still in flight at destruction failed with a "
                 "non-standard exception",
                 params_.size(), what);
    }
  };
  settle(pending_, "parameter all-gather");
  settle(reducePending_, "gradient reduction");
}

int FlatParamHandle::shardSize() const { return groups_.shard ? groups_.shard->size() : 1; }
int FlatParamHandle::shardRank() const { return groups_.shard ? groups_.shard->rank() : 0; }

void FlatParamHandle::startGather() {
  if (aliased_ || gathered_ || pending_) return;
  autograd::NoGradGuard noGrad;
  if (fullStorage_->released())
    fullStorage_->reallocate(static_cast<size_t>(paddedNumel_) * elementSize(computeDtype_));
  gatherStartNs_ = profiler::detail::active() ? profiler::detail::nowNs() : 0;
  gatherInput_ = computeDtype_ == shardDtype_ ? shard_.detach() : shard_.detach().to(computeDtype_);
  if (shardSize() == 1) {
    fullFlat_.copy_(gatherInput_);
    gatherInput_ = Tensor();
    gathered_ = true;
    recordFsdp("gather", gatherStartNs_);
    return;
  }
  pending_ = groups_.shard->allgatherIntoTensor(fullFlat_, gatherInput_);
}

void FlatParamHandle::waitGather() {
  startGather();
  if (!pending_) return;
  dist::WorkPtr w = std::move(pending_);
  pending_ = nullptr;
  gatherInput_ = Tensor();
  w->wait();
  gathered_ = true;
  recordFsdp("gather", gatherStartNs_);
}

void FlatParamHandle::recordFsdp(const char* what, int64_t startNs) const {
  if (startNs == 0 || !profiler::detail::active()) return;
  profiler::detail::recordSpan(profiler::EventKind::Fsdp, fmt::format("FSDP {} {}", what, label_), "fsdp", startNs,
                               profiler::detail::nowNs(),
                               {profiler::Arg::str("unit", label_),
                                profiler::Arg::num("bytes",
                                                   paddedNumel_ * static_cast<int64_t>(elementSize(computeDtype_)))});
}

void FlatParamHandle::release() {
  if (aliased_) return;
  if (pending_) waitGather();
  if (!gathered_) return;
  fullStorage_->release();
  gathered_ = false;
  if (profiler::detail::active()) [[unlikely]]
    recordFsdp("free", profiler::detail::nowNs());
}

void FlatParamHandle::writeBackShard() {
  if (aliased_) return;
  waitGather();
  autograd::NoGradGuard noGrad;
  shard_.copy_(fullFlat_.narrow(0, static_cast<int64_t>(shardRank()) * shardNumel_, shardNumel_));
}

void FlatParamHandle::resetIteration() {
  reduced_ = false;
  ranForward = false;
  backwardGathered = false;
}

Tensor FlatParamHandle::startReduce(const std::vector<Tensor>& grads) {
  COHORT_CHECK(!reduced_, "FSDP unit '{}' reduced twice in one backward (does the unit run twice in one forward?)",
               label_);
  COHORT_CHECK_EQ(grads.size(), params_.size(), "FSDP unit '{}': one gradient per parameter", label_);
  reduced_ = true;
  reduceStartNs_ = profiler::detail::active() ? profiler::detail::nowNs() : 0;
  autograd::NoGradGuard noGrad;
  flatGrad_ = empty({paddedNumel_}, {.dtype = reduceDtype_, .device = device_});
  if (paddedNumel_ > numel_) flatGrad_.narrow(0, numel_, paddedNumel_ - numel_).zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    Tensor dst = flatGrad_.narrow(0, p.offset, p.numel).view(p.shape);
    if (grads[i].defined()) dst.copy_(grads[i]);
    else dst.zero_();
  }
  const bool shardReduce = shardSize() > 1;
  const bool replicate = groups_.replicate && groups_.replicate->size() > 1;
  gradShard_ = shardReduce ? empty({shardNumel_}, {.dtype = reduceDtype_, .device = device_}) : flatGrad_;
  gradOut_ = reduceDtype_ == shardDtype_ ? gradShard_ : empty({shardNumel_}, {.dtype = shardDtype_, .device = device_});
  if (shardReduce) {
    reducePending_ = groups_.shard->reduceScatterTensor(gradShard_, flatGrad_, {.op = dist::ReduceOp::Avg});
    reducePendingIsShard_ = true;
  } else if (replicate) {
    reducePending_ = groups_.replicate->allreduce(gradShard_, {.op = dist::ReduceOp::Avg});
    reducePendingIsShard_ = false;
  }
  Tensor out = gradOut_;
  if (!reducePending_) finishReduce();
  return out;
}

void FlatParamHandle::finishReduce() {
  if (!gradShard_.defined()) return;
  if (reducePending_) {
    dist::WorkPtr w = std::move(reducePending_);
    reducePending_ = nullptr;
    w->wait();
    if (reducePendingIsShard_ && groups_.replicate && groups_.replicate->size() > 1)
      groups_.replicate->allreduce(gradShard_, {.op = dist::ReduceOp::Avg})->wait();
  }
  flatGrad_ = Tensor();
  if (!gradOut_.isSameAs(gradShard_)) {
    autograd::NoGradGuard noGrad;
    gradOut_.copy_(gradShard_);
  }
  gradShard_ = Tensor();
  gradOut_ = Tensor();  // autograd holds it now (the shard's AccumulateGrad takes it without a copy)
  recordFsdp("reduce-scatter", reduceStartNs_);
}

}  // namespace cohort::fsdp
