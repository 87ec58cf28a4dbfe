// feedline — sample transforms: the map stage's seam.
//
// A `SampleTransform` turns a `Record` (what the data set read) into one sample of its output
// `Schema`, written by a `SampleWriter` straight into the sample's place in its batch slot: no
// per-sample tensor, no collation copy for fixed-shape fields.
//
//   class Features : public feedline::SampleTransform {
//    public:
//     const feedline::Schema& schema() const override { return schema_; }
//     absl::Status Apply(const feedline::Record& record, const feedline::SampleContext& ctx,
//                        WorkerState*, feedline::SampleWriter& out) const override {
//       float* x = out.Fixed<float>(0);                      // [16], in place
//       feedline::SampleRng rng = ctx.rng(/*stream=*/1);     // same draws for any worker count
//       for (int i = 0; i < 16; ++i) x[i] = float(rng.Uniform());
//       const int64_t n = 1 + ctx.index() % 7;              // a variable-length field
//       absl::StatusOr<int32_t*> ids = out.Shaped<int32_t>(1, {n});
//       if (!ids.ok()) return ids.status();
//       for (int64_t i = 0; i < n; ++i) (*ids)[i] = int32_t(i);
//       return absl::OkStatus();
//     }
//    private:
//     feedline::Schema schema_{feedline::Field("x", feedline::DType::kFloat32, {16}),
//                              feedline::Field("ids", feedline::DType::kInt32,
//                                              {feedline::Dim::UpTo(8)})};
//   };
//
// Contract: `Apply` is called by many worker threads at once: it must not modify the transform
// (it is const) except through thread-safe members; what one worker needs for itself (a decoder,
// scratch buffers) lives in the `WorkerState` that `NewWorkerState` makes, one per worker
// thread, passed back to every `Apply` on that thread. A loader keeps its worker threads, and
// their states, from epoch to epoch (until the loader goes). Randomness must come from `ctx.rng()`
// (a pure function of seed, epoch and sample index), never from a thread's own state, so that a
// seed gives the same bytes for any worker count and a resumed run continues exactly.
// `Apply` must write every field of the schema (a field left unwritten is the sample's error)
// and returns an error for a sample it cannot make; a thrown exception is caught by the loader
// and becomes that sample's error. A do-nothing transform is not allowed: the schema has at
// least one field.
#ifndef FEEDLINE_TRANSFORM_H_
#define FEEDLINE_TRANSFORM_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "feedline/dataset.h"
#include "feedline/device.h"
#include "feedline/options.h"
#include "feedline/random.h"
#include "feedline/schema.h"

namespace feedline {

namespace internal {
struct BatchSlot;
struct SlotLayout;
}  // namespace internal

// Where a sample stands in its epoch, and its deterministic randomness.
class SampleContext {
 public:
  SampleContext(uint64_t seed, int64_t epoch, int64_t index, int64_t position)
      : seed_(seed), epoch_(epoch), index_(index), position_(position) {}
  uint64_t seed() const noexcept { return seed_; }
  int64_t epoch() const noexcept { return epoch_; }
  int64_t index() const noexcept { return index_; }        // the data set's sample index
  int64_t position() const noexcept { return position_; }  // this rank's position in the epoch
  // A generator for one kind of choice (`stream`: any constant of the transform's): the same
  // (seed, epoch, index, stream) always gives the same draws.
  SampleRng rng(uint64_t stream) const noexcept {
    return SampleRng(seed_, uint64_t(epoch_), uint64_t(index_), kRngUserBase + stream);
  }

 private:
  uint64_t seed_;
  int64_t epoch_, index_, position_;
};

// Writes one sample's fields into its place in the batch slot.
// Thread safety: one writer per sample, used by the worker that makes the sample.
class SampleWriter {
 public:
  // A fixed-shape field's memory for this sample (field.max_bytes() bytes, dense, row-major).
  // Calling it marks the field written. Precondition (asserted): the field has no variable
  // dimension.
  void* Fixed(int field);
  template <typename T>
  T* Fixed(int field) {
    return static_cast<T*>(Fixed(field));
  }
  // This sample's shape for a field (any field; fixed dimensions must match, variable ones be
  // within their maximum) and the memory for its elements, dense in that shape. kInvalidArgument
  // naming the field and both shapes otherwise: nothing is written past the field's place.
  absl::StatusOr<void*> Shaped(int field, absl::Span<const int64_t> shape);
  template <typename T>
  absl::StatusOr<T*> Shaped(int field, std::initializer_list<int64_t> shape) {
    absl::StatusOr<void*> p = Shaped(field, absl::Span<const int64_t>(shape.begin(), shape.size()));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  // Shaped() and a copy of the elements (`data` holds them in the field's dtype).
  absl::Status Write(int field, absl::Span<const int64_t> shape, const void* data);

  const Schema& schema() const noexcept;
  int64_t position_in_batch() const noexcept { return pos_; }

 private:
  friend struct internal::SlotLayout;
  SampleWriter(const internal::SlotLayout* layout, internal::BatchSlot* slot, int64_t pos)
      : layout_(layout), slot_(slot), pos_(pos) {}
  const internal::SlotLayout* layout_;
  internal::BatchSlot* slot_;
  int64_t pos_;
  uint64_t written_ = 0;  // one bit per field
};

class SampleTransform {
 public:
  // One worker thread's own state (a decoder, scratch): derive from it.
  class WorkerState {
   public:
    virtual ~WorkerState() = default;
  };

