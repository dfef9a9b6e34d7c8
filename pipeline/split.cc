#include <cohort/pipeline/split.h>

#include <fmt/format.h>

#include <cohort/core/ops/ops.h>

namespace cohort::pipeline {

StageSplit splitSequential(const std::shared_ptr<nn::Sequential>& model, int stages, std::vector<int> boundaries) {
  if (!model) throw ValueError("splitSequential: the model is null");
  const int n = static_cast<int>(model->size());
  if (stages < 1 || stages > n)
    throw ValueError(
        fmt::format("splitSequential: {} stages for a Sequential of {} modules (1..{} stages)", stages, n, n));
  if (boundaries.empty()) {
    for (int s = 1, at = 0; s < stages; ++s) {
      at += n / stages + (s - 1 < n % stages ? 1 : 0);
      boundaries.push_back(at);
    }
  }
  if (static_cast<int>(boundaries.size()) != stages - 1)
    throw ValueError(
        fmt::format("splitSequential: {} stages need {} boundaries, got {}", stages, stages - 1, boundaries.size()));
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const int lo = i == 0 ? 0 : boundaries[i - 1];
    if (boundaries[i] <= lo || boundaries[i] >= n)
      throw ValueError(fmt::format("splitSequential: boundary {} ({}) must lie in {}..{} so that every stage holds a "
                                   "module",
                                   i, boundaries[i], lo + 1, n - 1));
  }
  StageSplit out;
  boundaries.push_back(n);
  for (int s = 0, at = 0; s < stages; ++s) {
    auto stage = std::make_shared<nn::Sequential>();
    for (; at < boundaries[static_cast<size_t>(s)]; ++at) stage->push_back((*model)[at]);
    out.stages.push_back(stage);
  }
  return out;
}

GPTStage::GPTStage(const std::shared_ptr<nn::GPT>& model, int64_t firstBlock, int64_t endBlock, bool first, bool last)
    : Module("GPTStage"), blockSize_(model->config().blockSize), first_(first), last_(last) {
  auto src = std::dynamic_pointer_cast<nn::ModuleDict>(model->child("transformer"));
  auto transformer = registerModule("transformer", nn::ModuleDict());
  if (first) {
    for (const char* name : {"wte", "wpe", "drop"}) transformer->insert(name, (*src)[name]);
  }
  auto h = transformer->insert("h", nn::ModuleDict());
  const auto& blocks = (*src)["h"]->namedChildren();
  for (int64_t i = firstBlock; i < endBlock; ++i) {
    const auto& [name, block] = blocks.items()[static_cast<size_t>(i)];
    h->insert(name, block);
  }
  if (last) {
    transformer->insert("ln_f", (*src)["ln_f"]);
    registerModule("lm_head", model->child("lm_head"));
  }
}

Tensor GPTStage::forward(const Tensor& input) {
  auto transformer = std::dynamic_pointer_cast<nn::ModuleDict>(child("transformer"));
  Tensor x = input;
  if (first_) {
    if (x.dim() != 2 || !isIntegral(x.dtype()) || x.size(1) < 1 || x.size(1) > blockSize_)
      throw ValueError(fmt::format("GPTStage (first): expected integer token ids [B, T] with 1 <= T <= {}, got {} {}",
                                   blockSize_, x.dtype(), shapeStr(x.sizes())));
    Tensor pos = arange(0, x.size(1), 1, {.dtype = DType::Int64});
    x = (*(*transformer)["drop"])((*(*transformer)["wte"])(x) + (*(*transformer)["wpe"])(pos));
  } else if (x.dim() != 3) {
    throw ValueError(fmt::format("GPTStage: expected hidden states [B, T, C], got {}", shapeStr(x.sizes())));
  }
  for (const auto& [name, block] : (*transformer)["h"]->namedChildren()) x = (*block)(x);
  if (last_) x = (*child("lm_head"))((*(*transformer)["ln_f"])(x));
  return x;
}

StageSplit splitGPT(const std::shared_ptr<nn::GPT>& model, int stages) {
  if (!model) throw ValueError("splitGPT: the model is null");
  const int64_t n = model->config().nLayer;
  if (stages < 1 || (stages > 1 && stages > n))
    throw ValueError(fmt::format("splitGPT: {} stages for a GPT of {} blocks (every stage needs a block)", stages, n));
  StageSplit out;
  for (int s = 0; s < stages; ++s) {
    const int64_t lo = n * s / stages, hi = n * (s + 1) / stages;
    out.stages.push_back(std::make_shared<GPTStage>(model, lo, hi, s == 0, s == stages - 1));
  }
  if (stages > 1 && model->config().tieWeights)
    out.tied.push_back({{{0, "transformer.wte.weight"}, {stages - 1, "lm_head.weight"}}});
  return out;
}

}  // namespace cohort::pipeline
