/*
 * Cutting a model into pipeline stages.
 *
 * splitSequential(seq, n): n stages of consecutive children, as even in count as they divide
 * (or at the given boundaries). splitGPT(gpt, n): the GPT's transformer blocks divided evenly,
 * the token and position embeddings on the first stage, the final LayerNorm and the LM head on
 * the last. Stages share the model's own modules (no copies): training the stages trains the
 * model, and loading a state dict into the model loads the stages. A GPTStage's state dict uses
 * the GPT's names ("transformer.h.3.attn.c_attn.weight"), so the stages' state dicts together
 * are the model's.
 *
 * Tied weights. A GPT with tied weights uses one tensor as the token embedding (first stage) and
 * the LM head (last stage). When those stages are on different ranks each rank holds its own copy
 * (every rank builds the whole model from one seed, so the copies start equal), and the split
 * names the pair in `tied`: Pipeline (pipeline.h) adds the copies' gradients together at the end
 * of every step, on every rank in the same order, so every copy gets the gradient one process
 * would compute and equal copies stay equal under any deterministic optimizer (Megatron-LM keeps
 * its embeddings in sync the same way, with an all-reduce over an "embedding group").
 */
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cohort/core/nn/container.h>
#include <cohort/core/nn/transformer.h>
#include <cohort/pipeline/pipeline.h>

namespace cohort::pipeline {

struct StageSplit {
  std::vector<nn::ModulePtr> stages{};
  std::vector<TiedParameter> tied{};
};

// `boundaries`: the index of the first child of stages 1..n-1 (ascending); empty: even counts
// (the first stages take one more when they do not divide). ValueError for fewer children than
// stages or bad boundaries.
StageSplit splitSequential(const std::shared_ptr<nn::Sequential>& model, int stages, std::vector<int> boundaries = {});

// A slice of a GPT: token ids [B, T] -> hidden [B, T, C] (first stage), hidden -> hidden, or
// hidden -> logits [B, T, vocab] (last stage); a one-stage split runs the whole model.
class GPTStage : public nn::Module {
 public:
  GPTStage(const std::shared_ptr<nn::GPT>& model, int64_t firstBlock, int64_t endBlock, bool first, bool last);
  Tensor forward(const Tensor& x) override;
  bool isFirst() const { return first_; }
  bool isLast() const { return last_; }

 private:
  int64_t blockSize_;
  bool first_, last_;
};

// ValueError for fewer than one stage, or more stages than the GPT has blocks (every stage holds
// at least one block when there are several).
StageSplit splitGPT(const std::shared_ptr<nn::GPT>& model, int stages);

}  // namespace cohort::pipeline
