#!/usr/bin/env bash
# Draws tools/tables.sh's measured table as an SVG (docs/tables.md): per placement a bar of the
# largest model that trained, a tick at the predicted largest, and its tokens/s.
# usage: tools/plot_tables.sh <table file (tables.sh --out)> <out.svg>
set -euo pipefail
table=${1:?usage: tools/plot_tables.sh <table file> <out.svg>}
out=${2:?usage: tools/plot_tables.sh <table file> <out.svg>}
[[ -f "$table" ]] || { echo "plot_tables.sh: no table file '$table'" >&2; exit 2; }

# The summary rows: from the header starting "placement  " to the blank line before "probes:".
# The name is the first 15 columns; then largest, params, tokens/s, predicted, params.
awk -v out="$out" '
  /^Measured / { machine = $0 }
  /^family:/ { family = $0 }
  /^placement +largest/ { rows = 1; next }
  rows && /^$/ { rows = 0 }
  rows {
    name = substr($0, 1, 15); sub(/ +$/, "", name)
    split(substr($0, 16), f, " ")
    n++; names[n] = name
    meas[n] = (f[2] ~ /M$/) ? substr(f[2], 1, length(f[2]) - 1) + 0 : 0
    tps[n] = f[3]; label[n] = f[2]
    pred[n] = (f[5] ~ /M$/) ? substr(f[5], 1, length(f[5]) - 1) + 0 : 0
    note[n] = (f[2] ~ /M$/) ? "" : substr($0, 16); sub(/^[ -]+/, "", note[n])
    if (meas[n] > top) top = meas[n]
    if (pred[n] > top) top = pred[n]
  }
  END {
    if (n == 0) { print "plot_tables.sh: no placement rows in the table" > "/dev/stderr"; exit 1 }
    step = 100; while (top / step > 8) step *= 2
    hi = (int(top / step) + 1) * step
    left = 130; width = 480; top_y = 98; bar = 24; gap = 14
    # The machine line in two: its NVMe part without the temporary directory the probes used.
    nv = index(machine, "; NVMe ")
    m1 = nv ? substr(machine, 1, nv) : machine
    m2 = nv ? substr(machine, nv + 2) : ""
    sub(/ \/[^ ]*/, "", m2)
    height = top_y + n * (bar + gap) + 56
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", left + width + 200, height > out
    printf "<text x=\"10\" y=\"20\" font-size=\"14\">Largest GPT-2 that trains, per placement: measured (bar), predicted (tick)</text>\n" >> out
    printf "<text x=\"10\" y=\"38\" fill=\"#555\">%s</text>\n", m1 >> out
    printf "<text x=\"10\" y=\"54\" fill=\"#555\">%s</text>\n", m2 >> out
    printf "<text x=\"10\" y=\"70\" fill=\"#555\">%s</text>\n", family >> out
    for (v = 0; v <= hi; v += step) {
      x = left + v / hi * width
      printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, top_y - 5, x, height - 44 >> out
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">%gM</text>\n", x, height - 30, v >> out
    }
    for (i = 1; i <= n; ++i) {
      y = top_y + (i - 1) * (bar + gap)
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", left - 8, y + bar * 0.7, names[i] >> out
      if (meas[i] == 0 && pred[i] == 0) {
        printf "<text x=\"%d\" y=\"%d\" fill=\"#777\">%s</text>\n", left + 4, y + bar * 0.7, substr(note[i], 1, 70) >> out
        continue
      }
      w = meas[i] / hi * width
      printf "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#4a7ab7\"/>\n", left, y, w, bar >> out
      px = left + pred[i] / hi * width
      printf "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#c0392b\" stroke-width=\"3\"/>\n", px, y - 4, px, y + bar + 4 >> out
      lx = (px > left + w ? px : left + w) + 8
      printf "<text x=\"%.1f\" y=\"%d\">%s, %s tokens/s</text>\n", lx, y + bar * 0.7, label[i], tps[i] >> out
    }
    printf "<text x=\"%d\" y=\"%d\" fill=\"#555\">parameters</text>\n", left + width / 2 - 30, height - 10 >> out
    print "</svg>" >> out
  }' "$table"
echo "wrote $out"
