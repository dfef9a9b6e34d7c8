/*
 * Training checkpoints: everything needed to continue a run exactly where it stopped (model and
 * optimizer tensors, optimizer groups and options, LR schedule, step, data position, RNG states),
 * in one safetensors file written atomically, so a crash while saving leaves the previous
 * checkpoint intact and Python tools can read the weights.
 *
 * Layout: tensors are named "model/<name>", "optimizer/<name>" ("optimizer/state.3.exp_avg")
 * and "extra/<group>/<name>"; __metadata__ holds "format" = "cohort-checkpoint", "version" = "1"
 * and "state", a JSON object with the step, data position, generator states, optimizer groups,
 * scheduler state, the grad scaler's state ("grad_scaler": its name -> number map, null when none
 * was saved; checkpoints written before it existed have no entry and load as none) and the user's
 * extra JSON.
 *
 *   io::TrainingState st{.model = model->stateDict(), .optimizer = opt.stateDict(),
 *                        .scheduler = sched.state(), .step = step, .dataPosition = loader.position(),
 *                        .generators = {{"cpu", defaultGenerator().state()}}};
 *   io::saveCheckpoint("runs/ckpt", st);     // a folder: writes runs/ckpt/checkpoint.safetensors
 *   io::TrainingState back = io::restoreCheckpoint("runs/ckpt", {.model = model.get(), .optimizer = &opt,
 *                                              .scheduler = &sched, .loader = &loader});
 *
 * Mixed precision: put the amp::GradScaler's state in too (.gradScaler = scaler.stateDict(), after
 * scaler.update()) and restore it with RestoreTargets::gradScaler; a scaler state that does not fit
 * the scaler (missing or out-of-range entries, an empty state for an enabled scaler) is a
 * CheckpointError like any other mismatch.
 *
 * Every problem reading a checkpoint (missing, truncated or corrupt file, not a cohort
 * checkpoint, a model or optimizer that does not match it) is a CheckpointError naming the file
 * and what is wrong; restoreCheckpoint checks everything before it changes anything.
 * Free functions; call them from one thread per file.
 */
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/module.h>
#include <cohort/core/optim/lr_scheduler.h>
#include <cohort/core/optim/optimizer.h>
#include <cohort/core/tensor/generator.h>

namespace cohort::io {

inline constexpr const char* kCheckpointFileName = "checkpoint.safetensors";

struct TrainingState {
  TensorDict model{};  // nn::Module::stateDict()
  std::optional<optim::OptimizerStateDict> optimizer{};
  std::optional<optim::SchedulerState> scheduler{};
  int64_t step = 0;
  data::DataPosition dataPosition{};
  std::map<std::string, GeneratorState> generators{};  // e.g. "cpu" -> defaultGenerator().state()
  std::map<std::string, TensorDict> extraTensors{};    // other named tensor groups (an EMA model, ...)
  std::string extraJson{};                             // any JSON value the program wants back ("" = none)
  std::optional<amp::GradScalerState> gradScaler{};    // amp::GradScaler::stateDict()
};

// The file a checkpoint path means: `path` itself, or path/checkpoint.safetensors when `path` is
// an existing folder or ends with '/'.
std::string checkpointFile(const std::string& path);

// Writes atomically; a path ending in '/' creates the folder. Returns the file written.
// Group names in extraTensors must be non-empty and free of '/'; extraJson must parse as JSON.
std::string saveCheckpoint(const std::string& path, const TrainingState& state);
TrainingState loadCheckpoint(const std::string& path);

struct RestoreTargets {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;
  Generator* generator = nullptr;  // restored from generators["cpu"]
  amp::GradScaler* gradScaler = nullptr;
};

// Loads the checkpoint and restores every non-null target, after checking that each one matches
// (model keys and shapes, optimizer type and groups, scheduler group count, a grad scaler state the
// scaler accepts, data position within the loader's epoch, a saved "cpu" generator). Returns the
// loaded state.
TrainingState restoreCheckpoint(const std::string& path, const RestoreTargets& targets);

// The pieces of the functions above, for checkpoints that commit this file together with others
// (fsdp/training_checkpoint.h keeps one per rank beside the model's shards):
// encodeCheckpoint gives the tensors and metadata saveCheckpoint writes (ValueError for a bad
// extra group name or extraJson), decodeCheckpoint reads them back (CheckpointError naming `file`),
// checkRestore checks that `state` fits every non-null target and changes nothing, and
// applyRestore then restores them (after checkRestore it fails only if a target changed since).
SafetensorsContents encodeCheckpoint(const TrainingState& state, const std::string& file);
TrainingState decodeCheckpoint(SafetensorsContents contents, const std::string& file);
void checkRestore(const std::string& file, const TrainingState& state, const RestoreTargets& targets);
void applyRestore(const std::string& file, const TrainingState& state, const RestoreTargets& targets);

}  // namespace cohort::io
