// Python data sets in the engine: the transform behind `feedline.DataLoader`.
//
// A Python `Dataset` is read by position: the engine runs over positions 0..n-1 of the epoch's
// order (what the sampler gave, in Python), unshuffled, and `PyTransform::Apply` makes the
// sample (or, in batch mode, the whole batch) at a position in one of two executors:
//   - threads: the engine's worker thread takes the GIL and calls `fetch(position)`, which
//     returns the sample's leaves as contiguous buffers (numpy arrays) in schema order, or an
//     error text; the leaves are copied into the batch slot with the GIL released.
//   - processes: the worker thread hands the position's dataset keys to an idle worker process
//     (a pipe per process) and waits for its reply; the process writes the leaves into its own
//     shared-memory staging area (or, past it, through the pipe) and the thread copies them
//     into the slot. No pickling of tensor data; no GIL in the parent.
// A worker process that dies is replaced (`respawn`, in Python) and its sample retried once on
// the new process; dying again fails the sample with the exit status.
//
// Wire format (little-endian int64 words). Request: [op=1, position, n, seed, index, key_0 ..
// key_n-1]: `seed` is the epoch's base seed and `index` the place of key_0 in the epoch's whole
// order (resumed epochs included), so the process seeds each sample's RNGs from (seed, index +
// j) whichever process makes it. In batch mode the n keys are one position's batch; else they
// are n consecutive positions of one batch (a chunk: SetKeys). op=0 asks the process to exit
// (the other words are 0); op=3 (AdoptProcesses) is described there. Reply: [status, inline,
// nbytes, cpu_ns] then, when `inline`, nbytes of payload on the pipe (else the payload is at
// the start of the staging area); cpu_ns is the process's CPU time for the request (the
// autotuner's cost of the samples: ReportOffThreadCpu), bounded by the request's wall time x
// cores where it is read. status 0: the payload is the (first) sample's fields in schema order,
// each as its shape (one word per dimension) then its elements, padded to 8 bytes; in batch
// mode the payload is opaque (a batch: _payload.py, kept for `take_result`). status 1: the
// payload is an error text: a summary line, then details for Python (`take_error`). status 2
// (a chunk asked for): the payload is a table of the chunk's first samples, each its own
// status 0 or 1 payload (wire_format.h: ReadChunkTable); the rest are asked for again.
//
// Thread safety: Apply from any number of engine threads; the setters from the Python thread
// between epochs (they take the same lock).
#ifndef FEEDLINE_PYTHON_PY_DATASET_H_
#define FEEDLINE_PYTHON_PY_DATASET_H_

#include <pybind11/pybind11.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "feedline/dataset.h"
#include "feedline/schema.h"
#include "feedline/transform.h"

namespace feedline::python {

// The largest reply a worker process may send inline (a sample or a batch-mode result larger
// than its staging area): past it the reply is malformed, never allocated.
inline constexpr int64_t kMaxInlineReply = int64_t{4} << 30;

// Positions 0..n-1 with nothing to read: the transform makes each sample.
std::shared_ptr<const Dataset> MakePositions(int64_t n, uint64_t fingerprint);

class PyTransform : public SampleTransform {
 public:
  // `batch_mode`: each position is a whole batch, made in Python (a user collate_fn, irregular
  // batches); the schema is then one int64 field holding the position.
  PyTransform(Schema schema, bool batch_mode, pybind11::object fetch);
  ~PyTransform() override;

  const Schema& schema() const override { return schema_; }
  // Each worker thread takes the lowest free worker id (0, 1, ...) for its life and passes it
  // to `fetch(position, worker)`: get_worker_info().id and worker_init_fn see the same ids in
  // every epoch, below the number of threads, as torch's workers do.
  std::unique_ptr<WorkerState> NewWorkerState() const override;
  absl::Status Apply(const Record& record, const SampleContext& context, WorkerState* state,
                     SampleWriter& out) const override;

