// Draws plots with gnuplot (svg terminal) in one subprocess per batch of plots.
#pragma once

#include <string>
#include <vector>

namespace ulpgate::report {

/// One plot: gnuplot commands that set it up and draw it (after `reset`), and the inline
/// data blocks they use ($name << EOD ... EOD).
struct Plot {
  std::string script;
  int width = 720, height = 420;
};

/// Runs gnuplot once on all plots and returns one SVG document per plot (XML prolog and
/// DOCTYPE removed, element ids made unique per plot so that the SVGs can share one HTML
/// page). The program is $ULPGATE_GNUPLOT or "gnuplot" on PATH; throws InputError when it
/// cannot be started and std::runtime_error (with gnuplot's message) when it fails.
std::vector<std::string> render_svgs(const std::vector<Plot>& plots);

/// Draws one small plot, so that a long run finds out at its start (InputError or
/// std::runtime_error, as render_svgs) that it could not draw its report at the end.
void check_gnuplot();

/// A string literal for a gnuplot script: single-quoted ('' for a quote), control
/// characters dropped (gnuplot strings are one line).
std::string gnuplot_string(std::string_view s);

}  // namespace ulpgate::report
