// The process environment, read where configuration comes from it (credentials, endpoints,
// cache folders and budgets).
//
// Thread safety: reads only; the environment must not be changed while loaders run.
#ifndef FEEDLINE_SRC_CORE_ENV_H_
#define FEEDLINE_SRC_CORE_ENV_H_

#include <cstdlib>
#include <string>

namespace feedline {

// The value of environment variable `name`, or "" when it is not set.
inline std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_ENV_H_
