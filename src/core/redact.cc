#include "core/redact.h"

#include <cctype>
#include <cstdio>

namespace feedline {

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
  // with an '@' in its path and a ':' before it (the name is shortened, nothing leaks); a
  // password that starts with digits and then '/' reads as a port: such a URL does not reach
  // the host it names (curl reads it the same way), and only it can show a password's tail.
  const size_t at = url.rfind('@');
  bool userinfo = false;
  if (at != std::string_view::npos && at >= host) {
    const size_t end = url.find_first_of("/?#", host);
    userinfo = end == std::string_view::npos || end > at;
    for (size_t c = url.find(':', host); !userinfo && c < at; c = url.find(':', c + 1)) {
      size_t d = c + 1;
      while (d < url.size() && url[d] >= '0' && url[d] <= '9') ++d;
      userinfo = d == c + 1 || (d < url.size() && url[d] != '/' && url[d] != '?' && url[d] != '#');
    }
  }
  std::string out(url.substr(0, host));
  std::string_view rest = url.substr(host);
  if (userinfo) rest = url.substr(at + 1);
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
