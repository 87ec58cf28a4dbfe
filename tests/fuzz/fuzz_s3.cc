// libFuzzer target: what an S3 endpoint and a user's AWS files hand in. The input is split at
// 0x01 bytes: the first part is an AWS config / credentials file (ParseIniSection, for the
// default profile and a named one), the rest are the pages of a ListObjectsV2 listing served
// in order by a fake transport to S3ListPages (the same loop S3List runs over HTTP), which
// fails once the pages run out. Properties: no crash; the INI keys and values carry no
// surrounding blanks, and a section's keys are only those of its own lines; the listing ends
// (at most one fetch past the pages), with the keys of every page it read in order, or with
// the transport's error or kDataLoss naming the listing (a server that loops).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuzz_util.h"
#include "io/http.h"

namespace {

void CheckIni(absl::string_view text, const std::string& section) {
  const std::map<std::string, std::string> got = feedline::ParseIniSection(text, section);
  for (const auto& [k, v] : got) {
    FUZZ_CHECK(absl::StripAsciiWhitespace(k) == k && absl::StripAsciiWhitespace(v) == v, k);
    FUZZ_CHECK(k.find('\n') == std::string::npos && v.find('\n') == std::string::npos, k);
    // The key appears in the text, on a line of its own with an '='.
    FUZZ_CHECK(absl::StrContains(text, k), k);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> parts = absl::StrSplit(input, '\x01');
  CheckIni(parts[0], "default");
  CheckIni(parts[0], "profile fuzz");

  const std::vector<absl::string_view> pages(parts.begin() + 1, parts.end());
  size_t served = 0;
  std::vector<std::string> tokens;
  const feedline::S3PageFetch fetch = [&](const std::string& token, std::vector<uint8_t>* page) {
    tokens.push_back(token);
    if (served >= pages.size()) return absl::UnavailableError("fake transport: no more pages");
    const absl::string_view p = pages[served++];
    page->assign(p.begin(), p.end());
    return absl::OkStatus();
  };
  const std::string shown = "s3://bucket/prefix/";
  for (bool delimiter : {false, true}) {
    served = 0;
    tokens.clear();
    absl::StatusOr<feedline::S3Listing> listing = feedline::S3ListPages(fetch, delimiter, shown);
    FUZZ_CHECK(tokens.size() <= pages.size() + 1, absl::StrCat(tokens.size()));
    FUZZ_CHECK(tokens.empty() || tokens[0].empty(), "the first page is asked without a token");
    if (!listing.ok()) {
      const bool transport = absl::IsUnavailable(listing.status()) && served == pages.size();
      const bool loops = absl::IsDataLoss(listing.status()) &&
                         absl::StartsWith(listing.status().message(), shown);
      FUZZ_CHECK(transport || loops, listing.status().ToString());
      continue;
    }
    // The keys of the pages read, in order: every <Key>...</Key> (unescaped) of each.
    size_t want = 0;
    for (size_t i = 0; i < served; ++i) {
      for (size_t at = pages[i].find("<Key>"); at != absl::string_view::npos;
           at = pages[i].find("<Key>", at)) {
        const size_t end = pages[i].find("</Key>", at + 5);
        if (end == absl::string_view::npos) break;
        ++want;
        at = end + 6;
      }
    }
    FUZZ_CHECK(listing->keys.size() == want, absl::StrCat(listing->keys.size(), " != ", want));
    if (!delimiter) FUZZ_CHECK(listing->prefixes.empty(), "prefixes without a delimiter");
  }
  return 0;
}