  // Processes instead of threads: `respawn(i, fds_to_close)` starts worker process i and returns
  // (pid, request_fd, reply_fd, staging_fd, staging_bytes, previous_exit_code or None); the
  // transform owns the returned fds. `count` processes are started at once.
  void UseProcesses(pybind11::object respawn, int count);
  // Stops using the processes (asks them to exit, closes the pipes).
  void StopProcesses();
  int processes() const;
  // The epoch's keys: position p is keys[offsets[p] .. offsets[p + 1]) (processes only);
  // `seed` and `first_index` (the epoch order's index of keys[0]) go with every request.
  // Position p belongs to the epoch's batch first_batch + p / positions_per_batch, which worker
  // process (batch mod processes) makes, as torch's DataLoader sends batch k to worker k mod n.
  // `chunk` (> 1: samples made in place, small ones) asks a process for up to that many
  // positions of a batch at once: one exchange, and the thread writes them one by one.
  void SetKeys(std::vector<int64_t> keys, std::vector<int64_t> offsets, int64_t seed = 0,
               int64_t first_index = 0, int64_t first_batch = 0, int64_t positions_per_batch = 1,
               int64_t chunk = 1);
  // A batch is one worker process's work (see SetKeys), so the engine hands off whole batches.
  bool WholeBatches() const override { return true; }
  // Worker threads run Python under the training thread's GIL (worker processes are niced in
  // their own process: _worker.main).
  bool SharesConsumerLocks() const override { return true; }
  // Positions are the sampler's keys, set before each epoch; the next epoch's may be set
  // ahead (SetKeysAhead), and the engine starts it early only then (MayStartEpoch: with worker
  // processes, whole batches or samples in place).
  bool MayStartAhead() const override { return true; }
  // The next epoch's keys, foreseen by Python while this epoch runs (feedline.DataLoader draws
  // the sampler's next order on a copy of the RNG states): engine epoch `epoch`'s positions
  // are made with them once the engine starts that epoch ahead (worker processes only). False,
  // and nothing changed, when the engine has started it already with the keys set before.
  bool SetKeysAhead(int64_t epoch, std::vector<int64_t> keys, std::vector<int64_t> offsets,
                    int64_t seed, int64_t positions_per_batch, int64_t chunk);
  // iter() drew the order foreseen: the keys set ahead become the epoch's (its errors kept).
  // False when none were set.
  bool AdoptAhead();
  // Forgets the keys set ahead, once the engine has dropped the head start made with them
  // (Loader::DropAhead): SetKeysAhead then takes another order for that epoch.
  void ForgetAhead();
  bool MayStartEpoch(int64_t epoch) const override;
  void set_timeout_s(double s) { timeout_s_.store(s); }
  // Takes over `from`'s processes (and its respawn) and sends each the new configuration
  // (op=3: [3, nbytes, words, 0, 0] then `config`, pickled by Python); a process that does not
  // take it is replaced. The processes and what worker_init_fn set up in them are kept when the
  // batch layout changes (learned at the first epoch, a padded bound grown).
  void AdoptProcesses(PyTransform& from, const std::string& config);
  // Refuses further work (the loader is closing): Apply fails at once.
  void Close() { closed_.store(true); }

  // The error details of a failed position (Python re-raises the same type), or "".
  std::string TakeError(int64_t position) const;
  // Batch mode, processes: the pickled batch of a position ("" if none).
  std::string TakeResult(int64_t position) const;
  pybind11::dict Stats() const;

 private:
  struct Proc {
    int pid = -1;
    int request_fd = -1;
    int reply_fd = -1;
    uint8_t* staging = nullptr;
    size_t staging_bytes = 0;
    bool busy = false;
    bool alive = false;
    bool respawning = false;  // Respawn is starting its replacement
  };
  struct ThreadWorker;  // a worker thread's id and Python thread state (NewWorkerState)
  class GilHold;        // the GIL for one sample, with that thread state (ApplyThread)
  int TakeWorkerId() const;
  void ReturnWorkerId(int id) const;
  absl::Status ApplyThread(int64_t position, ThreadWorker* state, SampleWriter& out) const;
  absl::Status ApplyProcess(int64_t position, int64_t epoch, ThreadWorker* state,
                            SampleWriter& out) const;
  // One request to an idle worker process (process `only`, if >= 0), its reply checked; a
  // death is retried once on the new process. On success the process stays taken (its staging
  // area holds the payload) until ReleaseProc(r.proc). Errors: Cancelled (closing), else
  // Unknown with the error text for Python.
  struct Reply {
    int proc = -1;
    int64_t status = 0;
    int64_t cpu_ns = 0;  // the process's CPU time for it, as reported, within wall x cores
    const uint8_t* data = nullptr;
    size_t size = 0;
    std::vector<uint8_t> inline_payload;
  };
  // `chunk`: the request asks for several positions, and a chunk reply (status 2) may come.
  absl::Status Exchange(const std::vector<int64_t>& request, const std::string& what, Reply& r,
                        int only = -1, bool chunk = false) const;
  // Process i (pid) sent a malformed reply (`why`) for `what`: it is killed and replaced, and
  // the request's error says so.
  absl::Status ReplaceMalformed(int i, int pid, absl::string_view why,
                                const std::string& what) const;
  // Writes `position`'s sample (or its error) from the thread's last chunk reply.
  absl::Status WriteChunkSample(const ThreadWorker& state, int64_t position,
                                const std::string& what, SampleWriter& out) const;
  // Parses a sample's payload into the slot.
  absl::Status WriteFields(const uint8_t* p, size_t n, SampleWriter& out) const;
  // `generation`: of the keys the position was made with (-1: the epoch's).
  absl::Status Failed(int64_t position, const std::string& text, int64_t generation = -1) const;
  int AcquireProc() const;  // blocks for an idle process; -1 when there are none
  // Blocks for process `only` (also while it is being respawned); -1 when it is not running.
  int AcquireProc(int only) const;
  void ReleaseProc(int i) const;
  // Replaces process i (GIL taken inside); returns the old one's exit code text.
  std::string Respawn(int i) const;
  void CloseProc(Proc& p) const;

