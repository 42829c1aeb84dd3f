#!/usr/bin/env bash
# Draws `estimate --table strategies` as an SVG bar chart: the largest model per placement, on a
# log scale (docs/tables.md). Extra arguments go to estimate (--nodes, --gpu-mem, ...).
# usage: tools/plot_strategies.sh <build dir> <out.svg> [estimate flags...]
set -euo pipefail
build=${1:?usage: tools/plot_strategies.sh <build dir> <out.svg> [estimate flags...]}
out=${2:?usage: tools/plot_strategies.sh <build dir> <out.svg> [estimate flags...]}
shift 2
table=$("$build/bin/estimate" --table strategies "$@")

# The placement rows: from the header line starting "  placement" to the next blank line. The
# name is the first 16 columns; the size is the last "<number>B" or "<number>T" on the line.
echo "$table" | awk -v out="$out" '
  /^  placement/ { rows = 1; next }
  rows && /^$/ { rows = 0 }
  rows {
    name = substr($0, 3, 16); sub(/ +$/, "", name)
    size = ""; unit = ""
    for (i = NF; i > 0; --i) if ($i ~ /^[0-9.]+[BT]$/) { size = $i; break }
    if (size == "") next
    unit = substr(size, length(size)); v = substr(size, 1, length(size) - 1) + 0
    n++; names[n] = name; labels[n] = size; params[n] = v * (unit == "T" ? 1e12 : 1e9)
  }
  /^cluster:/ { cluster = substr($0, 10) }
  END {
    if (n == 0) { print "plot_strategies.sh: no placement rows in estimate'"'"'s output" > "/dev/stderr"; exit 1 }
    lo = 9; hi = 9
    for (i = 1; i <= n; ++i) { e = log(params[i]) / log(10); if (e + 1 > hi) hi = int(e) + 1 }
    left = 130; width = 520; top = 50; bar = 24; gap = 10
    height = top + n * (bar + gap) + 50
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", left + width + 80, height > out
    printf "<text x=\"10\" y=\"20\" font-size=\"14\">Largest model per placement (model states, 20 bytes per parameter)</text>\n" >> out
    printf "<text x=\"10\" y=\"38\" fill=\"#555\">%s</text>\n", cluster >> out
    for (e = lo; e <= hi; ++e) {
      x = left + (e - lo) / (hi - lo) * width
      printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, top - 5, x, height - 40 >> out
      lab = e < 12 ? sprintf("%gB", 10 ^ (e - 9)) : sprintf("%gT", 10 ^ (e - 12))
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%s</text>\n", x, height - 25, lab >> out
    }
    for (i = 1; i <= n; ++i) {
      y = top + (i - 1) * (bar + gap)
      w = (log(params[i]) / log(10) - lo) / (hi - lo) * width
      if (w < 1) w = 1
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", left - 8, y + bar * 0.7, names[i] >> out
      printf "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#4a7ab7\"/>\n", left, y, w, bar >> out
      printf "<text x=\"%.1f\" y=\"%d\">%s</text>\n", left + w + 6, y + bar * 0.7, labels[i] >> out
    }
    printf "<text x=\"%d\" y=\"%d\" fill=\"#555\">parameters (log scale)</text>\n", left + width / 2 - 60, height - 8 >> out
    print "</svg>" >> out
  }'
echo "wrote $out"
