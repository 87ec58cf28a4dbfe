// The video built-in's face (feedline.VideoLoader). Bindings only: the loader is the video
// built-in's one-call factory (include/feedline/video.h).
#include <string>
#include <utility>

#include "bind_common.h"
#include "feedline/video.h"
#include "py_options.h"

namespace feedline::python {

void BindVideo(py::module_& m) {
  m.def(
      "video_loader",
      [](int clip_len, int frame_step, double fps, py::kwargs kwargs) {
        video::ClipOptions clip;
        clip.clip_len = clip_len;
        clip.frame_step = frame_step;
        clip.fps = fps;
        LoaderOptions o;
        SetOptions(kwargs, {OptionGroup::kEngine, OptionGroup::kImage}, &o);
        return LoaderHolder(
            Unlocked([&] { return video::MakeVideoLoader(clip, std::move(o)); }).release());
      },
      py::arg("clip_len"), py::arg("frame_step"), py::arg("fps"),
      OptionsDocstring("The video built-in's loader (feedline.VideoLoader's engine): clip_len, "
                       "frame_step, fps, then these keyword arguments, the declared options:",
                       {OptionGroup::kEngine, OptionGroup::kImage}));
  m.def(
      "video_extensions", [] { return video::VideoExtensions(); },
      "The file extensions of a folder of videos.");
}

}  // namespace feedline::python
