// feedline — the image classification built-in, as a transform for any data set.
//
// `Loader::Create(LoaderOptions("data/train"))` is this transform over a `FileDataset`. The same
// transform serves any data set whose records hold an encoded image (`record.bytes`: JPEG or
// PNG) and a class label (`record.label`) — a data set of your own, or a wrapper of a
// FileDataset that injects faults or latency:
//
//   auto files = feedline::FileDataset::Open("data/train");
//   auto transform = feedline::image::MakeTransform(options);   // the image options
//   auto loader = feedline::Loader::Create(std::make_shared<MyWrapper>(*files), *transform,
//                                          options);
//
// Fields: "image" (options.dtype(); [3, S, S] for NCHW, [S, S, 3] for NHWC; S = options.size())
// and "label" (int64 []). Through this generic path the image is converted on the CPU even with
// a CUDA device (the copy stage then moves it as it is); `Loader::Create(LoaderOptions)` converts
// on the GPU instead.
#ifndef FEEDLINE_IMAGE_H_
#define FEEDLINE_IMAGE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "feedline/options.h"
#include "feedline/transform.h"

namespace feedline::image {

// kInvalidArgument naming the option when an image option is out of range.
absl::Status ValidateOptions(const LoaderOptions& options);

// The transform for `options`' image settings (transform, size, resize_size, scale, ratio, flip,
// layout, dtype, mean, std, max_image_pixels). Errors as ValidateOptions.
absl::StatusOr<std::shared_ptr<SampleTransform>> MakeTransform(const LoaderOptions& options);

}  // namespace feedline::image

#endif  // FEEDLINE_IMAGE_H_
