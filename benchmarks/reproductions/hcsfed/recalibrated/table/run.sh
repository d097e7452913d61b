#!/bin/sh
# The recalibrated HCSFed table (issue 24 item 3): resumable; one process at a time on the 2-core machine.
# CODE: a checkout of one commit (so every run of the table comes from it while main moves on); default: this tree.
set -e
T=$(cd "$(dirname "$0")" && pwd)
CODE=${CODE:-$(cd "$T/../../../../.." && pwd)}
cd "$CODE"
for preset in full q0.1 q0.3 q0.5; do
  case $preset in full) name=hcsfed-fmnist-full-recalibrated;; *) name=hcsfed-fmnist-$preset-recalibrated;; esac
  PYTHONPATH=. nice -n 19 python -m fedselect.cli reproduce "$name" --seeds 0 1 2 3 4 5 6 7 8 9 \
    --threads 1 --no-progress --compress --out "$T/$preset"
done
