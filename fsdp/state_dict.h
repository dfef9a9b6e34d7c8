/*
 * FSDP state dicts and checkpoints.
 *
 * Full state dict: the wrapped module's own stateDict() keys and order (tied weights under every
 * name), with the full parameters gathered from the shards (the parameters' dtype) and copies of
 * the buffers: a plain, non-distributed module loads it with loadStateDict, and
 * io::saveSafetensors(path, dict) writes a file PyTorch reads. Collective over the shard group.
 *
 * Sharded checkpoint: a folder with one safetensors file per shard,
 * "shard-<i>-of-<n>.safetensors" (n = the shard group's size; under HYBRID_SHARD and NO_SHARD
 * only the first replica writes). Each file holds, for every parameter, the flat range of its
 * elements that shard owns ("param/<name>", 1-D) and, with an optimizer, the same ranges of each
 * per-parameter state tensor ("optim/<key>/<name>"); file 0 also holds the buffers
 * ("buffer/<name>"). Its metadata describes the global layout: format "cohort-fsdp-sharded",
 * version, n, i, and "layout" (JSON: each parameter's name, global shape and [start, end) range
 * in this file; the buffers; the optimizer's step per parameter), plus the optimizer's type and
 * groups. Nothing depends on how the writer grouped parameters into units or on its world size,
 * so a checkpoint written by N ranks loads into M ranks (any N, M) and into a differently wrapped
 * model: each loading rank reads the ranges that overlap its own shards.
 *
 * Loading checks everything before it changes anything: a missing shard file, files of two
 * different checkpoints, a corrupt or truncated file, a parameter that is missing, extra, or
 * differently shaped (a different model), ranges that do not tile a parameter, an optimizer
 * that does not match: each is a CheckpointError naming the file or parameter, and the model and
 * optimizer are left as they were.
 *
 * All functions are collective over the FSDP group (every rank calls them, in the same order).
 * The optimizer must be the one built over fsdp.parameters() (one shard per unit, in order).
 */
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/module.h>
#include <cohort/core/optim/optimizer.h>
#include <cohort/fsdp/fully_sharded_data_parallel.h>

namespace cohort::fsdp {

struct FullStateDictOptions {
  bool rank0Only = false;  // other ranks still take part, and get an empty dict
};

nn::StateDict fullStateDict(FullyShardedDataParallel& fsdp, FullStateDictOptions options = {});

// Every rank passes the same full dict (as fullStateDict or a plain module's stateDict gives).
// Missing, unexpected or mis-shaped keys: a ValueError listing them, nothing written.
void loadFullStateDict(FullyShardedDataParallel& fsdp, const nn::StateDict& dict);

inline constexpr const char* kShardedFormat = "cohort-fsdp-sharded";

// The file of shard `index` of `count` inside `dir`.
std::string shardFileName(const std::string& dir, int index, int count);

// Writes this rank's shard file (atomically) and, after every rank has written, removes shard
// files of an older checkpoint with a different shard count from `dir`. Returns the file this
// rank wrote ("" for ranks of other replicas).
std::string saveShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                                  const optim::Optimizer* optimizer = nullptr);

// Reads every shard file of the checkpoint in `dir` and loads the ranges this rank owns.
void loadShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                           optim::Optimizer* optimizer = nullptr);

// ---- The two halves of the functions above, for checkpoints that commit shard files together with
// other files (training_checkpoint.h). Neither is collective.

struct WrittenShard {
  std::string path;
  int index = 0, count = 1;  // shard `index` of `count`
  io::FileDigest digest;     // the file's size and checksum
};
// Writes this rank's shard file into `dir` (created if needed; the file atomically and durably),
// with `extraMetadata` added to its safetensors metadata. Ranks of other replicas write nothing
// and get nullopt.
std::optional<WrittenShard> writeShardFile(FullyShardedDataParallel& fsdp, const std::string& dir,
                                           const optim::Optimizer* optimizer = nullptr,
                                           const io::Metadata& extraMetadata = {});

// Checks one checkpoint's shard files (their contents in shard order, as loadSafetensors gives
// them; `dir` names them in messages) against this rank's model and optimizer, and builds what
// this rank loads from them, changing nothing: every problem loadShardedCheckpoint reports is
// thrown here. The returned function writes it into the optimizer, the shards and the buffers; it
// refers to `fsdp` and `optimizer`, which must outlive it.
std::function<void()> prepareShardedLoad(FullyShardedDataParallel& fsdp, const std::string& dir,
                                         std::vector<io::SafetensorsContents> files,
                                         optim::Optimizer* optimizer = nullptr);

}  // namespace cohort::fsdp
