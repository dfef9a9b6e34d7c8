// Checkpoint I/O: safetensors round trips for every dtype, files Python reads and writes, every
// kind of damaged file, atomic replacement, and training checkpoints (save, load, restore,
// mismatches).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <cohort/core/io/atomic_file.h>
#include <cohort/core/io/checkpoint.h>
#include <cohort/core/io/safetensors.h>
#include <cohort/core/nn/layers.h>
#include <cohort/core/ops/ops.h>
#include <cohort/core/optim/sgd.h>

#include "core/test_util.h"
#include "temp_dir.h"

using namespace cohort;
using namespace cohort::io;
namespace fs = std::filesystem;

namespace {

using cohort::testing::messageOf;
using cohort::testing::TempDir;  // temp_dir.h

std::string readBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A safetensors file from a header JSON text and a data buffer.
std::string makeFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// One tensor of every dtype, values from a formula Python can recompute: v[i] = (i % 7) - 2.5
// for floats (exact in every float type), (i * 37) % 251 - 100 for signed ints, i % 256 for u8,
// i % 3 == 0 for bool.
TensorDict everyDtype() {
  TensorDict d;
  auto floats = [](int64_t n) {
    std::vector<double> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(i % 7) - 2.5);
    return v;
  };
  auto ints = [](int64_t n) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back((i * 37) % 251 - 100);
    return v;
  };
  d.insert("f32", fromVector(floats(6), {2, 3}, {.dtype = DType::Float32}));
  d.insert("f64", fromVector(floats(5), {5}, {.dtype = DType::Float64}));
  d.insert("f16", fromVector(floats(12), {3, 2, 2}, {.dtype = DType::Float16}));
  d.insert("bf16", fromVector(floats(8), {8}, {.dtype = DType::BFloat16}));
  d.insert("i64", fromVector(ints(4), {2, 2}, {.dtype = DType::Int64}));
  d.insert("i32", fromVector(ints(7), {7}, {.dtype = DType::Int32}));
  std::vector<int64_t> u8;
  for (int64_t i = 0; i < 300; ++i) u8.push_back(i % 256);
  d.insert("u8", fromVector(u8, {300}, {.dtype = DType::UInt8}));
  std::vector<bool> b;
  for (int64_t i = 0; i < 9; ++i) b.push_back(i % 3 == 0);
  d.insert("bool", fromVector(b, {3, 3}, {.dtype = DType::Bool}));
  d.insert("scalar", scalarTensor(3.25, {.dtype = DType::Float32}));  // 0-dim
  d.insert("empty", zeros({0, 4}, {.dtype = DType::Float32}));        // no bytes
  return d;
}

void expectSame(const TensorDict& a, const TensorDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(u->dtype(), t.dtype()) << name;
    EXPECT_EQ(u->sizes(), t.sizes()) << name;
    EXPECT_EQ(u->toVector<double>(), t.toVector<double>()) << name;
  }
}

bool havePythonTorch() {
  static const bool kHave = std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
  return kHave;
}

}  // namespace

// ---- safetensors --------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  TensorDict d = everyDtype();
  Metadata meta{{"producer", "cohort test"}, {"note", "ünïcode ok"}};
  saveSafetensors(dir.file("all.safetensors"), d, meta);
  SafetensorsContents back = loadSafetensors(dir.file("all.safetensors"));
  expectSame(d, back.tensors);
  EXPECT_EQ(back.metadata, meta);
  // The load keeps the order the tensors were written in.
  std::vector<std::string> names;
  for (auto& [k, v] : back.tensors) names.push_back(k);
  std::vector<std::string> expectNames;
  for (auto& [k, v] : d) expectNames.push_back(k);
  EXPECT_EQ(names, expectNames);
  // In memory too.
  expectSame(d, parseSafetensors(serializeSafetensors(d, meta)).tensors);
}

