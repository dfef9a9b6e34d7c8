/*
 * TensorBoard logging from C++, modelled on PyTorch's torch.utils.tensorboard.SummaryWriter: a
 * SummaryWriter owns one event file in its log directory and appends scalars, histograms and text
 * to it; `tensorboard --logdir DIR` (the Python package) shows them.
 *
 *   io::SummaryWriter tb("runs/digits");
 *   tb.addScalar("train/loss", loss, step);
 *   tb.addHistogram("weights/fc1", fc1->weight, step);
 *   tb.addText("config", "lr 1e-3, batch 32", 0);
 *
 * The file is TensorFlow's: events.out.tfevents.<unix seconds>.<host>.<pid>.<n><suffix>, a
 * sequence of TFRecords (length, masked CRC32C, data, masked CRC32C) each holding one serialized
 * Event protocol buffer, the first of them file_version "brain.Event:2". Scalars are written as
 * Summary simple_value (float32, as PyTorch writes them: a NaN or infinity is logged as is), histograms as
 * HistogramProto (PyTorch's bucketing, below), text as a string tensor for the "text" plugin.
 *
 * Dependencies: the Event protocol buffers are encoded by Debian's protobuf (libprotobuf-dev,
 * protobuf-compiler: the lite runtime, from a .proto subset with TensorBoard's field numbers in
 * core/io/proto/, compiled by protoc at build time), so the bytes are the reference encoder's rather
 * than a hand-written one's; the library is linked privately into libcohort_core and no installed
 * header includes generated code, so programs using this header need no protobuf. CRC32C comes
 * from Boost.CRC (header-only; Boost is already needed by the distributed layer).
 *
 * Ownership and threads: the writer owns the file; any thread may call any member (one mutex
 * serialises them). Events are buffered in memory and written to the file by flush(), close(), the
 * destructor, and by the add that finds opts.maxQueue events pending or opts.flushSecs elapsed
 * since the last flush (there is no background thread: a writer nobody adds to is flushed when it
 * is flushed, closed or destroyed).
 *
 * Errors: bad arguments (empty tag, tag or text that is not UTF-8, empty histogram or one with a
 * NaN or infinity, bad bins, a non-finite wall time) throw ValueError naming the tag and what is
 * wrong, and write nothing. A log directory that cannot be created or an event file that cannot
 * be created or written throws SummaryWriterError naming the path and the OS reason; adding to a
 * closed writer throws SummaryWriterError too. The destructor never throws: it logs a failed last
 * flush as a warning (call close() to see the error).
 */
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <cohort/core/tensor/tensor.h>
#include <cohort/core/util/error.h>

namespace cohort::io {

// The log directory or the event file cannot be created or written, or the writer is closed.
class SummaryWriterError : public Error {
  using Error::Error;
};

struct SummaryWriterOptions {
  int maxQueue = 10;             // events buffered before an add writes them out (PyTorch's max_queue)
  double flushSecs = 120.0;      // an add writes the buffer out when this long passed since the last flush
  std::string filenameSuffix{};  // appended to the event file's name (PyTorch's filename_suffix)
};

// How addHistogram buckets the values, as PyTorch's add_histogram(bins=...) does with numpy.histogram.
// Neither field set: TensorFlow's default buckets (PyTorch's bins="tensorflow"): edges 0, ±1e-12
// growing by a factor 1.1 up to ±1e20 (values beyond ±1e20 count in min/max/num/sum but in no bucket).
struct HistogramBins {
  std::vector<double> edges{};  // increasing bin edges, at least two (numpy.histogram's bins=array)
  int64_t count = 0;            // this many equal-width bins over [min, max] (numpy.histogram's bins=int)
};

// What a histogram event holds (TensorBoard's HistogramProto). Bucket i counts the values from
// bucketLimits[i - 1] (inclusive) to bucketLimits[i] (exclusive; the last bin edge is inclusive);
// as PyTorch writes it, only the range from the first to the last non-empty bin is kept, with one
// empty bucket in front whose limit is the left edge of the first non-empty bin.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sumSquares = 0;
  std::vector<double> bucketLimits{};
  std::vector<double> bucketCounts{};
};

// Buckets `values` like PyTorch's make_histogram (ValueError for empty or non-finite values or bad
// bins; `what` names the histogram in the message).
Histogram makeHistogram(std::span<const double> values, const HistogramBins& bins = {},
                        const std::string& what = "histogram");

class SummaryWriter {
 public:
  // Creates logDir (and its parents) and a new event file in it, and writes the file_version record.
  explicit SummaryWriter(std::string logDir, SummaryWriterOptions opts = {});
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // wallTime: seconds since the Unix epoch (default: now).
  void addScalar(const std::string& tag, double value, int64_t step, std::optional<double> wallTime = {});
  // Any dtype and device; the values are read as float64.
  void addHistogram(const std::string& tag, const Tensor& values, int64_t step, const HistogramBins& bins = {},
                    std::optional<double> wallTime = {});
  void addHistogram(const std::string& tag, std::span<const double> values, int64_t step,
                    const HistogramBins& bins = {}, std::optional<double> wallTime = {});
  // Markdown text for TensorBoard's text plugin. Written under `tag` itself as a scalar string
  // tensor, as TensorBoard's own text summary writes it (PyTorch appends "/text_summary" to the tag
  // and writes a one-element vector, which the plugin shows as a one-cell table).
  void addText(const std::string& tag, const std::string& text, int64_t step, std::optional<double> wallTime = {});

  // Writes buffered events to the file (the OS's cache; not fsync). Nothing, once closed.
  void flush();
  // Flushes and closes the file; later adds throw SummaryWriterError. Calling it again does nothing.
  void close();

  const std::string& logDir() const { return logDir_; }
  const std::string& filePath() const { return filePath_; }  // the event file

 private:
  void appendEvent(const std::string& serializedEvent);  // mutex_ held
  void flushLocked();                                    // mutex_ held
  void requireOpen(const std::string& what) const;       // mutex_ held

  std::mutex mutex_;
  std::string logDir_;
  std::string filePath_;
  SummaryWriterOptions opts_;
  int fd_ = -1;
  std::string buffer_;    // framed records not yet written
  int pending_ = 0;       // events in buffer_
  double lastFlush_ = 0;  // steady-clock seconds
};

}  // namespace cohort::io
