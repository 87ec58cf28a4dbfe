#include "engine/device_stage.h"

#include <utility>

namespace feedline::internal {

DeviceStageSpec StageSpec(const SlotLayout& layout, std::vector<DeviceConversion> conversions) {
  DeviceStageSpec spec;
  spec.schema = layout.schema;
  spec.batch_size = layout.batch_size;
  for (const FieldLayout& f : layout.fields) {
    spec.field_bytes.push_back(f.sample_bytes * layout.batch_size);
  }
  spec.conversions = std::move(conversions);
  return spec;
}

absl::StatusOr<std::shared_ptr<DeviceBatch>> SubmitSlot(DeviceStage& stage,
                                                        std::shared_ptr<BatchSlot> slot,
                                                        int64_t n) {
  auto batch = std::make_shared<DeviceBatch>();
  batch->layout = slot->layout_ref;
  batch->indices.assign(slot->indices.begin(), slot->indices.begin() + n);
  batch->host_columns = slot->columns;
  HostBatch host;
  host.size = n;
  host.indices = batch->indices.data();
  host.fields.reserve(slot->columns.size());
  for (size_t f = 0; f < slot->columns.size(); ++f) {
    host.fields.push_back(HostBatch::Field{slot->field_data(int(f)), slot->columns[f].shape});
  }
  host.owner = slot;
  absl::StatusOr<std::shared_ptr<DeviceCopy>> copy = stage.Submit(std::move(host));
  if (!copy.ok()) return copy.status();
  batch->copy = *std::move(copy);
  for (const DeviceCopy::Column& c : batch->copy->columns) {
    if (c.data == nullptr) {
      batch->host = std::move(slot);  // a field stays on the host: the batch keeps its slot
      break;
    }
  }
  return batch;
}

}  // namespace feedline::internal
