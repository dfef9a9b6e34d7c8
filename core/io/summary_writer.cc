#include <cohort/core/io/summary_writer.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <boost/crc.hpp>

#include <cohort/core/io/detail/tfrecord.h>
#include <cohort/core/util/logging.h>

#include "io/proto/tensorboard_event.pb.h"  // generated from core/io/proto/tensorboard_event.proto (core/CMakeLists.txt)

namespace cohort::io {

// ---- TFRecord framing --------------------------------------------------------------------------

namespace detail {

uint32_t crc32c(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t maskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

namespace {
template <typename T>
void appendLittleEndian(std::string& out, T v) {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
    else v = __builtin_bswap32(v);
  }
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
}  // namespace

void appendTfRecord(std::string& out, std::string_view data) {
  const size_t at = out.size();
  appendLittleEndian<uint64_t>(out, data.size());
  appendLittleEndian<uint32_t>(out, maskCrc32c(crc32c(out.data() + at, sizeof(uint64_t))));
  out.append(data);
  appendLittleEndian<uint32_t>(out, maskCrc32c(crc32c(data.data(), data.size())));
}

}  // namespace detail

namespace {

constexpr const char* kFileVersion = "brain.Event:2";

double unixNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }
double steadyNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Event files of one process are numbered, as TensorFlow's and PyTorch's writers number theirs.
std::atomic<int64_t> gFileCounter{0};

bool validUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and code points beyond Unicode's range are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += len;
  }
  return true;
}

void checkTag(const std::string& tag, const char* op) {
  if (tag.empty()) throw ValueError(fmt::format("SummaryWriter::{}: the tag is empty", op));
  if (!validUtf8(tag)) throw ValueError(fmt::format("SummaryWriter::{}: the tag '{}' is not valid UTF-8", op, tag));
}

double wallTimeOf(const std::optional<double>& wallTime, const std::string& tag, const char* op) {
  if (!wallTime) return unixNow();
  if (!std::isfinite(*wallTime))
    throw ValueError(fmt::format("SummaryWriter::{}: tag '{}': the wall time {} is not finite", op, tag, *wallTime));
  return *wallTime;
}

// TensorFlow's default histogram bucket edges, as PyTorch builds them (torch.utils.tensorboard's
// _get_default_bins): -1e20..-1e-12, 0, 1e-12..1e20, each limit 1.1 times the previous one.
const std::vector<double>& defaultEdges() {
  static const std::vector<double> kEdges = [] {
    std::vector<double> pos;
    for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return kEdges;
}

std::string serialize(const tbproto::Event& ev) {
  std::string out;
  if (!ev.SerializeToString(&out)) throw Error("SummaryWriter: could not serialize an event");
  return out;
}

}  // namespace

// ---- histograms --------------------------------------------------------------------------------

