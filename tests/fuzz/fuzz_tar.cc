// libFuzzer target: the WebDataset tar indexer. IndexTarBytes on the input; when it succeeds,
// every member must lie inside the input on a 512-byte block boundary. The same bytes as a file
// must give the same index through IndexTar (its pread path), and TarDataset::Open on that file
// must group them into samples whose reads return exactly the members' bytes. A catalog written
// from the file (what a remote shard is read by range from) must give the same samples and
// labels as the file itself; read through its catalog (what a cached copy of a remote shard is),
// the file must give the same bytes, every one of them matching the catalog's content hashes.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "feedline/files.h"
#include "fuzz_util.h"
#include "io/tar_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* file = new feedline::fuzz::MemFile();
  absl::StatusOr<std::vector<feedline::TarMember>> members =
      feedline::IndexTarBytes(data, size, "fuzz.tar");
  const std::string& path = file->Write(data, size);
  absl::StatusOr<std::vector<feedline::TarMember>> from_file = feedline::IndexTar(path);
  FUZZ_CHECK(members.ok() == from_file.ok(),
             absl::StrCat(members.status().ToString(), " vs ", from_file.status().ToString()));
  if (!members.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(members.status()), members.status().ToString());
    return 0;
  }
  FUZZ_CHECK(members->size() == from_file->size(), "member count differs from the file's");
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < members->size(); ++i) {
    const feedline::TarMember& m = (*members)[i];
    const feedline::TarMember& f = (*from_file)[i];
    FUZZ_CHECK(m.name == f.name && m.offset == f.offset && m.size == f.size, m.name);
    FUZZ_CHECK(m.offset >= 512 && m.offset % 512 == 0 && m.size >= 0, m.name);
    FUZZ_CHECK(uint64_t(m.offset) + uint64_t(m.size) <= size, m.name);
    if (m.size > 0) sink = data[m.offset] ^ data[m.offset + m.size - 1];
  }
  (void)sink;

  absl::StatusOr<std::shared_ptr<feedline::TarDataset>> images =
      feedline::TarDataset::Open({path}, path, feedline::TarDataset::Mode::kImages);
  if (images.ok()) {  // else: samples without labels, bad labels, no samples: reported errors
    const feedline::FileList& files = (*images)->files();
    FUZZ_CHECK((*images)->size() == int64_t(files.samples.size()), "sample count");
    feedline::Record record;
    for (int64_t i = 0; i < (*images)->size(); ++i) {
      FUZZ_CHECK((*images)->Read(i, &record).ok(), (*images)->Describe(i));
      FUZZ_CHECK(files.samples[size_t(i)].label >= 0, (*images)->Describe(i));
      FUZZ_CHECK(record.label == files.samples[size_t(i)].label, (*images)->Describe(i));
      // The sample's path is "shard:member"; its bytes are that member's.
      const std::string& sample_path = files.samples[size_t(i)].path;
      const std::string member = sample_path.substr(path.size() + 1);
      bool found = false;
      for (const feedline::TarMember& m : *members) {
        if (m.name == member && size_t(m.size) == record.bytes.size() &&
            (record.bytes.empty() ||
             std::memcmp(data + m.offset, record.bytes.data(), record.bytes.size()) == 0)) {
          found = true;
          break;
        }
      }
      FUZZ_CHECK(found, sample_path);
    }
  }
  // Named members: every member of the shard lands in exactly one sample, with its bytes.
  absl::StatusOr<std::shared_ptr<feedline::TarDataset>> all =
      feedline::TarDataset::Open({path}, path, feedline::TarDataset::Mode::kMembers);
  if (all.ok()) {
    feedline::Record record;
    size_t seen = 0;
    for (int64_t i = 0; i < (*all)->size(); ++i) {
      FUZZ_CHECK((*all)->Read(i, &record).ok(), (*all)->Describe(i));
      FUZZ_CHECK(!record.members.empty(), (*all)->Describe(i));
      seen += record.members.size();
    }
    FUZZ_CHECK(seen == members->size(), "members lost or repeated");
  }
  const std::string catalog = path + ".idx";
  if (feedline::WriteTarCatalog(path, path, catalog).ok()) {
    feedline::ShardSource remote{"", "http://127.0.0.1:9/fuzz.tar", catalog, path};
    for (auto mode : {feedline::TarDataset::Mode::kImages, feedline::TarDataset::Mode::kMembers}) {
      auto local = feedline::TarDataset::Open({path}, path, mode);
      auto by_catalog = feedline::TarDataset::Open({remote}, path, mode, feedline::HttpOptions());
      FUZZ_CHECK(local.ok() == by_catalog.ok(), by_catalog.status().ToString());
      if (!local.ok()) {
        FUZZ_CHECK(local.status() == by_catalog.status(), by_catalog.status().ToString());
        continue;
      }
      const auto& a = (*local)->files().samples;
      const auto& b = (*by_catalog)->files().samples;
      FUZZ_CHECK(a.size() == b.size(), "catalog sample count");
      for (size_t i = 0; i < a.size(); ++i) {
        FUZZ_CHECK(a[i].path == b[i].path && a[i].label == b[i].label, a[i].path);
      }
      // The same file as a remote shard's cached copy (the URL is never reached: port 9).
      feedline::ShardSource copy{path, "http://127.0.0.1:9/fuzz.tar", catalog, path};
      auto cached = feedline::TarDataset::Open({copy}, path, mode, feedline::HttpOptions());
      FUZZ_CHECK(cached.ok(), cached.status().ToString());
      for (int64_t i = 0; i < (*local)->size(); ++i) {
        feedline::Record want, got;
        FUZZ_CHECK((*local)->Read(i, &want).ok() && (*cached)->Read(i, &got).ok(),
                   (*local)->Describe(i));
        FUZZ_CHECK(want.bytes == got.bytes && want.members.size() == got.members.size(),
                   (*local)->Describe(i));
        for (size_t m = 0; m < want.members.size(); ++m) {
          FUZZ_CHECK(want.members[m].bytes == got.members[m].bytes, (*local)->Describe(i));
        }
      }
      FUZZ_CHECK((*cached)->remote_stats().damaged_copies == 0, "a faithful copy dropped");
    }
  }
  return 0;
}
