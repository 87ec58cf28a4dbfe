// feedline — the exception thrown at the library's throwing boundaries (the LibTorch adapter).
//
// Inside the library errors are values (`absl::Status`); the adapters that give users a
// throwing interface, as `torch::data` does, turn a non-OK status into a `feedline::Error`:
//
//   try {
//     for (auto& batch : *loader) Train(batch.data, batch.target);
//   } catch (const feedline::Error& e) {
//     if (e.code() == absl::StatusCode::kDataLoss) ...;   // e.what(): "<file>: <cause>"
//   }
//
// `what()` is the status message (for a failed sample: the file and the cause); `code()` is the
// canonical code (kNotFound, kInvalidArgument, kDataLoss, ...), so callers need not parse text.
//
// Thread safety: an immutable value.
#ifndef FEEDLINE_ERROR_H_
#define FEEDLINE_ERROR_H_

#include <stdexcept>
#include <string>

#include "absl/status/status.h"

namespace feedline {

class Error : public std::runtime_error {
 public:
  // An error is never OK: an OK status or code becomes kUnknown.
  explicit Error(const absl::Status& status)
      : std::runtime_error(std::string(status.message())),
        code_(status.ok() ? absl::StatusCode::kUnknown : status.code()) {}
  Error(absl::StatusCode code, const std::string& message)
      : std::runtime_error(message),
        code_(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code) {}

  absl::StatusCode code() const noexcept { return code_; }
  // The error as a status again (code and message), e.g. to return it from a Status function.
  absl::Status status() const { return absl::Status(code_, what()); }

 private:
  absl::StatusCode code_;
};

}  // namespace feedline

#endif  // FEEDLINE_ERROR_H_
