// One epoch of the pipeline: reader threads -> decoder threads -> batch slots -> consumer.
//
//  * Readers claim sample sequence numbers in order (one atomic counter), wait until the
//    sample's batch is admitted (batch < consumed + prefetch depth: the ring's bound), take a
//    read buffer from the free list (their count bounds the reads in flight), read the bytes
//    and hand them to the decoders through a lock-free queue (HandoffQueue: oneTBB's
//    concurrent_queue plus a semaphore, so that idle threads sleep instead of spinning).
//  * Decoders decode only what the transform needs and write the result straight into the
//    sample's place in its batch slot, then count the batch down; the decoder that completes a
//    batch wakes the consumer.
//  * The consumer takes batches strictly in order. A failure travels with its batch: the
//    consumer gets it at the batch where the sample belongs, after all earlier batches.
//  * Worker count, reads in flight and ring depth can change while running: threads beyond the
//    target park; new ones are started on demand.
//
// Locks are std::mutex (pthread) rather than absl::Mutex: Debian's prebuilt Abseil is not
// instrumented, so ThreadSanitizer could not see absl::Mutex's ordering. They are taken once per
// batch, never per sample; per-sample hand-offs are lock-free (atomics and the TBB queue).
//
// Thread safety: `Next()` is called by one consumer thread; `Cancel()` and the setters may be
// called from any thread. The destructor cancels and joins every thread it started.
#ifndef FEEDLINE_SRC_PIPELINE_EPOCH_RUN_H_
#define FEEDLINE_SRC_PIPELINE_EPOCH_RUN_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "feedline/batch.h"
#include "pipeline/loader_shared.h"
#include "pipeline/sleep.h"

namespace feedline {

class EpochRun {
 public:
  // Largest ring depth (batches in flight); the memory budget usually bounds it far lower.
  static constexpr int kMaxPrefetch = 64;

  EpochRun(std::shared_ptr<LoaderShared> shared, int64_t epoch, int64_t start_batch);
  ~EpochRun();
  EpochRun(const EpochRun&) = delete;
  EpochRun& operator=(const EpochRun&) = delete;

  // The next batch; kOutOfRange at the end; kCancelled after Cancel(). While waiting it calls
  // `interrupted` every `poll` (if given): a non-OK status from it is returned (the batch
  // stays queued, so the call can be repeated).
  absl::StatusOr<Batch> Next(const std::function<absl::Status()>& interrupted = nullptr,
                             absl::Duration poll = absl::Milliseconds(100));
  void Cancel();

  void SetWorkers(int n);
  void SetIoDepth(int n);
  void SetPrefetch(int n);

