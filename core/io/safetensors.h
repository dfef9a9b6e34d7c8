/*
 * The safetensors format (https://github.com/huggingface/safetensors), so Python tools read
 * cohort's weights and cohort reads theirs:
 *
 *   [8 bytes: little-endian u64 N][N bytes: JSON header, space-padded][tensor bytes]
 *   header = {"__metadata__": {"k": "v", ...},            (optional, string -> string)
 *             "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 *
 * Offsets are relative to the byte after the header; the tensors tile that buffer exactly.
 * dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL (the other safetensors dtypes, I8 I16 U16 U32 U64
 * F8_*, are a CheckpointError naming them). Tensors are written in the dict's order, row-major,
 * little-endian; a load returns them in file (offset) order.
 *
 * Loads check everything before trusting it: the file size against the header length, the JSON,
 * every entry's fields, dtype, shape and offsets (inside the buffer, no overlap or gap, length
 * = numel * element size), bool bytes being 0 or 1. Each problem is a CheckpointError naming
 * the file and the tensor. Saves go through writeFileAtomically: a failed save leaves the old
 * file as it was. Free functions, safe to call from any thread on different files.
 */
#pragma once

#include <map>
#include <string>
#include <string_view>

#include <cohort/core/io/atomic_file.h>
#include <cohort/core/nn/ordered_dict.h>
#include <cohort/core/tensor/tensor.h>

namespace cohort::io {

// name -> tensor in a fixed order (nn::StateDict is the same type).
using TensorDict = nn::OrderedDict<Tensor>;
using Metadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  TensorDict tensors{};
  Metadata metadata{};
};

const char* safetensorsDType(DType dtype);  // "F32", "BF16", "BOOL", ...
// CheckpointError for names that are not safetensors dtypes or that cohort has no type for.
DType dtypeFromSafetensors(const std::string& name);

// The whole file as bytes. Tensors may be any device, layout or view; undefined ones, the
// reserved name "__metadata__" and empty names are a CheckpointError (as is a tensor whose
// data cannot be read, e.g. a released storage).
std::string serializeSafetensors(const TensorDict& tensors, const Metadata& metadata = {});
// Parses bytes produced by serializeSafetensors or any safetensors writer. `what` names the
// source in error messages.
SafetensorsContents parseSafetensors(std::string_view bytes, const std::string& what = "<memory>");

// Writes atomically (temp file, fsync, rename, fsync folder); returns the file's size and checksum.
FileDigest saveSafetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata = {});
// The tensors come back described as the file's (describeAs): asking them for a name the file
// does not hold is an IndexError naming the file, the name and the names it does hold.
SafetensorsContents loadSafetensors(const std::string& path);

}  // namespace cohort::io
