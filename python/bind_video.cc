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
      [](int clip_len, int frame_step, double fps, int clips_per_video,
         const std::string& clip_starts, int audio_rate, int audio_channels, double audio_seconds,
         py::kwargs kwargs) {
        video::ClipOptions clip;
        clip.clip_len = clip_len;
        clip.frame_step = frame_step;
        clip.fps = fps;
        clip.clips_per_video = clips_per_video;
        clip.audio_rate = audio_rate;
        clip.audio_channels = audio_channels;
        clip.audio_seconds = audio_seconds;
        if (clip_starts == "random") {
          clip.starts = video::ClipStarts::kRandom;
        } else if (clip_starts == "uniform") {
          clip.starts = video::ClipStarts::kUniform;
        } else if (!clip_starts.empty()) {
          throw py::value_error("clip_starts: must be 'random', 'uniform' or None, got '" +
                                clip_starts + "'");
        }
        LoaderOptions o;
        SetOptions(kwargs, {OptionGroup::kEngine, OptionGroup::kImage}, &o);
        return LoaderHolder(
            Unlocked([&] { return video::MakeVideoLoader(clip, std::move(o)); }).release());
      },
      py::arg("clip_len"), py::arg("frame_step"), py::arg("fps"), py::arg("clips_per_video"),
      py::arg("clip_starts"), py::arg("audio_rate") = 0, py::arg("audio_channels") = 1,
      py::arg("audio_seconds") = 0.0,
      OptionsDocstring("The video built-in's loader (feedline.VideoLoader's engine): clip_len, "
                       "frame_step, fps, clips_per_video, clip_starts ('' for the transform's "
                       "default), audio_rate (0: no audio), audio_channels, audio_seconds, then "
                       "these keyword arguments, the declared options:",
                       {OptionGroup::kEngine, OptionGroup::kImage}));
  m.def(
      "video_extensions", [] { return video::VideoExtensions(); },
      "The file extensions of a folder of videos.");
}

}  // namespace feedline::python
