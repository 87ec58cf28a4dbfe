// Adds a fixed latency to every read of another data set (benchmarks: remote storage, for
// `simulated_read_latency_ms`). A DatasetWrapper, as a user's fault-injecting data set would be.
//
// Thread safety: as the wrapped data set.
#ifndef FEEDLINE_SRC_ENGINE_SIMULATED_LATENCY_H_
#define FEEDLINE_SRC_ENGINE_SIMULATED_LATENCY_H_

#include <chrono>
#include <memory>
#include <thread>

#include "feedline/dataset.h"

namespace feedline {

class SimulatedLatencyDataset final : public DatasetWrapper {
 public:
  SimulatedLatencyDataset(std::shared_ptr<const Dataset> target, double latency_ms)
      : DatasetWrapper(std::move(target)), latency_ms_(latency_ms) {}
  absl::Status Read(int64_t index, Record* record) const override {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(latency_ms_));
    return DatasetWrapper::Read(index, record);
  }
  bool empty_records() const override { return false; }  // a read that waits is I/O

 private:
  const double latency_ms_;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_SIMULATED_LATENCY_H_
