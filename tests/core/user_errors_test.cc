// Errors where a new user got stuck say what is wrong and what to do:
// - a tensor that a safetensors file or a checkpoint does not hold names the file and the tensor.
#include <gtest/gtest.h>

#include <string>

#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/nn.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/util/error.h>

#include "temp_dir.h"

using namespace cohort;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <typename E, typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(UserErrors, ATensorMissingFromASafetensorsFileNamesTheFileAndTheTensor) {
  cohort::testing::TempDir dir;
  const std::string path = dir.file("data.safetensors");
  io::saveSafetensors(path, {{"x0", zeros({2})}, {"y0", ones({2})}});
  io::SafetensorsContents c = io::loadSafetensors(path);
  std::string msg = errorOf<IndexError>([&] { c.tensors.at("batches"); });
  EXPECT_EQ(msg, "safetensors file '" + path + "' has no tensor 'batches' (it has 2: x0, y0)");
  // operator[] and a copy of the dict say the same.
  io::TensorDict copy = c.tensors;
  EXPECT_EQ(errorOf<IndexError>([&] { copy["batches"]; }), msg);
  // Bytes parsed in memory name what the caller called them.
  io::SafetensorsContents m = io::parseSafetensors(io::serializeSafetensors({{"w", zeros({1})}}), "the upload");
  EXPECT_EQ(errorOf<IndexError>([&] { m.tensors.at("b"); }),
            "safetensors 'the upload' has no tensor 'b' (it has 1: w)");
  // A dict nobody described still names the key and lists what it has.
  nn::StateDict plain;
  EXPECT_EQ(errorOf<IndexError>([&] { plain.at("k"); }), "OrderedDict has no key 'k' (it is empty)");
}

TEST(UserErrors, ATensorMissingFromACheckpointNamesTheCheckpoint) {
  cohort::testing::TempDir dir;
  Generator g(1);
  nn::Linear lin(3, 2, true, &g);
  io::TrainingState st{.model = lin.stateDict(), .step = 4};
  st.extraTensors["ema"].insert("weight", zeros({2, 3}));
  const std::string file = io::saveCheckpoint(dir.file("ckpt/"), st);
  io::TrainingState back = io::loadCheckpoint(file);
  EXPECT_EQ(errorOf<IndexError>([&] { back.model.at("head.weight"); }),
            "the model state of checkpoint '" + file + "' has no tensor 'head.weight' (it has 2: weight, bias)");
  EXPECT_EQ(errorOf<IndexError>([&] { back.extraTensors.at("ema").at("bias"); }),
            "extra tensor group 'ema' of checkpoint '" + file + "' has no tensor 'bias' (it has 1: weight)");
}

}  // namespace