TEST(Safetensors, WritesTheDocumentedLayout) {
  TensorDict d;
  d.insert("w", fromVector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).t());  // non-contiguous view
  d.insert("b", fromVector(std::vector<int64_t>{7}, {1}));
  std::string bytes = serializeSafetensors(d);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);  // header padded so the data starts aligned
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["w"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], nlohmann::json::array({3, 2}));
  EXPECT_EQ(h["w"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(h["b"]["dtype"], "I64");
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json::array({24, 32}));
  EXPECT_FALSE(h.contains("__metadata__"));
  ASSERT_EQ(bytes.size(), 8 + n + 32);
  float w[6];
  std::memcpy(w, bytes.data() + 8 + n, 24);
  EXPECT_EQ(std::vector<float>(w, w + 6), (std::vector<float>{1, 4, 2, 5, 3, 6}));  // transposed, row-major
}

// The file cohort writes, parsed by hand in Python (json header + numpy/torch frombuffer; the
// safetensors package is not in Debian), holds the values the formula in everyDtype() gives.
TEST(Safetensors, PythonReadsCohortFiles) {
  if (!havePythonTorch())
    GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found (scripts/setup.sh installs them)";
  TempDir dir;
  saveSafetensors(dir.file("c.safetensors"), everyDtype(), {{"k", "v"}});
  const std::string script = R"PY(
import json, struct, sys, torch
path = sys.argv[1]
raw = open(path, 'rb').read()
(n,) = struct.unpack('<Q', raw[:8])
h = json.loads(raw[8:8 + n])
buf = raw[8 + n:]
assert h.pop('__metadata__') == {'k': 'v'}
dt = {'F32': torch.float32, 'F64': torch.float64, 'F16': torch.float16, 'BF16': torch.bfloat16,
      'I64': torch.int64, 'I32': torch.int32, 'U8': torch.uint8, 'BOOL': torch.bool}
out = {}
for name, e in h.items():
    b, end = e['data_offsets']
    t = torch.frombuffer(bytearray(buf[b:end]), dtype=dt[e['dtype']]) if end > b else torch.empty(0, dtype=dt[e['dtype']])
    out[name] = t.reshape(e['shape'])
fl = lambda n: torch.tensor([(i % 7) - 2.5 for i in range(n)], dtype=torch.float64)
it = lambda n: torch.tensor([(i * 37) % 251 - 100 for i in range(n)], dtype=torch.int64)
assert torch.equal(out['f32'], fl(6).float().reshape(2, 3))
assert torch.equal(out['f64'], fl(5))
assert torch.equal(out['f16'], fl(12).half().reshape(3, 2, 2))
assert torch.equal(out['bf16'], fl(8).bfloat16())
assert torch.equal(out['i64'], it(4).reshape(2, 2))
assert torch.equal(out['i32'], it(7).int())
assert torch.equal(out['u8'], torch.tensor([i % 256 for i in range(300)], dtype=torch.uint8))
assert torch.equal(out['bool'], torch.tensor([i % 3 == 0 for i in range(9)]).reshape(3, 3))
assert out['scalar'].shape == () and out['scalar'].item() == 3.25
assert out['empty'].shape == (0, 4)
print('OK')
)PY";
  writeBytes(dir.file("check.py"), script);
  std::string cmd = "/usr/bin/python3 " + dir.file("check.py") + " " + dir.file("c.safetensors") + " > " +
                    dir.file("out.txt") + " 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << readBytes(dir.file("out.txt"));
  EXPECT_EQ(readBytes(dir.file("out.txt")), "OK\n");
}

