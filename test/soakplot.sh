#!/usr/bin/env bash
# Plots the soak's samples (make soak; test/faults/soak_test.go) to a PNG:
# RSS, goroutines, open files and store size of each node against time,
# with the faults shaded.
#
#   test/soakplot.sh soak.csv soak-faults.csv soak.png
#
# Needs gnuplot (Debian: gnuplot-nox; `make soak` installs it when absent).
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 SAMPLES.csv FAULTS.csv OUT.png" >&2
  exit 2
fi
samples=$1 faults=$2 out=$3
for f in "$samples" "$faults"; do
  [ -r "$f" ] || { echo "$0: cannot read $f" >&2; exit 2; }
done
head -1 "$samples" | grep -q '^elapsed_s,node,pid,rss_bytes,goroutines,open_fds,store_bytes,fault$' ||
  { echo "$0: $samples: not a soak sample file (header: $(head -1 "$samples"))" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "$0: gnuplot is needed (apt-get install gnuplot-nox)" >&2; exit 2; }

nodes=$(tail -n +2 "$samples" | cut -d, -f2 | sort -u | tr '\n' ' ')
# One shaded band per fault, labelled with its kind at the top.
bands=$(tail -n +2 "$faults" | awk -F, '{
  printf "set object rect from %s/60.0, graph 0 to %s/60.0, graph 1 behind fillcolor rgb \"#e8e8e8\" fillstyle solid noborder\n", $1, $2 }')
labels=$(tail -n +2 "$faults" | awk -F, '{
  printf "set label \"%s\" at %s/60.0, graph 0.97 font \",7\" rotate by 90 right textcolor rgb \"#777777\"\n", $3, $1 }')
minutes=$(tail -n +2 "$samples" | awk -F, 'BEGIN{m=0} {if ($1>m) m=$1} END{printf "%.1f", m/60}')

# Column c of node n, scaled by s; empty cells (process down or paused) are
# left out.
gnuplot <<GP
set datafile separator ","
set terminal pngcairo size 1400,1000 font ",10"
set output "$out"
set multiplot layout 2,2 title "Sluice soak: 5 nodes, mixed load, a fault every 30 s (shaded); $minutes min"
set xlabel "minutes"
set key top left font ",8"
set grid
set xrange [0:$minutes]
series(n, c, s) = sprintf("< awk -F, 'NR>1 && \$2==\"%s\" && \$%d!=\"\" {print \$1\",\"\$%d}' $samples", n, c, c)
set offsets 0, 0, graph 0.15, 0
set yrange [0:*]
$bands
$labels
set ylabel "RSS (MiB)"
plot for [n in "$nodes"] series(n, 4, 1) using (\$1/60):(\$2/1048576) with linespoints pt 7 ps 0.4 title n
set ylabel "goroutines"
plot for [n in "$nodes"] series(n, 5, 1) using (\$1/60):2 with linespoints pt 7 ps 0.4 title n
set ylabel "open files"
plot for [n in "$nodes"] series(n, 6, 1) using (\$1/60):2 with linespoints pt 7 ps 0.4 title n
set ylabel "store on disk (MiB)"
plot for [n in "$nodes"] series(n, 7, 1) using (\$1/60):(\$2/1048576) with linespoints pt 7 ps 0.4 title n
unset multiplot
GP
echo "wrote $out"
