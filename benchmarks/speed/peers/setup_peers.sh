#!/usr/bin/env bash
# Create the peers' environments of benchmarks/speed/bench_peers.py: one virtual environment per peer
# framework, outside the repository.
#
#   benchmarks/speed/peers/setup_peers.sh [DIR]
#
# DIR defaults to $FEDSELECT_PEERS, else ~/.cache/fedselect-peers; bench_peers.py looks in the same
# place (or takes --peers DIR). Each of DIR/flgo and DIR/fedlab gets, in this order:
#   1. torch 2.13.0, pinned: an unpinned torch would pull the newest release, and on Linux the default
#      build is the multi-GB CUDA one. Set TORCH_SPEC to change the pin; point pip at a CPU build with
#      your own pip configuration (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS) when needed.
#   2. numpy, pillow (FedLab imports PIL, which torchvision would have brought) and torchvision_stub/
#      beside this script: an import-only stand-in for torchvision (both frameworks import it at module
#      level; the registry's torchvision does not load against torch 2.13.0+cpu and would pull another
#      torch). Installing it first satisfies their dependency on torchvision.
#   3. the framework itself: flgo==0.4.4, fedlab==1.3.0.
# PYTHON picks the interpreter (default python3). Rerunning skips a peer whose environment imports.
set -euo pipefail

dir=${1:-${FEDSELECT_PEERS:-$HOME/.cache/fedselect-peers}}
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$dir"

for peer in flgo==0.4.4:flgo.algorithm.fedavg fedlab==1.3.0:fedlab.contrib.algorithm; do
    module=${peer#*:}
    peer=${peer%%:*}
    name=${peer%%==*}
    env="$dir/$name"
    if [ -x "$env/bin/python" ] && "$env/bin/python" -c "import $module" >/dev/null 2>&1; then
        echo "$name: $env already set up"
        continue
    fi
    echo "$name: creating $env"
    "$python" -m venv "$env"
    "$env/bin/python" -m pip install --quiet "$torch_spec"
    "$env/bin/python" -m pip install --quiet numpy pillow "$here/torchvision_stub"
    "$env/bin/python" -m pip install --quiet "$peer"
    "$env/bin/python" -c "import torch, $module; print('$name ok: torch', torch.__version__)"
done