Histogram makeHistogram(std::span<const double> values, const HistogramBins& bins, const std::string& what) {
  if (values.empty()) throw ValueError(fmt::format("{}: no values (a histogram needs at least one)", what));
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      throw ValueError(fmt::format("{}: value {} of {} is {} (a histogram takes finite values only)", what, i,
                                   values.size(), values[i]));
    }
  }
  Histogram h;
  h.min = *std::min_element(values.begin(), values.end());
  h.max = *std::max_element(values.begin(), values.end());
  h.num = static_cast<double>(values.size());
  for (double v : values) {
    h.sum += v;
    h.sumSquares += v * v;
  }

  // The bin edges, as numpy.histogram makes them from PyTorch's `bins`.
  std::vector<double> edgesStore;
  const std::vector<double>* edges = &edgesStore;
  if (!bins.edges.empty() && bins.count != 0)
    throw ValueError(fmt::format("{}: give the bins' edges or their count, not both", what));
  if (!bins.edges.empty()) {
    if (bins.edges.size() < 2)
      throw ValueError(fmt::format("{}: {} bin edge given; a histogram needs at least two", what, bins.edges.size()));
    for (size_t i = 0; i < bins.edges.size(); ++i) {
      if (!std::isfinite(bins.edges[i])) throw ValueError(fmt::format("{}: bin edge {} is {}", what, i, bins.edges[i]));
      if (i > 0 && !(bins.edges[i] > bins.edges[i - 1])) {
        throw ValueError(fmt::format("{}: bin edges must increase, but edge {} is {} after {}", what, i, bins.edges[i],
                                     bins.edges[i - 1]));
      }
    }
    edges = &bins.edges;
  } else if (bins.count != 0) {
    if (bins.count < 0) throw ValueError(fmt::format("{}: the bin count {} is negative", what, bins.count));
    double first = h.min, last = h.max;
    if (first == last) first -= 0.5, last += 0.5;
    // numpy.linspace(first, last, count + 1): i * step + first, the last edge exactly `last`.
    const double step = (last - first) / static_cast<double>(bins.count);
    edgesStore.resize(static_cast<size_t>(bins.count) + 1);
    for (int64_t i = 0; i <= bins.count; ++i)
      edgesStore[static_cast<size_t>(i)] = static_cast<double>(i) * step + first;
    edgesStore.back() = last;
  } else {
    edges = &defaultEdges();
  }

  // numpy.histogram: bin j counts edges[j] <= v < edges[j + 1], the last bin its right edge too;
  // values outside [edges.front(), edges.back()] count in no bin.
  const size_t nbins = edges->size() - 1;
  std::vector<double> counts(nbins, 0.0);
  for (double v : values) {
    if (v < edges->front() || v > edges->back()) continue;
    auto j = static_cast<size_t>(std::upper_bound(edges->begin(), edges->end(), v) - edges->begin());
    j = j == 0 ? 0 : std::min(j - 1, nbins - 1);
    counts[j] += 1;
  }
  // PyTorch's make_histogram keeps the bins from the first to the last non-empty one, and in
  // front of them an empty bucket whose limit is where the first non-empty bin starts (TensorBoard
  // stores only the right edges).
  size_t first = nbins, last = 0;
  for (size_t j = 0; j < nbins; ++j) {
    if (counts[j] > 0) {
      first = std::min(first, j);
      last = j;
    }
  }
  if (first == nbins) {
    throw ValueError(fmt::format("{}: none of the {} values (min {}, max {}) lies within the bin edges [{}, {}]", what,
                                 values.size(), h.min, h.max, edges->front(), edges->back()));
  }
  if (first > 0) {
    h.bucketCounts.assign(counts.begin() + static_cast<std::ptrdiff_t>(first - 1),
                          counts.begin() + static_cast<std::ptrdiff_t>(last + 1));
  } else {
    h.bucketCounts.push_back(0.0);
    h.bucketCounts.insert(h.bucketCounts.end(), counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(last + 1));
  }
  h.bucketLimits.assign(edges->begin() + static_cast<std::ptrdiff_t>(first),
                        edges->begin() + static_cast<std::ptrdiff_t>(last + 2));
  return h;
}

// ---- SummaryWriter -----------------------------------------------------------------------------

SummaryWriter::SummaryWriter(std::string logDir, SummaryWriterOptions opts)
    : logDir_(std::move(logDir)), opts_(std::move(opts)) {
  if (logDir_.empty()) throw ValueError("SummaryWriter: the log directory is empty");
  if (opts_.maxQueue < 0) throw ValueError(fmt::format("SummaryWriter: maxQueue {} is negative", opts_.maxQueue));
  if (!(opts_.flushSecs >= 0))  // NaN too; infinity: never by time
    throw ValueError(fmt::format("SummaryWriter: flushSecs {} is not a non-negative number", opts_.flushSecs));
  if (opts_.filenameSuffix.find('/') != std::string::npos)
    throw ValueError(fmt::format("SummaryWriter: the file name suffix '{}' contains '/'", opts_.filenameSuffix));

  std::error_code ec;
  std::filesystem::create_directories(logDir_, ec);
  if (ec || !std::filesystem::is_directory(logDir_)) {
    throw SummaryWriterError(fmt::format("SummaryWriter: cannot create the log directory '{}': {}", logDir_,
                                         ec ? ec.message() : "it exists and is not a directory"));
  }

  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  const auto seconds = static_cast<int64_t>(unixNow());
  filePath_ = (std::filesystem::path(logDir_) / fmt::format("events.out.tfevents.{:010}.{}.{}.{}{}", seconds, host,
                                                            ::getpid(), gFileCounter++, opts_.filenameSuffix))
                  .string();
  fd_ = ::open(filePath_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw SummaryWriterError(
        fmt::format("SummaryWriter: cannot create the event file '{}': {}", filePath_, std::strerror(errno)));
  }

  tbproto::Event ev;
  ev.set_wall_time(unixNow());
  ev.set_file_version(kFileVersion);
  try {
    appendEvent(serialize(ev));
    flushLocked();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    COHORT_LOG(Warning, "{} (events logged since the last flush are lost)", e.what());
  }
}

