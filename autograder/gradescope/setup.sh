#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image; the zip made by
# `ppo-course gradescope` unpacks to /autograder/source.
#
# Supported image: Gradescope's Ubuntu 24.04 base image with its Python 3.12. Python 3.11
# works too (Debian 12: `course/gradescope_sim.sh` builds such an image and runs this script in it).
# Every package comes pinned from autograder/gradescope/constraints.txt, the set CI tests;
# torch is its CPU build (Gradescope has no GPU), from PyTorch's CPU index (PPO_TORCH_INDEX).
set -euo pipefail
cd /autograder/source
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-venv util-linux libseccomp2 ca-certificates
python3 - <<'PY'
import sys
if sys.version_info[:2] not in ((3, 11), (3, 12)):
    sys.exit(f"setup.sh: Python {sys.version.split()[0]} is not supported: use Gradescope's Ubuntu 24.04 "
             "base image (Python 3.12), or any image with Python 3.11 or 3.12")
PY
python3 -m venv /autograder/venv
# Editable: the venv holds our packages' paths only, never their code; the code stays in
# /autograder/source, which harden.sh makes root-only.
/autograder/venv/bin/pip install -q --no-cache-dir -c autograder/gradescope/constraints.txt \
    --extra-index-url "${PPO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" -e '.[grade]'
bash autograder/gradescope/harden.sh /autograder/source /autograder/venv
# Record the examples every passing submission meets (autograder/replay.py), in root's
# ~/.cache/ppo-grade: each grading replays them, where the grading machine's CPU has this one's
# vector extension (else it draws them, as without a recording). The hidden checks' only if
# PPO_GRADER_HIDDEN_SEED is already set here; else each grading draws those.
/autograder/venv/bin/python -m autograder solutions/exercises.py --results /tmp/setup-results.json --quiet \
    >/dev/null 2>&1 || true
rm -f /tmp/setup-results.json
