// A per-sample cache within a byte budget: records' bytes (cache = "bytes", for slow storage;
// the read stage's) or a transform's own entries, such as decoded images at a bounded resolution
// (cache = "decoded", so later epochs skip decode).
//
// Admission is first come, first served until the budget is full; nothing is evicted. Under a
// random order every sample is equally likely next, so eviction would only trade one cached
// sample for another at a cost; a budget that holds the data set caches all of it, a smaller one
// a fixed part of it.
//
// Thread safety: Get/Put from any thread (striped mutexes; entries are immutable once stored).
#ifndef FEEDLINE_SRC_CORE_SAMPLE_CACHE_H_
#define FEEDLINE_SRC_CORE_SAMPLE_CACHE_H_

#include <any>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "feedline/dataset.h"

namespace feedline {

class SampleCache {
 public:
  struct Entry {
    std::vector<uint8_t> data;  // record bytes, or RGB HWC pixels
    int64_t label = -1;         // bytes: the record's label and members
    std::vector<Record::Member> members;
    std::any meta;                        // bytes: the record's typed metadata
    int width = 0, height = 0;            // decoded: the stored size
    int orig_width = 0, orig_height = 0;  // decoded: the image's own size
  };

  SampleCache(int64_t samples, int64_t budget_bytes)
      : entries_(size_t(samples)), budget_(budget_bytes) {}

  std::shared_ptr<const Entry> Get(int64_t index) const {
    std::lock_guard<std::mutex> lock(stripes_[size_t(index) % kStripes]);
    return entries_[size_t(index)];
  }
  // Stores the entry if it fits the budget and the sample is not cached yet.
  bool Put(int64_t index, std::shared_ptr<const Entry> e) {
    int64_t cost = int64_t(e->data.size()) + int64_t(sizeof(Entry));
    for (const Record::Member& m : e->members) cost += int64_t(m.bytes.size() + m.name.size());
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + cost > budget_) {
        full_.store(true, std::memory_order_relaxed);
        return false;
      }
    } while (!used_.compare_exchange_weak(used, used + cost, std::memory_order_relaxed));
    std::lock_guard<std::mutex> lock(stripes_[size_t(index) % kStripes]);
    if (entries_[size_t(index)]) {
      used_.fetch_sub(cost, std::memory_order_relaxed);
      return false;
    }
    entries_[size_t(index)] = std::move(e);
    return true;
  }
  void CountHit() { hits_.fetch_add(1, std::memory_order_relaxed); }
  void CountMiss() { misses_.fetch_add(1, std::memory_order_relaxed); }
  int64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  int64_t misses() const { return misses_.load(std::memory_order_relaxed); }
  int64_t bytes() const { return used_.load(std::memory_order_relaxed); }
  int64_t budget() const { return budget_; }
  bool full() const { return full_.load(std::memory_order_relaxed); }

 private:
  static constexpr size_t kStripes = 64;
  mutable std::array<std::mutex, kStripes> stripes_;
  std::vector<std::shared_ptr<const Entry>> entries_;
  const int64_t budget_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> hits_{0}, misses_{0};
  std::atomic<bool> full_{false};
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_SAMPLE_CACHE_H_
