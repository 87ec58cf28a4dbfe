#include "core/redact.h"

#include <cctype>
#include <cstdint>
#include <cstdio>

namespace feedline {

namespace {

// Whether url[from, ...) reads as a port: 1 to 5 digits, at most 65535, then / ? # or the end.
bool IsPort(std::string_view url, size_t from) {
  size_t d = from;
  uint32_t value = 0;
  while (d < url.size() && d - from < 6 && url[d] >= '0' && url[d] <= '9') {
    value = value * 10 + uint32_t(url[d] - '0');
    ++d;
  }
  if (d == from || d - from > 5 || value > 65535) return false;
  return d == url.size() || url[d] == '/' || url[d] == '?' || url[d] == '#';
}

}  // namespace

std::string RedactUrl(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return std::string(url);
  for (size_t i = 0; i < scheme; ++i) {  // "scheme" is letters, digits, + - . (RFC 3986)
    const unsigned char c = static_cast<unsigned char>(url[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return std::string(url);
  }
  const size_t host = scheme + 3;
  // User information ends at the URL's last '@' (a password may hold '@' too). It is there when
  // the authority, as a parser that trusts the URL sees it (up to the first / ? #), has an '@';
  // or when some ':' before that last '@' is not a port (digits, then / ? # or the end): a
  // password with an unencoded / ? or # cut the authority short. This over-redacts only a URL
  // with an '@' in its path and a ':' before it (the name is shortened, nothing leaks), or,
  // with a '?' or '#' before the '@' as well, shows nothing but the scheme; a password that
  // reads as a port (a number up to 65535, then / ? or #) is taken for one: such a URL does not
  // reach the host it names (curl reads it the same way), and only it can show that number.
  const size_t at = url.rfind('@');
  bool userinfo = false;
  if (at != std::string_view::npos && at >= host) {
    const size_t end = url.find_first_of("/?#", host);
    userinfo = end == std::string_view::npos || end > at;
    for (size_t c = url.find(':', host); !userinfo && c < at; c = url.find(':', c + 1)) {
      userinfo = !IsPort(url, c + 1);
    }
  }
  std::string out(url.substr(0, host));
  std::string_view rest = url.substr(host);
  if (userinfo) {
    // A '?' or '#' before that '@': a password holding one, or a query or fragment holding an
    // '@' (then the '@' ends nothing and what follows it is query): either way nothing after
    // the scheme can be shown safely. Such a URL reaches no host as written (curl refuses it).
    const size_t qf = url.find_first_of("?#", host);
    if (qf != std::string_view::npos && qf < at) return out + "[redacted]";
    rest = url.substr(at + 1);
  }
  out.append(rest.substr(0, rest.find_first_of("?#")));
  return out;
}

std::string EscapeControl(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out.append(buf);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

std::string ShownName(std::string_view path_or_url) {
  return EscapeControl(RedactUrl(path_or_url));
}

}  // namespace feedline
