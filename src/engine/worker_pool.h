// The map stage's worker threads, kept for the loader's life: worker `id` runs every epoch's
// work on the same thread, with the same WorkerState (a decoder and its buffers, a Python thread
// state and its threading.local data, a tokenizer's word cache), as torch's persistent workers
// keep their processes. An epoch hands each worker id a job (MapStage's loop for that id) and
// waits for it at its end; between epochs the threads sleep.
//
// A worker still busy with an earlier epoch's job when a new one is given to it (an epoch
// cancelled while its worker is in user code that does not return) is not waited for: the id
// gets a new thread and state, and the old thread ends after its job.
//
// In a child of fork() the threads do not exist: LoaderShared::Workers makes a new pool there
// (and leaks the parent's, whose locks the parent's threads may have held at the fork).
//
// Thread safety: Run and Wait from any thread (for one id, from one epoch at a time); the
// destructor must not run on a worker of this pool while its job runs (it is called when the
// loader's last reference goes, by then no job runs).
#ifndef FEEDLINE_SRC_ENGINE_WORKER_POOL_H_
#define FEEDLINE_SRC_ENGINE_WORKER_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "feedline/transform.h"

namespace feedline {

struct WorkerThread;

class WorkerPool {
 public:
  using Job = std::function<void(SampleTransform::WorkerState* state)>;

  // `nice`: the workers run that many nice levels below the thread that starts them (at most
  // 19), so that the consumer's thread gets a core first (LoaderOptions::worker_nice).
  explicit WorkerPool(std::shared_ptr<const SampleTransform> transform, int nice = 0)
      : transform_(std::move(transform)), nice_(nice) {}
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // A job given to worker `id` (Run), to wait for (Wait).
  struct Ticket {
    std::shared_ptr<WorkerThread> worker;
    int64_t job = 0;
  };
  // Runs `job` on worker `id`'s thread (started at its first job), with its state (made there
  // by the transform's NewWorkerState at the first job, again while that gives null or throws).
  Ticket Run(int id, Job job);
  // Until the ticket's job has returned.
  static void Wait(const Ticket& ticket);
  // The same, until `deadline` at most; false if the job had not returned by then.
  static bool WaitUntil(const Ticket& ticket, std::chrono::steady_clock::time_point deadline);

 private:
  const std::shared_ptr<const SampleTransform> transform_;
  const int nice_;
  std::mutex mu_;
  std::vector<std::shared_ptr<WorkerThread>> workers_ ABSL_GUARDED_BY(mu_);  // by id
  std::vector<std::shared_ptr<WorkerThread>> retired_ ABSL_GUARDED_BY(mu_);  // busy, replaced
};

// One worker's thread and its queue (shared with the thread, which may outlive the pool's
// handle on it: see WorkerPool's destructor).
struct WorkerThread {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<WorkerPool::Job> jobs ABSL_GUARDED_BY(mu);
  int64_t submitted ABSL_GUARDED_BY(mu) = 0;
  int64_t done ABSL_GUARDED_BY(mu) = 0;
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::thread thread;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_WORKER_POOL_H_