  virtual ~SampleTransform() = default;
  // The fields every sample has. Called once, when a loader is created; must stay the same.
  virtual const Schema& schema() const = 0;
  // Called once per worker thread, on it (again if it returned null or threw); the state lives
  // as long as the thread: the loader's life. The default has no state (Apply gets null).
  virtual std::unique_ptr<WorkerState> NewWorkerState() const { return nullptr; }
  virtual absl::Status Apply(const Record& record, const SampleContext& context, WorkerState* state,
                             SampleWriter& out) const = 0;
  // True when Apply does not need sample `index`'s record (the transform holds what it needs,
  // in a cache of its own): the read stage then skips the read. Thread-safe.
  virtual bool SkipsRead(int64_t index) const {
    (void)index;
    return false;
  }
  // True when each batch must be one worker thread's work, its samples made in order: the
  // workers then hand off whole batches (never a share of one). For a transform that sends a
  // batch to a resource of its own (feedline's Python worker processes send batch k to process
  // k mod n, as torch's DataLoader does, so that a worker's identity is the same in every run).
  virtual bool WholeBatches() const { return false; }
  // True when Apply takes a lock that the consumer's thread needs for its own work (Python's
  // GIL: a Python data set run on worker threads). Its workers then run at the consumer's
  // priority (LoaderOptions::worker_nice is not applied): a worker below it holding the lock
  // would stall the consumer behind every other busy thread (a priority inversion).
  virtual bool SharesConsumerLocks() const { return false; }
  // False when an epoch's samples may be made only once the consumer asks for that epoch: Apply
  // counts something of what it makes for stats() (the tokenizer's truncation cuts: a head
  // start dropped by set_epoch would count documents never delivered). The engine then starts no
  // epoch ahead of the consumer (LoaderOptions::epoch_head_start is not applied). A transform
  // whose positions mean what is set between epochs (feedline.DataLoader's sampler order) says
  // yes here and answers MayStartEpoch once the next epoch's are known.
  virtual bool MayStartAhead() const { return true; }
  // Asked (on the consumer's thread) when the engine would start `epoch` ahead, its previous
  // epoch's batches all made: false, not yet (asked again at the consumer's next batch).
  // feedline.DataLoader's transform says yes once Python has foreseen that epoch's sampler
  // order. Only asked when MayStartAhead().
  virtual bool MayStartEpoch(int64_t /*epoch*/) const { return true; }
  // True when this transform was made from the loader options of `group` (the image built-in's
  // transform, image::MakeTransform(options), from the image options): the generic factory
  // then takes those options beside the engine's. Any other option of a group no transform
  // reads is refused there, named, rather than silently ignored.
  virtual bool ReadsOptions(OptionGroup /*group*/) const { return false; }
  // The fields a GPU loader's device converts after their copy, as this transform leaves them
  // on the host (device.h): the image built-in made for a GPU writes uint8 HWC pixels and asks
  // for them normalised there. Asked once, when a loader on a GPU is made. Default: none (every
  // field is copied as it is).
  virtual std::vector<DeviceConversion> DeviceConversions() const { return {}; }
  // Figures the transform keeps for stats() (Stats::transform_counters), as (name, value):
  // the image built-in's images in the decompression-bomb warning band, say. Any thread.
  virtual std::vector<std::pair<std::string, int64_t>> Counters() const { return {}; }
};

// For a transform whose work runs off the calling worker thread (feedline.DataLoader's worker
// processes, a service): adds `ns` of CPU time spent elsewhere on this worker's behalf. The
// autotuner costs a sample by its workers' CPU time; without this it would see only the calling
// thread's, which waits, and count the sample as nearly free. Call from Apply's thread; values
// <= 0 are ignored.
void ReportOffThreadCpu(int64_t ns);

}  // namespace feedline

#endif  // FEEDLINE_TRANSFORM_H_
