/*
 * FSDP training checkpoints: the model's shards, the optimizer's shards and the training state
 * (step, data position, RNG states, LR schedule, the program's extra tensors and JSON) saved as ONE
 * checkpoint that is either wholly there or not there at all.
 *
 *   io::TrainingState st{.scheduler = sched.state(), .step = step, .dataPosition = loader.position(),
 *                        .generators = {{"cpu", defaultGenerator().state()}}};
 *   fsdp::saveTrainingCheckpoint(fsdp, "runs/ckpt", &opt, st);        // every rank
 *   ...
 *   if (fsdp::hasTrainingCheckpoint("runs/ckpt"))
 *     step = fsdp::loadTrainingCheckpoint(fsdp, "runs/ckpt", {.optimizer = &opt, .scheduler = &sched,
 *                                         .loader = &loader, .generator = &defaultGenerator()}).step;
 *
 * This is io::saveCheckpoint / io::restoreCheckpoint for a sharded model: the same TrainingState
 * (with `model` and `optimizer` left empty: they are saved from the shards; a grad scaler's state
 * goes in `gradScaler`, identical on every rank when its found-inf flags are reduced) and the same
 * restore targets, less the model, which is the FSDP module itself.
 *
 * Layout of `dir` (a folder; every rank must see the same one, i.e. a shared file system, as for
 * loadShardedCheckpoint):
 *
 *   manifest.json                         the commit point, written last
 *   step-<step>-<id>/                     the parts of one save (<id>: 16 hex digits, new per save)
 *     shard-<i>-of-<n>.safetensors        the sharded-checkpoint files of state_dict.h, with the
 *                                         step and id added to their metadata
 *     state-<r>-of-<world>.safetensors    rank r's training state, in io::saveCheckpoint's format
 *                                         (no model or optimizer tensors), with the id added
 *
 * The manifest (JSON) names the format, the step, the id and folder, the world size, the shard
 * count and every part with its size in bytes and its XXH64 checksum (io::FileDigest), and carries
 * a checksum of its own contents. A folder without a valid manifest holds no checkpoint, whatever
 * parts lie in it; a part that disagrees with the manifest (missing, another size or checksum,
 * another step or id in its metadata) makes the load fail.
 *
 * Saving, collective over fsdp.processGroup() (every rank calls it with the same step):
 *   1. the ranks agree on the step and rank 0 draws the id (one all-gather; a rank that passes
 *      another step, or a bad state, fails the save on every rank before anything is written);
 *   2. every rank writes its parts into the new step folder, each file atomically and fsynced
 *      (io::writeFileAtomically), the folder entry fsynced too [stages BeforeParts, PartsWritten];
 *   3. an all-gather of every rank's outcome and part digests: the barrier after which all parts
 *      are durable [PartsAgreed]; any rank that failed to write fails the save on every rank;
 *   4. rank 0 writes manifest.json atomically: this rename is the commit [ManifestWritten];
 *   5. rank 0 removes every other step folder (the previous checkpoint, and the parts of saves
 *      that never committed); a failure there is logged, the new checkpoint stands;
 *   6. a broadcast of rank 0's outcome, so every rank returns only once the checkpoint is
 *      committed, or throws if it was not.
 * A crash (of any rank, at any point) before the rename in 4 leaves the previous manifest, which
 * names the previous folder, untouched: the previous checkpoint loads. After the rename the new
 * manifest names only the new folder, whose parts were all durable before it was written: the new
 * checkpoint loads. Because each save writes into a folder of its own, no save ever overwrites a
 * file the committed manifest names, not even a save of the same step after a resume. Only
 * checkpoint folders are removed (step-<digits>-<16 hex digits>), nothing else in `dir`.
 *
 * Per-rank state: each rank saves its own TrainingState as its own part, since RNG states (a
 * program may seed each rank differently; dropout then draws different masks) and anything else in
 * it may differ by rank. The manifest records whether the parts are byte-identical. Loading on the
 * same number of ranks gives rank r the state rank r saved. Loading on another number of ranks
 * (which the shards support: N ranks' shards load into M ranks) gives every rank rank 0's state if
 * all ranks had saved the same one, and is a CheckpointError if they had not (there is no right
 * way to map N ranks' RNG streams to M). In examples/train_gpt every rank seeds the same
 * generator, draws the same amount from it and advances its DistributedSampler loader in step, so
 * its parts are identical and it resumes on any number of ranks.
 *
 * Loading, collective too: every rank reads the manifest and every part (so all ranks reach the
 * same verdict on the files), checks each part's step and id, then its size and checksum, checks
 * the shards against its model and optimizer and the state against the targets, and only then,
 * after an all-gather in which every rank reports that it is ready, changes anything. Every
 * problem is a CheckpointError naming the file: no manifest, a truncated or corrupt manifest, a
 * missing part, a part of another checkpoint ("'<dir>/step-60-…/shard-1-of-2.safetensors' is from
 * step 40, the manifest '<dir>/manifest.json' from step 60"), a damaged part, a model or optimizer
 * that does not match. A rank whose own check passed while another's failed throws a
 * CheckpointError naming the ranks that failed; nothing is restored on any rank.
 *
 * Errors while saving: a bad argument is a ValueError, a failed write a CheckpointError (on the
 * rank that failed; the others get a CheckpointError naming it); a rank that dies makes the
 * others' collective fail with a DistError (PeerError or TimeoutError), as any collective does.
 */
