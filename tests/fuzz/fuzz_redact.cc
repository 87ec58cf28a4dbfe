// libFuzzer target: ShownName, the redaction every message goes through. The input is cut at
// NUL bytes into a user, a password, a host, a path and a query; the URL
// "<scheme>://<user>:<password>@<host><path>?<query>" is shown, and no byte sequence of the
// password (4 bytes or more) or of the query may survive, nor any control character. Also: any
// input at all is shown without a control character, and a string without "://" only escaped.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/redact.h"
#include "fuzz_util.h"

namespace {

bool Has(std::string_view hay, std::string_view needle) {
  return needle.size() >= 4 && hay.find(needle) != std::string_view::npos;
}

void CheckNoControl(const std::string& shown) {
  for (unsigned char c : shown) FUZZ_CHECK(c >= 0x20 && c != 0x7f, shown);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  CheckNoControl(feedline::ShownName(in));
  if (in.find("://") == std::string_view::npos) {
    FUZZ_CHECK(feedline::RedactUrl(in) == in, "a path changed");
  }

  std::vector<std::string> part(5);
  size_t k = 0;
  for (char c : in) {
    if (c == '\0') {
      if (++k == part.size()) break;
      continue;
    }
    part[k].push_back(c);
  }
  auto strip = [](std::string s, std::string_view drop) {
    std::string out;
    for (char c : s) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (drop.find(c) == std::string_view::npos && u >= 0x20 && u != 0x7f) {
        out.push_back(c);
      }
    }
    return out;
  };
  // A user and a host are what a URL can hold unencoded; the path starts with '/'.
  const std::string user = strip(part[0], "@/?#:");
  const std::string& password = part[1];
  const std::string host = strip(part[2], "@/?#:");
  const std::string path = "/" + strip(part[3], "?#");
  const std::string& query = part[4];
  if (host.empty()) return 0;
  // A password that reads as a port (a number up to 65535, then / ? # or nothing) is taken for
  // one (redact.h says why): those are left out.
  size_t d = 0;
  uint32_t value = 0;
  while (d < password.size() && d < 6 && password[d] >= '0' && password[d] <= '9') {
    value = value * 10 + uint32_t(password[d++] - '0');
  }
  if (d > 0 && d <= 5 && value <= 65535 &&
      (d == password.size() || password[d] == '/' || password[d] == '?' || password[d] == '#')) {
    return 0;
  }
  for (const char* scheme : {"http", "https", "s3"}) {
    const std::string url =
        std::string(scheme) + "://" + user + ":" + password + "@" + host + path + "?" + query;
    std::string shown = feedline::ShownName(url);
    CheckNoControl(shown);
    const std::string prefix = std::string(scheme) + "://";
    FUZZ_CHECK(shown.compare(0, prefix.size(), prefix) == 0, shown);
    shown.erase(0, prefix.size());  // pieces are looked for in what follows the scheme
    // The marker RedactUrl writes for a URL it cannot show is not the input's.
    if (shown == "[redacted]") shown.clear();
    const std::string visible = host + path;  // may be shown
    for (size_t a = 0; a + 4 <= password.size(); ++a) {
      const std::string_view piece = std::string_view(password).substr(a, 4);
      if (Has(visible, piece)) continue;
      FUZZ_CHECK(!Has(shown, piece), url + " -> " + shown);
    }
    for (size_t a = 0; a + 4 <= query.size(); ++a) {
      const std::string_view piece = std::string_view(query).substr(a, 4);
      if (Has(visible, piece)) continue;
      FUZZ_CHECK(!Has(shown, piece), url + " -> " + shown);
    }
  }
  return 0;
}
