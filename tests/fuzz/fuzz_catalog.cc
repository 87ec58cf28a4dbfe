// libFuzzer target: the shard cache's tar catalog parser (SummarizeTarCatalog over
// ReadTarCatalog). A catalog is a file in the cache directory: anyone who can write there can
// hand the parser any bytes. Properties: no crash or overflow on any input; a catalog that does
// not parse reads as "not a catalog" (bytes -1, no ETag); one that parses has a header, and its
// extent (the end of the last member's data) is a non-negative int64.
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz_util.h"
#include "io/tar_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* file = new feedline::fuzz::MemFile();
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const feedline::TarCatalogSummary s = feedline::SummarizeTarCatalog(file->Write(data, size));
  if (s.bytes < 0) {
    FUZZ_CHECK(s.bytes == -1 && s.etag.empty(), absl::StrCat(s.bytes, " ", s.etag));
    return 0;
  }
  FUZZ_CHECK(absl::StartsWith(text, "feedline-tar-catalog "), "parsed without a header");
  FUZZ_CHECK(s.etag.find('\n') == std::string::npos, s.etag);
  return 0;
}