// A file Python writes the way the reference writer does (tensors sorted by dtype size then name,
// header space-padded to 8 bytes) loads in cohort with torch's values.
TEST(Safetensors, CohortReadsPythonFiles) {
  if (!havePythonTorch())
    GTEST_SKIP() << "/usr/bin/python3 with torch and numpy not found (scripts/setup.sh installs them)";
  TempDir dir;
  const std::string script = R"PY(
import json, struct, sys, torch
torch.manual_seed(0)
ts = {'layer.weight': torch.randn(4, 3), 'layer.bias': torch.randn(4).double(),
      'emb': torch.randn(5, 2).bfloat16(), 'half': torch.randn(3).half(),
      'ids': torch.arange(6, dtype=torch.int64).reshape(2, 3) * -3, 'i32': torch.tensor([7, -8], dtype=torch.int32),
      'mask': torch.tensor([True, False, True]), 'u8': torch.tensor([0, 255, 17], dtype=torch.uint8)}
names = {torch.float32: 'F32', torch.float64: 'F64', torch.bfloat16: 'BF16', torch.float16: 'F16',
         torch.int64: 'I64', torch.int32: 'I32', torch.bool: 'BOOL', torch.uint8: 'U8'}
order = sorted(ts, key=lambda k: (-ts[k].element_size(), k))
header, off, data = {'__metadata__': {'format': 'pt'}}, 0, b''
for k in order:
    b = ts[k].contiguous().view(torch.uint8).numpy().tobytes() if ts[k].numel() else b''
    header[k] = {'dtype': names[ts[k].dtype], 'shape': list(ts[k].shape), 'data_offsets': [off, off + len(b)]}
    off += len(b); data += b
h = json.dumps(header).encode()
h += b' ' * ((8 - len(h) % 8) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h + data)
# The values, as text, for the C++ side to compare: name then the values as float64.
with open(sys.argv[2], 'w') as f:
    for k in sorted(ts):
        f.write(k + ' ' + ' '.join(repr(float(v)) for v in ts[k].double().flatten().tolist()) + '\n')
)PY";
  writeBytes(dir.file("write.py"), script);
  std::string cmd = "/usr/bin/python3 " + dir.file("write.py") + " " + dir.file("py.safetensors") + " " +
                    dir.file("values.txt") + " > " + dir.file("out.txt") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << readBytes(dir.file("out.txt"));
  SafetensorsContents c = loadSafetensors(dir.file("py.safetensors"));
  EXPECT_EQ(c.metadata, (Metadata{{"format", "pt"}}));
  EXPECT_EQ(c.tensors.size(), 8u);
  EXPECT_EQ(c.tensors.at("emb").dtype(), DType::BFloat16);
  EXPECT_EQ(c.tensors.at("half").dtype(), DType::Float16);
  EXPECT_EQ(c.tensors.at("layer.bias").dtype(), DType::Float64);
  EXPECT_EQ(c.tensors.at("ids").sizes(), (Shape{2, 3}));
  EXPECT_EQ(c.tensors.at("mask").dtype(), DType::Bool);
  std::ifstream vals(dir.file("values.txt"));
  std::string line;
  int lines = 0;
  while (std::getline(vals, line)) {
    std::istringstream ls(line);
    std::string name;
    ls >> name;
    std::vector<double> expect;
    double v;
    while (ls >> v) expect.push_back(v);
    EXPECT_EQ(c.tensors.at(name).toVector<double>(), expect) << name;
    ++lines;
  }
  EXPECT_EQ(lines, 8);
}

