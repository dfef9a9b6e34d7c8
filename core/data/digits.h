/*
 * The 8x8 handwritten digits shipped in data/digits.csv (UCI via scikit-learn; see
 * data/README.md): 1,797 images, pixels 0..16 scaled to [0, 1] float32 as [N, 64], labels int64.
 * Splits are fixed: a permutation of the 1,797 lines drawn once with torch.randperm(1797) under
 * a torch.Generator seeded with 0 (torchRandperm(1797, 0), so Python can rebuild it); "train" is its
 * first 1,437 entries, "test" the last 360, "all" the file in order. The file's lines are ordered by
 * writer, so a split by position tests on writers never seen in training (about 91% for an MLP);
 * the shuffled split is the usual train_test_split setting. The returned dataset is immutable and may be shared between
 * loaders.
 */
#pragma once

#include <memory>
#include <string>

#include <cohort/core/data/dataset.h>

namespace cohort::data {

inline constexpr int64_t kDigitsCount = 1797;
inline constexpr int64_t kDigitsTrainCount = 1437;

// Reads dataFile("digits.csv"). A missing file names the path and COHORT_DATA_DIR; a malformed
// line names the file and line; an unknown split is a ValueError listing the valid ones.
std::shared_ptr<TensorDataset> digits(const std::string& split = "train");
// The same from an explicit file in the digits.csv format (64 pixels 0..16, then the label 0..9).
std::shared_ptr<TensorDataset> digitsFromFile(const std::string& path, const std::string& split = "all");

}  // namespace cohort::data
