// The read stage: reader threads that turn sample positions into records.
//
// Readers claim positions in order (one atomic counter), wait until the position's batch is
// admitted (the ring's bound), take a read item (their number bounds the reads in flight), read
// the record through the data set (or the bytes cache) and hand it to the map stage. A retry
// reader reads the replacements of failed samples, under the same timeout.
//
// Asynchronous data sets (Dataset::async_reads, e.g. HTTP/S3): one reader thread starts reads
// with ReadAsync and goes on, keeping up to io_depth of them in flight; each read's callback
// (on the data set's thread: the HTTP loop) puts the record in its entry and hands the chunk to
// the map stage when its last read ends. The watchdog fails such reads that outlive
// `read_timeout_ms` too (their late callbacks are then ignored); after Stop, late callbacks
// touch nothing of the run (AsyncState::stopped).
//
// Hung storage: each reader publishes what it is reading; the watchdog (the tuning loop's
// thread) fails reads older than `read_timeout_ms` with kDeadlineExceeded, detaches the stuck
// thread (which keeps alive only what it touches: its own state and the loader's shared state)
// and starts a replacement, so neither training nor shutdown waits on a hung mount.
//
// Thread safety: SetThreads, AbandonStuckReads, Resubmit and Stop from any thread.
#ifndef FEEDLINE_SRC_ENGINE_READ_STAGE_H_
#define FEEDLINE_SRC_ENGINE_READ_STAGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/trace.h"
#include "engine/batch_ring.h"
#include "engine/epoch_core.h"

namespace feedline {

class ReadStage {
 public:
  ReadStage(EpochCore* core, BatchRing* ring, ItemQueues* queues, int64_t start_seq);

  // Starts reader threads up to `n` (surplus ones park; see EpochCore::ParkWhileSurplus).
  // Without a read stage (LoaderShared::inline_reads) it starts none.
  void SetThreads(int n);
  // Claims the next chunk of positions [*seq, *end): at most LoaderShared::chunk of them, never
  // across a batch's end. False at the end of the epoch. Readers call it; so do the workers
  // when there is no read stage.
  bool Claim(int64_t* seq, int64_t* end);
  // Reads one entry in the calling thread (no watchdog: for data sets with empty records).
  void ReadInline(ReadEntry* entry);
  int threads();
  // Sends an item back for a replacement read (by the retry reader).
  void Resubmit(ReadItem* item);
  // Fails reads older than `older_than_ns` and replaces their threads.
  void AbandonStuckReads(int64_t older_than_ns, const char* why);
  // After cancellation: abandons reads in progress and moves the threads to `join`.
  void Stop(std::vector<std::thread>* join);
  // Read buffer capacity this epoch added to the loader's count (returned at the end).
  int64_t TakeBufferBytes() { return buffer_bytes_.exchange(0); }

 private:
  struct ReaderState;
  struct AsyncState;
  struct AsyncRead;
  struct Reader {
    std::thread thread;
    std::shared_ptr<ReaderState> state;
  };
  void StartReader(int id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartRetryReader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReaderLoop(int id, std::shared_ptr<ReaderState> state);
  void RetryLoop(std::shared_ptr<ReaderState> state);
  // Reads item->sample into the item under the watchdog's protocol and queues it for the map
  // stage; false when the read was abandoned (the caller must return at once).
  bool ReadInto(ReadItem* item, ReaderState* state, TraceTrack* track);
  // Starts the reads of `item` (async data sets), waiting for room within io_depth; false
  // when cancelled meanwhile.
  bool StartReads(ReadItem* item, TraceTrack* track);
  static void Complete(AsyncRead* read, absl::Status status);
  // The watchdog's part for asynchronous reads: fails those started before `older_than_ns`.
  void AbandonAsyncReads(int64_t older_than_ns, const char* why);

  EpochCore* const core_;
  BatchRing* const ring_;
  ItemQueues* const queues_;
  std::atomic<int64_t> next_seq_;
  std::atomic<int64_t> buffer_bytes_{0};
  const bool async_;  // the data set reads asynchronously
  std::shared_ptr<AsyncState> async_state_;
  std::mutex mu_;
  std::vector<Reader> readers_ ABSL_GUARDED_BY(mu_);
  Reader retry_reader_ ABSL_GUARDED_BY(mu_);  // started on the first replacement
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_READ_STAGE_H_