  Schema schema_;
  bool batch_mode_;
  pybind11::object fetch_;    // threads: fetch(position, worker) -> list of buffers | str | None
  pybind11::object respawn_;  // processes

  mutable std::mutex mu_;
  // One Respawn at a time: a respawn closes its old process's pipes while another passes the
  // list of descriptors its new process must close; their numbers, reused by the other's new
  // pipes, made a new worker close its own (EBADF on its staging area: it died at once).
  mutable std::mutex spawn_mu_;
  mutable std::condition_variable idle_;
  mutable std::vector<Proc> procs_;
  // An epoch's keys (SetKeys, SetKeysAhead); `generation` counts the sets: a thread's chunk
  // and a failed position's error are of one set.
  struct KeySet {
    std::shared_ptr<const std::vector<int64_t>> keys, offsets;
    int64_t seed = 0, first_index = 0, first_batch = 0, per_batch = 1, chunk = 1;
    int64_t generation = 0;
  };
  // A key set of SetKeys' arguments (counts clamped to their least); its generation unset.
  static KeySet MakeKeySet(std::vector<int64_t> keys, std::vector<int64_t> offsets, int64_t seed,
                           int64_t first_index, int64_t first_batch, int64_t positions_per_batch,
                           int64_t chunk);
  void ClearAhead();                    // no keys set ahead (mu_ held)
  KeySet keys_;                         // the epoch's (mu_)
  KeySet ahead_;                        // the next epoch's, when foreseen (mu_)
  int64_t ahead_epoch_ = -1;            // the engine epoch ahead_ is for, or -1 (mu_)
  mutable bool ahead_started_ = false;  // the engine started ahead_epoch_ with ahead_ (mu_)
  int64_t generation_ = 0;              // (mu_)
  // Failed positions' errors, by (generation, position).
  mutable std::map<std::pair<int64_t, int64_t>, std::string> errors_;
  // Batch mode: a position's batches, by (generation, position): a head start's are kept apart
  // from those of the epoch still taken. Under on_error="skip" a failed batch's place is taken
  // by another position, which is then made twice (the same bytes): each make is taken once.
  mutable std::multimap<std::pair<int64_t, int64_t>, std::string> results_;
  mutable std::vector<bool> worker_ids_;  // taken ids (mu_)
  std::atomic<double> timeout_s_{0};
  std::atomic<bool> closed_{false};
  std::atomic<bool> stopping_{false};  // StopProcesses is waiting for busy processes
  // No new request to a process: the loader is closed, or its processes are being stopped.
  bool Stopped() const { return closed_.load() || stopping_.load(); }

  // Stats.
  // Worker threads: gil_wait_ns_ waiting to take the GIL for a sample, call_ns_ in the dataset's
  // code (wall), off_cpu_ns_ the part of it off a CPU (the GIL taken back, I/O, a core).
  mutable std::atomic<int64_t> samples_{0}, gil_wait_ns_{0}, call_ns_{0}, off_cpu_ns_{0},
      deaths_{0}, retries_{0}, timeouts_{0}, malformed_{0}, exchanges_{0};
};

}  // namespace feedline::python

#endif  // FEEDLINE_PYTHON_PY_DATASET_H_
