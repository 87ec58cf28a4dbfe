// The engine's side of the device seam (feedline/device.h): a slot handed to the copy stage and
// the device batch a `Batch` holds.
//
// Each batch handed out is submitted once — by the worker that assembled it when the consumer is
// near, else by the consumer thread — one submission at a time. The stage gets the slot's fields
// as a `HostBatch` whose owner is the slot: it keeps the slot until its copy from it is done,
// then lets it go back to the ring. The device batch keeps a copy of the slot's small host side
// (indices, shapes, lengths), and the slot itself only when a field stays on the host.
//
// Thread safety: `SubmitSlot` from one thread at a time per stage; `DeviceBatch` release from any
// thread.
#ifndef FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_
#define FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/batch_slot.h"
#include "feedline/device.h"

namespace feedline::internal {

// A batch on a device: the stage's copy and the batch's host side.
struct DeviceBatch {
  std::shared_ptr<DeviceCopy> copy;
  std::shared_ptr<const SlotLayout> layout;
  std::vector<int64_t> indices;      // the data set index of each sample
  std::vector<Column> host_columns;  // each field's shapes, lengths, offsets
  // Only when a field stays on the host (a column with null data): its slot, for the batch's
  // life.
  std::shared_ptr<BatchSlot> host;
};

// What a stage for `layout` is made for, with the transform's conversions.
DeviceStageSpec StageSpec(const SlotLayout& layout, std::vector<DeviceConversion> conversions);

// Enqueues the copy of the slot's first `n` samples (assembled); returns at once.
absl::StatusOr<std::shared_ptr<DeviceBatch>> SubmitSlot(DeviceStage& stage,
                                                        std::shared_ptr<BatchSlot> slot, int64_t n);

}  // namespace feedline::internal

#endif  // FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_
