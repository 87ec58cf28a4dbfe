#include "engine/worker_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <chrono>
#include <system_error>
#include <utility>

namespace feedline {
namespace {

// How long Run waits for a worker's earlier job (an epoch cancelled by the next one returns at
// its next sample) before giving the id a new thread.
constexpr auto kBusyWait = std::chrono::milliseconds(200);

// This thread `nice` levels below where it started (Linux: a priority per thread). Never
// above: an unprivileged thread may lower its own priority only.
void LowerPriority(int nice) {
  if (nice <= 0) return;
  const pid_t tid = gettid();
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, id_t(tid));
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, id_t(tid), std::min(19, now + nice));
}

void Loop(std::shared_ptr<WorkerThread> w, std::shared_ptr<const SampleTransform> transform,
          int nice) {
  pthread_setname_np(pthread_self(), "feedline-map");  // for top, perf, gdb
  LowerPriority(nice);
  std::unique_ptr<SampleTransform::WorkerState> state;
  for (;;) {
    WorkerPool::Job job;
    {
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [&] { return !w->jobs.empty() || w->stop; });
      if (w->jobs.empty()) break;  // stopped, nothing left to run
      job = std::move(w->jobs.front());
      w->jobs.pop_front();
    }
    if (state == nullptr) {
      try {
        state = transform->NewWorkerState();
      } catch (...) {
        state.reset();  // Apply gets null and reports what it misses; tried again next job
      }
    }
    job(state.get());
    job = nullptr;  // its captures go before the job counts as done
    {
      std::lock_guard<std::mutex> lock(w->mu);
      ++w->done;
    }
    w->cv.notify_all();
  }
  state.reset();  // on this thread: a Python thread state must be deleted by its own thread
}

}  // namespace

WorkerPool::~WorkerPool() {
  std::vector<std::shared_ptr<WorkerThread>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = std::move(workers_);
    all.insert(all.end(), retired_.begin(), retired_.end());
    retired_.clear();
  }
  for (const auto& w : all) {
    if (w == nullptr) continue;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stop = true;
    }
    w->cv.notify_all();
  }
  for (const auto& w : all) {
    if (w == nullptr || !w->thread.joinable()) continue;
    if (w->thread.get_id() == std::this_thread::get_id()) {
      w->thread.detach();  // it holds its WorkerThread and the transform, and ends after this
    } else {
      w->thread.join();
    }
  }
}

WorkerPool::Ticket WorkerPool::Run(int id, Job job) {
  std::shared_ptr<WorkerThread> w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_.size() <= size_t(id)) workers_.resize(size_t(id) + 1);
    w = workers_[size_t(id)];
  }
  if (w != nullptr) {
    std::unique_lock<std::mutex> lock(w->mu);
    if (!w->cv.wait_for(lock, kBusyWait, [&] { return w->done == w->submitted; })) {
      // Still in an earlier epoch's job: that thread ends after it, and the id gets a new one.
      w->stop = true;
      lock.unlock();
      w->cv.notify_all();
      std::lock_guard<std::mutex> pool_lock(mu_);
      if (workers_[size_t(id)] == w) {
        retired_.push_back(std::move(workers_[size_t(id)]));
      }
      w = nullptr;
    }
  }
  if (w == nullptr) {
    w = std::make_shared<WorkerThread>();
    w->thread = std::thread(Loop, w, transform_, nice_);  // throws std::system_error: the caller's
    std::lock_guard<std::mutex> lock(mu_);
    // (Another epoch's Run for this id may have put a thread there meanwhile: kept, retired.)
    if (workers_[size_t(id)] != nullptr) retired_.push_back(std::move(workers_[size_t(id)]));
    workers_[size_t(id)] = w;
  }
  Ticket ticket;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->jobs.push_back(std::move(job));
    ticket.job = ++w->submitted;
  }
  w->cv.notify_all();
  ticket.worker = std::move(w);
  return ticket;
}

bool WorkerPool::WaitUntil(const Ticket& ticket, std::chrono::steady_clock::time_point deadline) {
  if (ticket.worker == nullptr) return true;
  WorkerThread& w = *ticket.worker;
  std::unique_lock<std::mutex> lock(w.mu);
  return w.cv.wait_until(lock, deadline, [&] { return w.done >= ticket.job; });
}

void WorkerPool::Wait(const Ticket& ticket) {
  if (ticket.worker == nullptr) return;
  WorkerThread& w = *ticket.worker;
  std::unique_lock<std::mutex> lock(w.mu);
  w.cv.wait(lock, [&] { return w.done >= ticket.job; });
}

}  // namespace feedline
