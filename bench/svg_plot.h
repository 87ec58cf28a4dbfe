// feedline-bench: hand-written SVG charts (no plotting library): line panels for figures over
// time and bar panels for comparisons, stacked in one figure, with axes, ticks, legends and
// tooltips (SVG <title>, shown by browsers on hover).
//
//   SvgFigure fig("feedline-bench: decode-bound run");
//   LinePanel p{.title = "throughput", .x_label = "time (s)", .y_label = "images/s"};
//   p.series.push_back({.name = "images/s", .color = "#1f77b4", .x = t, .y = rate});
//   fig.Add(std::move(p));
//   std::string svg = fig.Render();
//
// Thread safety: a plain value; one thread at a time.
#ifndef FEEDLINE_BENCH_SVG_PLOT_H_
#define FEEDLINE_BENCH_SVG_PLOT_H_

#include <string>
#include <variant>
#include <vector>

namespace feedline::bench {

struct PlotSeries {
  std::string name;   // in the legend
  std::string color;  // any SVG colour
  std::vector<double> x, y;
  bool step = false;    // hold each value until the next x (settings that change at instants)
  bool dashed = false;  // a dashed line
};

// A vertical line across a line panel at `x`, with a tooltip.
struct PlotMarker {
  double x = 0;
  std::string tooltip;
  std::string color = "#888888";
  bool dashed = true;
  std::string label;  // short text at the top of the line ("" for none)
};

// A horizontal reference line (a target, a limit) with its label.
struct PlotLevel {
  double y = 0;
  std::string label;
  std::string color = "#d62728";
};

struct LinePanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotMarker> markers;
  std::vector<PlotLevel> levels;
  // Legend entries for the markers, as (colour, text); markers themselves are not in it.
  std::vector<std::pair<std::string, std::string>> marker_legend;
  bool integer_y = false;  // settings: integer ticks only
};

struct BarItem {
  std::string label;  // under the bar
  double value = 0;
  std::string color;
  std::string text;     // above the bar (default: the value)
  std::string tooltip;  // on hover (default: label and value)
};

struct BarPanel {
  std::string title;
  std::string y_label;
  std::vector<BarItem> bars;
  std::vector<PlotLevel> levels;
};

class SvgFigure {
 public:
  explicit SvgFigure(std::string title, int width = 1000);
  void Add(LinePanel panel);
  void Add(BarPanel panel);
  bool empty() const { return panels_.empty(); }
  // The whole document.
  std::string Render() const;

 private:
  std::string title_;
  int width_;
  std::vector<std::variant<LinePanel, BarPanel>> panels_;
};

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_SVG_PLOT_H_
