#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace feedline::bench {
namespace {

// Layout, in SVG user units (pixels).
constexpr int kFigureTitleHeight = 40;
constexpr int kMarginLeft = 84;
constexpr int kMarginRight = 210;  // the legend lives here
constexpr int kPanelTitleHeight = 34;
constexpr int kPlotHeight = 220;
constexpr int kLineAxisHeight = 48;  // tick labels and the x axis label
constexpr int kBarLabelHeight = 96;  // (rotated) bar labels
constexpr int kPanelGap = 14;

std::string Escape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct Ticks {
  double lo = 0, hi = 1, step = 1;
};

// Round steps (1, 2, 5 x 10^k) covering [lo, hi] with about `target` intervals; the axis is
// extended to whole steps.
Ticks NiceTicks(double lo, double hi, int target, bool integer) {
  if (!(hi > lo)) hi = lo + (integer ? 1 : std::max(1e-9, std::abs(lo)));
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(1.0, std::round(step));
  return Ticks{std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step, step};
}

std::string FormatTick(double v, double step) {
  if (std::abs(v) < step * 1e-6) v = 0;
  const int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  return absl::StrFormat("%.*f", decimals, v);
}

// A short form of a value for labels: 3 significant digits, no exponent for ordinary sizes.
std::string Short(double v) {
  if (!std::isfinite(v)) return "n/a";
  const double a = std::abs(v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  if (a >= 10) return absl::StrFormat("%.1f", v);
  if (a >= 1) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.3g", v);
}

class Canvas {
 public:
  void Line(double x1, double y1, double x2, double y2, absl::string_view color, double width,
            bool dashed = false, absl::string_view tooltip = "") {
    absl::StrAppendFormat(&out_,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"%.1f\"%s>",
                          x1, y1, x2, y2, Escape(color), width,
                          dashed ? " stroke-dasharray=\"5,4\"" : "");
    if (!tooltip.empty()) absl::StrAppend(&out_, "<title>", Escape(tooltip), "</title>");
    out_ += "</line>\n";
  }
  void Text(double x, double y, absl::string_view text, absl::string_view anchor = "start",
            int size = 12, absl::string_view extra = "") {
    absl::StrAppendFormat(&out_,
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"%s\"%s%s>"
                          "%s</text>\n",
                          x, y, size, anchor, extra.empty() ? "" : " ", extra, Escape(text));
  }
  void Rect(double x, double y, double w, double h, absl::string_view fill,
            absl::string_view tooltip = "", absl::string_view stroke = "") {
    absl::StrAppendFormat(
        &out_,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
        "fill=\"%s\"%s>",
        x, y, w, h, Escape(fill),
        stroke.empty() ? std::string()
                       : absl::StrCat(" stroke=\"", Escape(stroke), "\" stroke-width=\"2\""));
    if (!tooltip.empty()) absl::StrAppend(&out_, "<title>", Escape(tooltip), "</title>");
    out_ += "</rect>\n";
  }
  void Polyline(const std::vector<std::pair<double, double>>& points, absl::string_view color,
                bool dashed, absl::string_view tooltip) {
    out_ += "<polyline fill=\"none\" stroke-linejoin=\"round\" points=\"";
    for (const auto& [x, y] : points) absl::StrAppendFormat(&out_, "%.1f,%.1f ", x, y);
    absl::StrAppendFormat(&out_, "\" stroke=\"%s\" stroke-width=\"2\"%s>", Escape(color),
                          dashed ? " stroke-dasharray=\"6,3\"" : "");
    if (!tooltip.empty()) absl::StrAppend(&out_, "<title>", Escape(tooltip), "</title>");
    out_ += "</polyline>\n";
  }
  void Raw(absl::string_view s) { out_.append(s.data(), s.size()); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// The y axis: grid lines, tick labels and the rotated axis label.
void DrawYAxis(Canvas& c, const Ticks& t, double left, double right, double top, double bottom,
               absl::string_view label) {
  const auto y_of = [&](double v) { return bottom - (v - t.lo) / (t.hi - t.lo) * (bottom - top); };
  for (double v = t.lo; v <= t.hi + t.step * 1e-6; v += t.step) {
    const double y = y_of(v);
    c.Line(left, y, right, y, "#e4e4e4", 1);
    c.Text(left - 6, y + 4, FormatTick(v, t.step), "end", 11);
  }
  c.Line(left, top, left, bottom, "#333333", 1);
  c.Line(left, bottom, right, bottom, "#333333", 1);
  const double mid = (top + bottom) / 2;
  c.Text(18, mid, label, "middle", 12, absl::StrFormat("transform=\"rotate(-90 18 %.1f)\"", mid));
}

void DrawLevels(Canvas& c, const std::vector<PlotLevel>& levels, const Ticks& t, double left,
                double right, double top, double bottom) {
  for (const PlotLevel& level : levels) {
    const double y = bottom - (level.y - t.lo) / (t.hi - t.lo) * (bottom - top);
    // Labelled in the legend (text here would collide with bars and lines).
    c.Line(left, y, right, y, level.color, 1.5, true, level.label);
  }
}

// Legend rows in the right margin, from `y` down; returns the y after the last row.
double LegendRow(Canvas& c, double x, double y, absl::string_view color, absl::string_view text,
                 bool dashed, bool swatch_box) {
  if (swatch_box) {
    c.Rect(x, y - 9, 18, 10, color);
  } else {
    c.Line(x, y - 4, x + 18, y - 4, color, 2.5, dashed);
  }
  c.Text(x + 24, y, text, "start", 11);
  return y + 17;
}

double Height(const LinePanel&) {
  return kPanelTitleHeight + kPlotHeight + kLineAxisHeight + kPanelGap;
}
double Height(const BarPanel&) {
  return kPanelTitleHeight + kPlotHeight + kBarLabelHeight + kPanelGap;
}

void Draw(Canvas& c, const LinePanel& p, double top, int width) {
  const double left = kMarginLeft, right = width - kMarginRight;
  const double plot_top = top + kPanelTitleHeight, plot_bottom = plot_top + kPlotHeight;
  c.Text(left, top + 22, p.title, "start", 14, "font-weight=\"bold\"");

  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_hi = 0;
  for (const PlotSeries& s : p.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      y_hi = std::max(y_hi, s.y[i]);
    }
  }
  for (const PlotMarker& m : p.markers) {
    x_lo = std::min(x_lo, m.x);
    x_hi = std::max(x_hi, m.x);
  }
  for (const PlotLevel& l : p.levels) y_hi = std::max(y_hi, l.y);
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  if (x_lo >= 0) x_lo = 0;  // time axes start at 0
  const Ticks xt = NiceTicks(x_lo, x_hi, 10, false);
  const Ticks yt = NiceTicks(0, y_hi * 1.05, 5, p.integer_y);
  const auto x_of = [&](double v) { return left + (v - xt.lo) / (xt.hi - xt.lo) * (right - left); };
  const auto y_of = [&](double v) {
    return plot_bottom - (v - yt.lo) / (yt.hi - yt.lo) * (plot_bottom - plot_top);
  };

  DrawYAxis(c, yt, left, right, plot_top, plot_bottom, p.y_label);
  for (double v = xt.lo; v <= xt.hi + xt.step * 1e-6; v += xt.step) {
    c.Line(x_of(v), plot_bottom, x_of(v), plot_bottom + 4, "#333333", 1);
    c.Text(x_of(v), plot_bottom + 17, FormatTick(v, xt.step), "middle", 11);
  }
  c.Text((left + right) / 2, plot_bottom + 38, p.x_label, "middle", 12);

  for (const PlotMarker& m : p.markers) {
    c.Line(x_of(m.x), plot_top, x_of(m.x), plot_bottom, m.color, 1.2, m.dashed, m.tooltip);
    if (!m.label.empty()) {
      c.Text(x_of(m.x) + 3, plot_top + 11, m.label, "start", 10,
             absl::StrCat("fill=\"", m.color, "\""));
    }
  }
  DrawLevels(c, p.levels, yt, left, right, plot_top, plot_bottom);
  for (const PlotSeries& s : p.series) {
    std::vector<std::pair<double, double>> points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if (s.step && !points.empty()) points.emplace_back(x_of(s.x[i]), points.back().second);
      points.emplace_back(x_of(s.x[i]), y_of(s.y[i]));
    }
    if (points.size() == 1) points.push_back(points.front());
    c.Polyline(points, s.color, s.dashed, s.name);
  }

  double ly = plot_top + 12;
  const double lx = right + 16;
  for (const PlotSeries& s : p.series) ly = LegendRow(c, lx, ly, s.color, s.name, s.dashed, false);
  for (const auto& [color, text] : p.marker_legend)
    ly = LegendRow(c, lx, ly, color, text, true, false);
  for (const PlotLevel& l : p.levels) ly = LegendRow(c, lx, ly, l.color, l.label, true, false);
}

void Draw(Canvas& c, const BarPanel& p, double top, int width) {
  const double left = kMarginLeft, right = width - kMarginRight;
  const double plot_top = top + kPanelTitleHeight, plot_bottom = plot_top + kPlotHeight;
  c.Text(left, top + 22, p.title, "start", 14, "font-weight=\"bold\"");

  double y_hi = 0;
  for (const BarItem& b : p.bars) {
    if (std::isfinite(b.value)) y_hi = std::max(y_hi, b.value);
  }
  for (const PlotLevel& l : p.levels) y_hi = std::max(y_hi, l.y);
  const Ticks yt = NiceTicks(0, y_hi * 1.12, 5, false);  // room for the value labels
  const auto y_of = [&](double v) {
    return plot_bottom - (v - yt.lo) / (yt.hi - yt.lo) * (plot_bottom - plot_top);
  };
  DrawYAxis(c, yt, left, right, plot_top, plot_bottom, p.y_label);

  const size_t n = std::max<size_t>(1, p.bars.size());
  const double slot = (right - left) / double(n);
  const double bar_w = std::min(70.0, slot * 0.7);
  bool rotate = n > 6;
  for (const BarItem& b : p.bars) rotate = rotate || b.label.size() * 6.5 > slot;
  for (size_t i = 0; i < p.bars.size(); ++i) {
    const BarItem& b = p.bars[i];
    const double cx = left + slot * (double(i) + 0.5);
    const bool valid = std::isfinite(b.value);
    const double v = valid ? std::max(0.0, b.value) : 0.0;
    const std::string tip =
        b.tooltip.empty() ? absl::StrCat(b.label, ": ", Short(b.value)) : b.tooltip;
    c.Rect(cx - bar_w / 2, y_of(v), bar_w, plot_bottom - y_of(v), b.color, tip);
    c.Text(cx, y_of(v) - 5, b.text.empty() ? (valid ? Short(b.value) : "n/a") : b.text, "middle",
           11);
    if (rotate) {
      const double y = plot_bottom + 14;
      c.Text(cx + 4, y, b.label, "end", 11,
             absl::StrFormat("transform=\"rotate(-35 %.1f %.1f)\"", cx + 4, y));
    } else {
      c.Text(cx, plot_bottom + 17, b.label, "middle", 11);
    }
  }
  DrawLevels(c, p.levels, yt, left, right, plot_top, plot_bottom);
  double ly = plot_top + 12;
  for (const PlotLevel& l : p.levels)
    ly = LegendRow(c, right + 16, ly, l.color, l.label, true, false);
}

}  // namespace

SvgFigure::SvgFigure(std::string title, int width) : title_(std::move(title)), width_(width) {}

void SvgFigure::Add(LinePanel panel) { panels_.emplace_back(std::move(panel)); }
void SvgFigure::Add(BarPanel panel) { panels_.emplace_back(std::move(panel)); }

std::string SvgFigure::Render() const {
  double height = kFigureTitleHeight;
  for (const auto& p : panels_) height += std::visit([](const auto& q) { return Height(q); }, p);
  Canvas c;
  c.Raw(
      absl::StrFormat("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" "
                      "viewBox=\"0 0 %d %.0f\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n",
                      width_, height, width_, height));
  c.Rect(0, 0, width_, height, "#ffffff");
  c.Text(width_ / 2.0, 26, title_, "middle", 16, "font-weight=\"bold\"");
  double top = kFigureTitleHeight;
  for (const auto& p : panels_) {
    std::visit(
        [&](const auto& q) {
          Draw(c, q, top, width_);
          top += Height(q);
        },
        p);
  }
  c.Raw("</svg>\n");
  return std::move(c.str());
}

}  // namespace feedline::bench
