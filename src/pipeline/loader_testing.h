// A test hook: a loader over an injected `SampleSource` (fault injection: EIO, hangs, files
// that vanish). Not part of the public API.
#ifndef FEEDLINE_SRC_PIPELINE_LOADER_TESTING_H_
#define FEEDLINE_SRC_PIPELINE_LOADER_TESTING_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "feedline/loader.h"
#include "io/reader.h"

namespace feedline::internal {

class LoaderTesting {
 public:
  // `make_source` gets the data set (owned by the loader) and returns the source to read with.
  static absl::StatusOr<std::unique_ptr<Loader>> CreateWithSource(
      LoaderOptions options, Dataset dataset,
      const std::function<std::unique_ptr<SampleSource>(const Dataset*)>& make_source);
};

}  // namespace feedline::internal

#endif  // FEEDLINE_SRC_PIPELINE_LOADER_TESTING_H_
