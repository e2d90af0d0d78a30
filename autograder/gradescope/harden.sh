#!/usr/bin/env bash
# Lock the autograder down for the `user` sandbox: the grader (root) reads everything, the
# sandbox user nothing of ours. Called by setup.sh; CI applies it to a copy of the tree to
# test the same path (tests/test_gradescope.py).
#
#   harden.sh SOURCE_DIR VENV_DIR [SANDBOX_USER]
#
# Workers run from a stage the grader writes with public modes (autograder/sandbox.py), so
# they need nothing from SOURCE_DIR: it becomes root-only as a whole, README, .git and
# build metadata included. They need the Python environment, readable by all.
set -euo pipefail
source_dir=${1:?usage: harden.sh SOURCE_DIR VENV_DIR [SANDBOX_USER]}
venv_dir=${2:?usage: harden.sh SOURCE_DIR VENV_DIR [SANDBOX_USER]}
user=${3:-ppo-grader-worker}

# The unprivileged user the workers run as (Gradescope's Docker forbids the namespaces the
# grader would otherwise use).
id "$user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$user"
chmod -R go-rwx "$source_dir"
chmod -R a+rX "$venv_dir"
# Every folder above the environment must be searchable, or the interpreter cannot start.
dir=$(dirname "$(readlink -f "$venv_dir")")
while [ "$dir" != "/" ]; do chmod a+x "$dir"; dir=$(dirname "$dir"); done