TEST(Safetensors, DamagedFilesAreCheckpointErrors) {
  TempDir dir;
  const std::string good = serializeSafetensors(everyDtype());
  const std::string path = dir.file("bad.safetensors");
  auto loadBytes = [&](const std::string& bytes) {
    writeBytes(path, bytes);
    return messageOf<CheckpointError>([&] { loadSafetensors(path); });
  };
  auto expectLoadFails = [&](const std::string& bytes, const std::string& needle) {
    std::string m = loadBytes(bytes);
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << "expected '" << needle << "' in: " << m;
  };
  // Truncated anywhere.
  expectLoadFails("", "too short");
  expectLoadFails(good.substr(0, 5), "too short");
  expectLoadFails(good.substr(0, 40), "header length");
  expectLoadFails(good.substr(0, good.size() - 1), "past the end");
  // Header length field wrong either way.
  {
    std::string b = good;
    b[0] = static_cast<char>(static_cast<unsigned char>(b[0]) + 8);
    expectLoadFails(b, "");  // the JSON is cut or data becomes header: an error either way
    b = good;
    b[7] = 0x7f;
    expectLoadFails(b, "header length");
  }
  // Garbage header.
  expectLoadFails(makeFile("this is not json", ""), "does not start with '{'");
  expectLoadFails(makeFile("{\"a\": [1, 2", ""), "not valid JSON");
  expectLoadFails(makeFile("[1, 2, 3]", ""), "does not start with '{'");
  // Entries.
  expectLoadFails(makeFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(4, '\0')),
                  "past the end");
  expectLoadFails(makeFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", std::string(4, '\0')),
                  "need 8 bytes");
  expectLoadFails(makeFile(R"({"a": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}})", std::string(4, '\0')),
                  "'I8' has no cohort equivalent");
  expectLoadFails(makeFile(R"({"a": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 4]}})", std::string(4, '\0')),
                  "unknown dtype 'Q7'");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                          "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                           std::string(6, '\0')),
                  "overlaps");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})", std::string(4, '\0')),
                  "belong to no tensor");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", std::string(4, '\0')),
                  "trailing");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]}})", std::string(2, '\0')),
                  "non-negative");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [2]}})", std::string(2, '\0')), "data_offsets");
  expectLoadFails(makeFile(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                          "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                           std::string(2, '\0')),
                  "twice");
  expectLoadFails(makeFile(R"({"a": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}})",
                           std::string("\x01\x02", 2)),
                  "not 0 or 1");
  expectLoadFails(makeFile(R"({"__metadata__": {"k": 3}})", ""), "not a string");
  // Missing file.
  EXPECT_NE(messageOf<CheckpointError>([&] { loadSafetensors(dir.file("nope.safetensors")); }).find("cannot open"),
            std::string::npos);
  // A good file still loads (the checks reject only what is wrong).
  writeBytes(path, good);
  EXPECT_NO_THROW(loadSafetensors(path));
}

TEST(Safetensors, BadTensorsAreRejectedOnSave) {
  TensorDict d;
  d.insert("__metadata__", zeros({1}));
  EXPECT_THROW(serializeSafetensors(d), CheckpointError);
  TensorDict u;
  u.insert("x", Tensor());
  EXPECT_THROW(serializeSafetensors(u), CheckpointError);
}

// ---- atomic writes --------------------------------------------------------------------------

TEST(AtomicWrite, FailedSaveLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  TensorDict good;
  good.insert("a", ones({256}));
  saveSafetensors(path, good);
  const std::string before = readBytes(path);

  // The second tensor's memory is gone: the save fails after the header and the first tensor
  // were written to the temporary file.
  TensorDict bad;
  bad.insert("a", full({1024}, 2.0));
  Tensor gone = ones({16});
  gone.storage()->release();
  bad.insert("b", gone);
  std::string m = messageOf<CheckpointError>([&] { saveSafetensors(path, bad); });
  EXPECT_NE(m.find("tensor 'b'"), std::string::npos) << m;
  EXPECT_EQ(m.find("WRONG TYPE"), std::string::npos) << m;
  EXPECT_EQ(readBytes(path), before);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"model.safetensors"});  // no temporary file left

  // A throwing writer, mid-file.
  EXPECT_THROW(writeFileAtomically(path,
                                   [](AtomicWriter& w) {
                                     w.write("partial", 7);
                                     throw CheckpointError("simulated crash");
                                   }),
               CheckpointError);
  EXPECT_EQ(readBytes(path), before);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"model.safetensors"});

  // A folder that does not exist.
  EXPECT_THROW(saveSafetensors(dir.file("no/such/dir/x.safetensors"), good), CheckpointError);

  // A read-only folder (only meaningful when not root: root writes anyway).
  if (::geteuid() != 0) {
    ::chmod(dir.path().c_str(), 0555);
    EXPECT_THROW(saveSafetensors(path, bad), CheckpointError);
    ::chmod(dir.path().c_str(), 0755);
    EXPECT_EQ(readBytes(path), before);
  }

  // And a successful save replaces it.
  writeFileAtomically(path, [](AtomicWriter& w) { w.write("new", 3); });
  EXPECT_EQ(readBytes(path), "new");
}