#pragma once

#include <functional>
#include <string>

#include <cohort/core/amp/grad_scaler.h>
#include <cohort/core/data/data_loader.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/optim/lr_scheduler.h>
#include <cohort/core/optim/optimizer.h>
#include <cohort/core/tensor/generator.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

namespace cohort::fsdp {

inline constexpr const char* kTrainingCheckpointFormat = "cohort-fsdp-training-checkpoint";
inline constexpr const char* kManifestFileName = "manifest.json";

// The points of a save that options.onStage is called at (see the numbered steps above).
enum class SaveStage {
  BeforeParts,      // every rank, after the ranks agreed on the step, before it writes a part
  PartsWritten,     // every rank, once its own parts are durable, before the barrier
  PartsAgreed,      // every rank, after the barrier (every rank's parts durable), before the manifest
  ManifestWritten,  // rank 0 only, once the manifest is durable, before the older folders are removed
};
const char* saveStageName(SaveStage stage);  // "before-parts", ...

struct TrainingCheckpointOptions {
  // Called on this rank when the save reaches each stage: for tests that kill a rank there, and for
  // programs that want to log the progress of a long save.
  std::function<void(SaveStage)> onStage;
};

// Saves `fsdp`'s parameters, `optimizer`'s state (null: none; else the optimizer built over
// fsdp.parameters()) and `state` into `dir` (created if needed). state.model and state.optimizer
// must be empty. Returns the manifest's path. Collective over fsdp.processGroup().
std::string saveTrainingCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                                   const optim::Optimizer* optimizer, const io::TrainingState& state,
                                   const TrainingCheckpointOptions& options = {});

// What loadTrainingCheckpoint restores besides the model (null: not restored).
struct TrainingCheckpointTargets {
  optim::Optimizer* optimizer = nullptr;  // the one built over fsdp.parameters()
  optim::LRScheduler* scheduler = nullptr;
  data::DataLoader* loader = nullptr;
  Generator* generator = nullptr;         // restored from generators["cpu"]
  amp::GradScaler* gradScaler = nullptr;  // from TrainingState::gradScaler (e.g. a ShardedGradScaler)
};

// Loads the checkpoint committed in `dir` into `fsdp` and the targets, after checking all of it.
// Returns this rank's training state (model and optimizer left empty). Collective.
io::TrainingState loadTrainingCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                                         const TrainingCheckpointTargets& targets = {});

// Whether `dir` holds a manifest, i.e. a save was committed there (whether it loads, the load
// says). Not collective.
bool hasTrainingCheckpoint(const std::string& dir);

}  // namespace cohort::fsdp
