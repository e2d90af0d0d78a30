#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu, no network
# restrictions at build time). The zip made by `ppo-course gradescope` unpacks to
# /autograder/source.
set -euo pipefail
cd /autograder/source
apt-get update -q && apt-get install -y -q python3 python3-pip python3-venv util-linux
python3 -m venv /autograder/venv
# The CPU build of torch: Gradescope machines have no GPU.
/autograder/venv/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -q -e .   # editable: the packages stay under /autograder/source, where the permissions below apply

# The worker runs submissions as this unprivileged user (the "user" sandbox), because
# Gradescope's Docker forbids the namespaces the grader would otherwise use.
id ppo-grader-worker >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin ppo-grader-worker
# The worker must read the Python environment and the student-facing package, and nothing else
# of ours: the solution, the grader and its settings stay root-only.
chmod -R a+rX /autograder/venv /autograder/source/assignment
chmod 755 /autograder /autograder/source
chmod -R go-rwx /autograder/source/solutions /autograder/source/autograder /autograder/source/grading.yaml