// ---- training checkpoints -----------------------------------------------------------------

namespace {

struct Trainer {
  std::shared_ptr<nn::Linear> model;
  std::unique_ptr<optim::SGD> opt;
};

Trainer makeTrainer(uint64_t seed, int64_t out = 4) {
  Generator g(seed);
  Trainer s;
  s.model = std::make_shared<nn::Linear>(3, out, true, &g);
  s.opt = std::make_unique<optim::SGD>(s.model->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  return s;
}

// One SGD step with fixed gradients, so the optimizer has momentum buffers.
void fakeStep(Trainer& s, double g) {
  for (Tensor p : s.model->parameters()) p.setGrad(fullLike(p, g));
  s.opt->step();
}

}  // namespace

TEST(TrainingCheckpoint, SaveLoadRestore) {
  TempDir dir;
  Trainer a = makeTrainer(1);
  fakeStep(a, 0.5);
  fakeStep(a, -0.25);
  Generator gen(77);
  (void)gen.reserve(5);
  TrainingState st;
  st.model = a.model->stateDict();
  st.optimizer = a.opt->stateDict();
  st.scheduler = optim::SchedulerState{2, {0.1}};
  st.step = 2;
  st.dataPosition = {3, 7};
  st.generators["cpu"] = gen.state();
  st.extraTensors["ema"].insert("weight", full({2}, 1.5));
  st.extraJson = R"({"run": "test", "loss": 0.125})";
  const std::string file = saveCheckpoint(dir.path().string() + "/ckpt/", st);
  EXPECT_EQ(file, dir.path().string() + "/ckpt/checkpoint.safetensors");

  TrainingState back = loadCheckpoint(dir.path().string() + "/ckpt");
  expectSame(st.model, back.model);
  ASSERT_TRUE(back.optimizer);
  EXPECT_EQ(back.optimizer->type, "SGD");
  EXPECT_EQ(back.optimizer->metadataJson(), st.optimizer->metadataJson());
  EXPECT_EQ(back.optimizer->tensors.size(), st.optimizer->tensors.size());
  for (auto& [k, t] : st.optimizer->tensors)
    EXPECT_EQ(back.optimizer->tensors.at(k).toVector<double>(), t.toVector<double>()) << k;
  ASSERT_TRUE(back.scheduler);
  EXPECT_EQ(back.scheduler->lastStep, 2);
  EXPECT_EQ(back.scheduler->baseLrs, std::vector<double>{0.1});
  EXPECT_EQ(back.step, 2);
  EXPECT_EQ(back.dataPosition, (data::DataPosition{3, 7}));
  EXPECT_EQ(back.generators.at("cpu"), (GeneratorState{77, 5}));
  EXPECT_EQ(back.extraTensors.at("ema").at("weight").toVector<float>(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(nlohmann::json::parse(back.extraJson), nlohmann::json::parse(st.extraJson));

  // Restore into a fresh setup: the next step matches the original's next step exactly.
  Trainer b = makeTrainer(2);
  Generator gen2(1);
  restoreCheckpoint(file, {.model = b.model.get(), .optimizer = b.opt.get(), .generator = &gen2});
  EXPECT_EQ(gen2.state(), (GeneratorState{77, 5}));
  fakeStep(a, 0.75);
  fakeStep(b, 0.75);
  EXPECT_EQ(b.model->weight().toVector<float>(), a.model->weight().toVector<float>());
  EXPECT_EQ(b.model->bias().toVector<float>(), a.model->bias().toVector<float>());
}

TEST(TrainingCheckpoint, MismatchesAreCheckpointErrorsAndChangeNothing) {
  TempDir dir;
  Trainer a = makeTrainer(1);
  fakeStep(a, 0.5);
  TrainingState st{.model = a.model->stateDict(), .optimizer = a.opt->stateDict(), .step = 1};
  const std::string file = saveCheckpoint(dir.file("c.safetensors"), st);

  Trainer wrong = makeTrainer(3, /*out=*/5);
  const auto before = wrong.model->weight().toVector<float>();
  std::string m = messageOf<CheckpointError>(
      [&] { restoreCheckpoint(file, {.model = wrong.model.get(), .optimizer = wrong.opt.get()}); });
  EXPECT_NE(m.find(file), std::string::npos) << m;
  EXPECT_NE(m.find("weight"), std::string::npos) << m;
  EXPECT_NE(m.find("[5, 3]"), std::string::npos) << m;
  EXPECT_EQ(wrong.model->weight().toVector<float>(), before);

  // A different optimizer type: nothing restored, not even the (matching) model.
  Trainer c = makeTrainer(4);
  optim::SGD plain(c.model->parameters(), {.lr = 0.1});
  const auto cBefore = c.model->weight().toVector<float>();
  fakeStep(c, 0.1);  // gives `c.opt` state; `plain` has none, which is fine for the check
  const auto cAfter = c.model->weight().toVector<float>();
  ASSERT_NE(cAfter, cBefore);
  TrainingState other = st;
  other.optimizer->type = "Adam";
  const std::string file2 = saveCheckpoint(dir.file("adam.safetensors"), other);
  m = messageOf<CheckpointError>([&] { restoreCheckpoint(file2, {.model = c.model.get(), .optimizer = &plain}); });
  EXPECT_NE(m.find("Adam"), std::string::npos) << m;
  EXPECT_EQ(c.model->weight().toVector<float>(), cAfter);

  // A plain safetensors file is not a training checkpoint.
  saveSafetensors(dir.file("plain.safetensors"), a.model->stateDict());
  m = messageOf<CheckpointError>([&] { loadCheckpoint(dir.file("plain.safetensors")); });
  EXPECT_NE(m.find("not a cohort training checkpoint"), std::string::npos) << m;

  // Truncated checkpoint.
  std::string bytes = readBytes(file);
  writeBytes(dir.file("cut.safetensors"), bytes.substr(0, bytes.size() / 2));
  m = messageOf<CheckpointError>([&] { loadCheckpoint(dir.file("cut.safetensors")); });
  EXPECT_NE(m.find("cut.safetensors"), std::string::npos) << m;
  EXPECT_EQ(m.find("WRONG TYPE"), std::string::npos) << m;

  // Bad user input on save is a ValueError, and the old checkpoint survives.
  TrainingState badJson = st;
  badJson.extraJson = "{not json";
  EXPECT_THROW(saveCheckpoint(file, badJson), ValueError);
  EXPECT_EQ(readBytes(file), bytes);
}

TEST(TrainingCheckpoint, DataPositionRestoresTheLoader) {
  TempDir dir;
  auto ds = std::make_shared<data::TensorDataset>(arange(20, {.dtype = DType::Float32}).view({20, 1}),
                                                  arange(20, {.dtype = DType::Int64}));
  data::DataLoader a(ds, {.batchSize = 3, .shuffle = true, .seed = 8});
  std::vector<int64_t> firstHalf;
  for (auto& [x, y] : a) {
    for (int64_t v : y.toVector<int64_t>()) firstHalf.push_back(v);
    if (firstHalf.size() >= 9) break;
  }
  TrainingState st{.dataPosition = a.position()};
  const std::string file = saveCheckpoint(dir.file("d.safetensors"), st);

  data::DataLoader b(ds, {.batchSize = 3, .shuffle = true, .seed = 8});
  restoreCheckpoint(file, {.loader = &b});
  std::vector<int64_t> all = firstHalf;
  for (auto& [x, y] : b)
    for (int64_t v : y.toVector<int64_t>()) all.push_back(v);
  EXPECT_EQ(all, data::torchRandperm(20, 8));

  data::DataLoader small(ds, {.batchSize = 20});  // 1 batch per epoch: position batch 3 does not fit
  EXPECT_THROW(restoreCheckpoint(file, {.loader = &small}), CheckpointError);
}