void SummaryWriter::requireOpen(const std::string& what) const {
  if (fd_ < 0)
    throw SummaryWriterError(fmt::format("SummaryWriter::{}: the writer of '{}' is closed", what, filePath_));
}

void SummaryWriter::appendEvent(const std::string& serializedEvent) {
  detail::appendTfRecord(buffer_, serializedEvent);
  ++pending_;
  if (pending_ >= std::max(1, opts_.maxQueue) || steadyNow() - lastFlush_ >= opts_.flushSecs) flushLocked();
}

void SummaryWriter::flushLocked() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      buffer_.erase(0, done);  // what was written stays written; a later flush retries the rest
      throw SummaryWriterError(
          fmt::format("SummaryWriter: writing the event file '{}' failed: {}", filePath_, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  pending_ = 0;
  lastFlush_ = steadyNow();
}

void SummaryWriter::addScalar(const std::string& tag, double value, int64_t step, std::optional<double> wallTime) {
  checkTag(tag, "addScalar");
  tbproto::Event ev;
  ev.set_wall_time(wallTimeOf(wallTime, tag, "addScalar"));
  ev.set_step(step);
  tbproto::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  const std::string bytes = serialize(ev);
  std::lock_guard lock(mutex_);
  requireOpen("addScalar");
  appendEvent(bytes);
}

void SummaryWriter::addHistogram(const std::string& tag, const Tensor& values, int64_t step, const HistogramBins& bins,
                                 std::optional<double> wallTime) {
  checkTag(tag, "addHistogram");
  if (!values.defined())
    throw ValueError(fmt::format("SummaryWriter::addHistogram: tag '{}': the tensor is undefined", tag));
  const std::vector<double> v = values.toVector<double>();
  addHistogram(tag, std::span<const double>(v), step, bins, wallTime);
}

void SummaryWriter::addHistogram(const std::string& tag, std::span<const double> values, int64_t step,
                                 const HistogramBins& bins, std::optional<double> wallTime) {
  checkTag(tag, "addHistogram");
  const Histogram h = makeHistogram(values, bins, fmt::format("SummaryWriter::addHistogram: tag '{}'", tag));
  tbproto::Event ev;
  ev.set_wall_time(wallTimeOf(wallTime, tag, "addHistogram"));
  ev.set_step(step);
  tbproto::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  tbproto::HistogramProto* p = v->mutable_histo();
  p->set_min(h.min);
  p->set_max(h.max);
  p->set_num(h.num);
  p->set_sum(h.sum);
  p->set_sum_squares(h.sumSquares);
  p->mutable_bucket_limit()->Add(h.bucketLimits.begin(), h.bucketLimits.end());
  p->mutable_bucket()->Add(h.bucketCounts.begin(), h.bucketCounts.end());
  const std::string bytes = serialize(ev);
  std::lock_guard lock(mutex_);
  requireOpen("addHistogram");
  appendEvent(bytes);
}

void SummaryWriter::addText(const std::string& tag, const std::string& text, int64_t step,
                            std::optional<double> wallTime) {
  checkTag(tag, "addText");
  if (!validUtf8(text))
    throw ValueError(fmt::format("SummaryWriter::addText: tag '{}': the text is not valid UTF-8", tag));
  tbproto::Event ev;
  ev.set_wall_time(wallTimeOf(wallTime, tag, "addText"));
  ev.set_step(step);
  tbproto::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  // The text plugin's metadata: its name, and TextPluginData{version: 0} as content (which
  // serializes to no bytes).
  tbproto::SummaryMetadata* meta = v->mutable_metadata();
  meta->mutable_plugin_data()->set_plugin_name("text");
  meta->mutable_plugin_data()->set_content("");
  meta->set_data_class(tbproto::DATA_CLASS_TENSOR);
  tbproto::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tbproto::DT_STRING);
  t->mutable_tensor_shape();  // rank 0: a scalar string
  t->add_string_val(text);
  const std::string bytes = serialize(ev);
  std::lock_guard lock(mutex_);
  requireOpen("addText");
  appendEvent(bytes);
}

void SummaryWriter::flush() {
  std::lock_guard lock(mutex_);
  if (fd_ >= 0) flushLocked();  // a closed writer has nothing left to write
}

void SummaryWriter::close() {
  std::lock_guard lock(mutex_);
  if (fd_ < 0) return;
  try {
    flushLocked();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    throw SummaryWriterError(
        fmt::format("SummaryWriter: closing the event file '{}' failed: {}", filePath_, std::strerror(errno)));
  }
}

}  // namespace cohort::io
