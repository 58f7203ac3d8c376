#!/usr/bin/env bash
# The main job on the embedded default: set up, then regenerate the ablation grid of
# config/config.yaml with Snakemake on 2 cores, ending in results/report.md. Rerunning does only
# what changed; extra arguments go to Snakemake (e.g. -n for a dry run, --configfile FILE, or the
# targets `dense` / `all dense` for the dense tasks, which first set up OpenMMLab).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" dense "* ]]; then ./scripts/setup.sh --dense; else ./scripts/setup.sh; fi
.venv/bin/snakemake --cores 2 --workflow-profile workflow/profiles/local "$@"
# the grid's results folder: that of the last --configfile given, else the shipped grid's
configfile=config/config.yaml
args=("$@")
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = "--configfile" ] && [ $((i + 1)) -lt ${#args[@]} ]; then
    configfile=${args[$((i + 1))]}
  fi
done
results=$(.venv/bin/python -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['results'])" \
  "$configfile")
if [ -f "$results/tables/main.md" ] && [[ " $* " != *" -n "* ]]; then
  # Snakemake's HTML report beside report.md: the tables and figures with their captions
  .venv/bin/snakemake --workflow-profile workflow/profiles/local "$@" \
    --report "$results/report.html" >"$results/logs/report_html.log" 2>&1 \
    || echo "snakemake --report failed: see $results/logs/report_html.log" >&2
  echo; cat "$results/tables/main.md"; echo
  echo "report: $results/report.md (and $results/report.html, Snakemake's report)"
fi
