// libFuzzer target: the shard cache's tar catalog parser (SummarizeTarCatalog over
// ReadTarCatalog). A catalog is a file in the cache directory: anyone who can write there can
// hand the parser any bytes. Properties: no crash or overflow on any input; a catalog that does
// not parse reads as "not a catalog" (bytes -1, no ETag); one that parses has a header, a
// non-negative size and no line break in its source or validator. A catalog ends with a checksum
// of itself, which a fuzzer cannot forge: an input without a "sum" line gets its correct one
// appended, so that the parser past the checksum is explored too.
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz_util.h"
#include "io/tar_dataset.h"
#include "xxhash.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static feedline::fuzz::MemFile* file = new feedline::fuzz::MemFile();
  std::string text(reinterpret_cast<const char*>(data), size);
  if (text.find("\nsum ") == std::string::npos) {
    absl::StrAppend(&text, "sum ",
                    absl::Hex(XXH3_64bits(text.data(), text.size()), absl::kZeroPad16), "\n");
  }
  const feedline::TarCatalogSummary s = feedline::SummarizeTarCatalog(
      file->Write(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  if (s.bytes < 0) {
    FUZZ_CHECK(s.bytes == -1 && s.etag.empty(), absl::StrCat(s.bytes, " ", s.etag));
    return 0;
  }
  FUZZ_CHECK(absl::StartsWith(text, "feedline-tar-catalog "), "parsed without a header");
  FUZZ_CHECK(s.etag.find('\n') == std::string::npos, s.etag);
  FUZZ_CHECK(s.source.find('\n') == std::string::npos, s.source);
  return 0;
}