  int64_t epoch() const { return epoch_; }
  int64_t num_batches() const { return num_batches_; }
  int64_t consumed() const { return consumed_.load(std::memory_order_acquire); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // True in a child of fork() made after this run started: its threads are the parent's, and
  // its locks and condition variables may be held or waited on by them. Such a run must be
  // leaked, never touched or destroyed (glibc's pthread_cond_destroy would wait forever).
  bool forked() const;

 private:
  struct ReadItem;
  struct ReaderState;
  struct InFlight;
  struct Queues;
  struct DecoderState;

  void ReaderLoop(int id, std::shared_ptr<ReaderState> state);
  void StartReader(int id);  // threads_mu_ held
  // Fails reads older than the timeout and replaces their threads (tuner thread).
  void AbandonStuckReads(int64_t older_than_ns, const char* why);
  void TunerLoop();
  void TunerTick(double interval_s);
  void DecoderLoop(int id);
  // Opens batches up to and including b (their slots and counts). b must be admitted.
  void EnsureOpen(int64_t b);
  // Waits until batch b is admitted or the run is cancelled; false when cancelled.
  bool WaitAdmitted(int64_t b);
  // Parks thread `id` while id >= target; false when cancelled.
  bool ParkWhileSurplus(int id, const std::atomic<int>& target);
  void Wake();
  void StartThreads();
  void Shutdown();
  void CompleteSample(InFlight& e);
  ReadItem* AcquireReadItem();
  // Decodes one sample into its slot; true when the item was sent for a replacement read
  // (on_error = skip) instead of completing its sample.
  bool ProcessSample(ReadItem* item, DecoderState* state);
  int64_t PickReplacement(int64_t seq, int64_t failed, int* attempt);
  void StartRetryReaderIfNeeded();
  void StartRetryReader();  // threads_mu_ held
  void RetryLoop(std::shared_ptr<ReaderState> state);
  // Reads item->sample into the item under the watchdog's protocol and queues it for
  // decoding; false when the read was abandoned (the caller must return at once).
  bool ReadInto(ReadItem* item, ReaderState* state, SampleSource* source, TraceTrack* track);
  static constexpr int kReplaceAttempts = 16;
  absl::Status TooManyErrors();  // max_errors exceeded: the error to give the consumer
  absl::Status DecodeInto(const ReadItem& item, uint8_t* dst, DecoderState* state);
  // cache = decoded, on a miss: the image decoded at the cache's bounded resolution (stored in
  // the cache when it fits). Later epochs crop from the same image.
  absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> DecodeForCache(const ReadItem& item,
                                                                           DecoderState* state);

  int64_t last_return_ns_ = 0;  // consumer thread only
  int64_t held_images_ = 0;     // the last returned batch's images; consumer thread only

  const std::shared_ptr<LoaderShared> shared_;
  const int64_t epoch_;
  const std::vector<int64_t> order_;
  const int64_t batch_size_;
  const int64_t num_batches_;
  const int64_t total_seq_;  // samples in the epoch (after drop_last)

  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> next_seq_;
  std::atomic<int64_t> consumed_;      // batches handed out (the next to hand out)
  WakeWord wake_;  // a new generation on any change readers/parkers wait for

  std::mutex open_mu_;
  int64_t opened_ ABSL_GUARDED_BY(open_mu_);
  std::unique_ptr<InFlight[]> inflight_;  // kMaxPrefetch entries, batch b at b % kMaxPrefetch

  std::mutex done_mu_;  // consumer waits here for its batch; decoders signal per batch
  std::condition_variable done_cv_;

  std::unique_ptr<Queues> queues_;
  std::atomic<int> read_items_created_{0};

  std::mutex tuner_mu_;  // the tuner thread sleeps here between ticks
  std::condition_variable tuner_cv_;

  std::mutex threads_mu_;
  struct Reader {
    std::thread thread;
    std::shared_ptr<ReaderState> state;
  };
  std::vector<Reader> readers_ ABSL_GUARDED_BY(threads_mu_);
  Reader retry_reader_ ABSL_GUARDED_BY(threads_mu_);  // started on the first replacement
  std::mutex bad_mu_;
  std::set<int64_t> bad_samples_ ABSL_GUARDED_BY(bad_mu_);  // failed in this epoch
  std::atomic<int64_t> run_read_bytes_{0};  // read buffer capacity this run added to the count
  const uint64_t fork_generation_;          // the process generation that started the threads
  std::vector<std::thread> decoders_ ABSL_GUARDED_BY(threads_mu_);
  std::thread tuner_thread_ ABSL_GUARDED_BY(threads_mu_);
  // Counter values at the previous tuning tick.
  struct Counters {
    int64_t images = 0, consumer_busy = 0, stepped_images = 0, consumer_wait = 0,
            steady_wait = 0, decoded = 0, decode_busy = 0, reads = 0, read_busy = 0,
            decode_cpu = 0;
  } last_tick_;
  Counters ReadCounters() const;
  TraceTrack* consumer_track_ = nullptr;
  TraceTrack* batch_track_ = nullptr;
  bool shut_down_ ABSL_GUARDED_BY(threads_mu_) = false;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_PIPELINE_EPOCH_RUN_H_
