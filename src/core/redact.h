// What a message may show of a path or URL: the one function every path from a user's path or
// URL to an error message, a log line, stats() or a repr() goes through.
//
//   ShownName("https://user:p@ss/w?rd@host/a.jpg?X-Amz-Signature=...") == "https://host/a.jpg"
//   ShownName("shard-\x1b[31m.tar") == "shard-\\x1b[31m.tar"
//
// A URL loses its user information (user and password, even a password with an unencoded '/',
// '?', '#' or '@' in it), its query (presigned signatures, tokens) and its fragment; every
// control character (C0, DEL) of what is left is written as \xNN, so that a name from a tar
// member or a server cannot move the cursor, colour a terminal or forge a log line. A plain
// path keeps everything but its control characters.
//
// Thread safety: pure functions.
#ifndef FEEDLINE_SRC_CORE_REDACT_H_
#define FEEDLINE_SRC_CORE_REDACT_H_

#include <string>
#include <string_view>

#include "feedline/error.h"  // ShownName, the public face of this file

namespace feedline {

// The URL without user information, query and fragment; not a URL (no "scheme://"): as given.
std::string RedactUrl(std::string_view url);
// Control characters as \xNN (valid UTF-8 and printable bytes kept).
std::string EscapeControl(std::string_view s);
// ShownName (feedline/error.h) is EscapeControl(RedactUrl(path_or_url)).

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_REDACT_H_
