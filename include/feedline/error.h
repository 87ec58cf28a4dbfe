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
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace feedline {

// Failures of the GPU path (a CUDA call that failed: no memory on the device, a sticky error
// from an earlier kernel, a lost device) carry this payload, so that a binding can tell a dead
// GPU from a bad sample (Python: feedline.DeviceError, not feedline.DataError).
inline constexpr char kDeviceErrorPayload[] = "https://feedline.dev/device-error";
inline absl::Status MarkDeviceError(absl::Status s) {
  if (!s.ok()) s.SetPayload(kDeviceErrorPayload, absl::Cord("cuda"));
  return s;
}
inline bool IsDeviceError(const absl::Status& s) {
  return s.GetPayload(kDeviceErrorPayload).has_value();
}

// A sample failure that replacing the sample would hide (on_error=kSkip does not replace it,
// and it is not counted as a bad sample): the transform asks its consumer to act instead —
// e.g. Python's DataLoader(pad=True) grows a padded field's bound and restarts at the batch.
inline constexpr char kNotReplaceablePayload[] = "https://feedline.dev/not-replaceable";
inline absl::Status MarkNotReplaceable(absl::Status s) {
  if (!s.ok()) s.SetPayload(kNotReplaceablePayload, absl::Cord("1"));
  return s;
}
inline bool IsNotReplaceable(const absl::Status& s) {
  return s.GetPayload(kNotReplaceablePayload).has_value();
}

class Error : public std::runtime_error {
 public:
  // An error is never OK: an OK status or code becomes kUnknown.
  explicit Error(const absl::Status& status)
      : std::runtime_error(std::string(status.message())),
        code_(status.ok() ? absl::StatusCode::kUnknown : status.code()),
        device_(IsDeviceError(status)) {}
  Error(absl::StatusCode code, const std::string& message)
      : std::runtime_error(message),
        code_(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code) {}

  absl::StatusCode code() const noexcept { return code_; }
  // A failure of the GPU path (kDeviceErrorPayload), not of a sample.
  bool device_error() const noexcept { return device_; }
  // The error as a status again (code, message, device mark), e.g. to return it from a Status
  // function.
  absl::Status status() const {
    absl::Status s(code_, what());
    return device_ ? MarkDeviceError(std::move(s)) : s;
  }

 private:
  absl::StatusCode code_;
  bool device_ = false;
};

// A path or URL as every feedline message shows it (errors, stats(), logs, repr()): a URL
// without its user information, query and fragment (credentials, presigned signatures), and
// control characters written as \xNN. Name files this way in your own Dataset's errors.
std::string ShownName(std::string_view path_or_url);

}  // namespace feedline

#endif  // FEEDLINE_ERROR_H_
