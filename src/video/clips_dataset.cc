// Several clips of each video an epoch (feedline/video.h: ClipsOf): every record of a data set
// of videos read as K samples, the transform telling them apart by their index.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "feedline/random.h"
#include "feedline/video.h"

namespace feedline::video {
namespace {

// A wrapper (DatasetWrapper::target() is the videos: their files and classes stay visible).
class Clips final : public DatasetWrapper {
 public:
  Clips(std::shared_ptr<const Dataset> videos, int k)
      : DatasetWrapper(videos), videos_(std::move(videos)), k_(k) {}

  int64_t size() const override { return videos_->size() * k_; }
  absl::Status Read(int64_t index, Record* record) const override {
    return videos_->Read(index / k_, record);
  }
  std::string Describe(int64_t index) const override {
    return absl::StrCat(videos_->Describe(index / k_), " (clip ", index % k_ + 1, " of ", k_, ")");
  }
  uint64_t Fingerprint() const override {
    return Mix64(videos_->Fingerprint() ^ Mix64(0x636c697073ULL + uint64_t(k_)));
  }
  bool empty_records() const override { return false; }
  int64_t num_records() const override { return size(); }
  void MapEpoch(int64_t, std::vector<int64_t>*) const override {}
  // An index map and nothing else: reads are the videos' own, asynchronous when theirs are.
  bool in_memory() const override { return videos_->in_memory(); }
  RemoteStats remote_stats() const override { return videos_->remote_stats(); }
  bool async_reads() const override { return videos_->async_reads(); }
  void ReadAsync(int64_t index, Record* record,
                 std::function<void(absl::Status)> done) const override {
    videos_->ReadAsync(index / k_, record, std::move(done));
  }

 private:
  const std::shared_ptr<const Dataset> videos_;
  const int64_t k_;
};

}  // namespace

std::shared_ptr<const Dataset> ClipsOf(std::shared_ptr<const Dataset> videos, int clips_per_video) {
  if (clips_per_video <= 1) return videos;
  return std::make_shared<Clips>(std::move(videos), clips_per_video);
}

}  // namespace feedline::video
