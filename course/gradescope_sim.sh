#!/usr/bin/env bash
# Reproduce Gradescope's autograder deployment locally, to test the real path: zip -> setup.sh -> run_autograder.
#
#   course/gradescope_sim.sh AUTOGRADER_ZIP SUBMISSION.py [SUBMISSION.py ...]      (as root)
#   env: SIM_ROOT  where the Debian root is built and cached (default /var/cache/ppo-gradescope-sim/bookworm)
#        SIM_KEEP=1  leave this run's image and per-submission layers under $SIM_ROOT for inspection
#                    (the next run still starts from a fresh copy of the base: no run sees an earlier one's state)
#
# What Gradescope does, and what this does in its place:
#   * Docker image, Ubuntu base          -> a chroot of Debian bookworm (debootstrap minbase; Python 3.11), not Ubuntu.
#   * zip unpacked to /autograder/source, setup.sh run once as root (cwd /autograder/source) -> the same, in a fresh
#     copy of the cached base, so a run never sees state from an earlier run.
#   * each submission in a fresh container of the built image -> a fresh overlay over the built image per submission;
#     the file goes in as /autograder/submission/exercises.py (a symlink stays a symlink), then /autograder/run_autograder
#     runs as root with cwd /autograder and we read /autograder/results/results.json.
#   * Docker's default capabilities (no CAP_SYS_ADMIN, ...) -> the same bounding set (setpriv), inside new PID, mount,
#     UTS and IPC namespaces (the network namespace is the host's, since the network is needed, as at build time).
# Besides the distribution (Debian bookworm, Python 3.11, where Gradescope's image is Ubuntu), the ONLY deviation is
# the network: Gradescope reaches the internet; here the host's pip configuration stands in for it (/etc/xdg/pip,
# /etc/pip.conf and the PIP_* variables copied in, /opt/wheels /opt/pypi /opt/pypi-more bound read-only at the same
# paths), plus the host's extra CA certificates, which this host's HTTPS egress needs. apt reaches deb.debian.org.
# Not reproduced (approximations, not deviations we chose): Docker's seccomp profile and its minimal /dev (the host's
# /dev is bound), Gradescope's CPU/memory/time limits, its environment variables and its own wrapper process.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 AUTOGRADER_ZIP SUBMISSION.py [SUBMISSION.py ...]" >&2; exit 64; }
[ "$(id -u)" = 0 ] || { echo "must run as root (chroot, namespaces, mounts)" >&2; exit 64; }
ZIP=$(realpath -e "$1"); shift
SIM_ROOT=${SIM_ROOT:-/var/cache/ppo-gradescope-sim/bookworm}
case $SIM_ROOT in /?*) ;; *) echo "SIM_ROOT must be an absolute path other than /" >&2; exit 64;; esac
SIM_ROOT=${SIM_ROOT%/}
BASE=$SIM_ROOT/base IMG=$SIM_ROOT/image RUNS=$SIM_ROOT/runs
# Docker's default capability set (moby's defaults); everything else, CAP_SYS_ADMIN included, leaves the bounding set.
# setup.sh's torch index (PyTorch's CPU index on Gradescope) is out of reach here: the local index stands in.
if [ -z "${PPO_TORCH_INDEX:-}" ] && [ -d /opt/pypi/simple ]; then export PPO_TORCH_INDEX=file:///opt/pypi/simple; fi
export DOCKER_CAPS=-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,+setuid,+setpcap,+setfcap,+net_bind_service,+net_raw,+sys_chroot,+mknod,+audit_write
mkdir -p "$SIM_ROOT"
exec 9>"$SIM_ROOT/.lock"                      # two runs sharing one SIM_ROOT would delete each other's image
flock -n 9 || { echo "another gradescope_sim run holds $SIM_ROOT/.lock" >&2; exit 75; }

now() { echo "$EPOCHREALTIME"; }
secs() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }'; }

# Every mount is made inside a private mount namespace that dies with its processes, so none should ever show up here;
# this still checks, because `rm -rf` over a bound /dev or /opt/wheels would destroy the host's files.
unmount_all() {
    local m
    for _ in 1 2 3; do
        while read -r m; do umount -l "$m" || true; done < <(findmnt -rn -o TARGET | grep -F "$SIM_ROOT/" | sort -r || true)
    done
    if findmnt -rn -o TARGET | grep -qF "$SIM_ROOT/"; then echo "mounts remain under $SIM_ROOT; not deleting" >&2; return 1; fi
}
cleanup() {
    unmount_all || return 0
    [ "${SIM_KEEP:-0}" = 1 ] || rm -rf --one-file-system "$IMG" "$RUNS"
}
trap cleanup EXIT
# A foreground child would delay the trap until it ends: containers run in the background (run_child), so that an
# interrupt kills unshare at once (SIGKILL: unshare ignores INT and TERM), and --kill-child takes the PID namespace down.
trap '[ -z "${child:-}" ] || kill -KILL "$child" 2>/dev/null; exit 130' INT TERM
run_child() { "$@" & child=$!; local rc=0; wait "$child" || rc=$?; child=; return "$rc"; }
unmount_all
rm -rf --one-file-system "$IMG" "$RUNS" "$BASE.tmp"   # leftovers of an earlier (killed or SIM_KEEP) run

# 1. The cached base: debootstrap once; the marker is written only after a complete build.
if [ ! -e "$BASE/.sim-base-complete" ]; then
    command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } >/dev/null
    echo "== building the bookworm base in $BASE (log: $SIM_ROOT/debootstrap.log)"
    t0=$(now)
    debootstrap --variant=minbase bookworm "$BASE.tmp" http://deb.debian.org/debian >"$SIM_ROOT/debootstrap.log" 2>&1 \
        || { tail -n 20 "$SIM_ROOT/debootstrap.log" >&2; exit 1; }
    # Like the official Docker image, and like Ubuntu's: updates and security suites too.
    printf 'deb http://deb.debian.org/debian %s main\n' bookworm bookworm-updates >"$BASE.tmp/etc/apt/sources.list"
    echo 'deb http://deb.debian.org/debian-security bookworm-security main' >>"$BASE.tmp/etc/apt/sources.list"
    rm -rf --one-file-system "$BASE"; mv "$BASE.tmp" "$BASE"; touch "$BASE/.sim-base-complete"
    echo "debootstrap: $(secs "$t0")"
else
    echo "== base: cached in $BASE"
fi

# 2. This run's image: a fresh copy of the base, made to look like Gradescope's container.
cp -a "$BASE" "$IMG"
cp --remove-destination /etc/resolv.conf "$IMG/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tgradescope-sim\n' >"$IMG/etc/hosts"
echo gradescope-sim >"$IMG/etc/hostname"
if [ -d /etc/xdg/pip ]; then mkdir -p "$IMG/etc/xdg" && cp -a /etc/xdg/pip "$IMG/etc/xdg/"; fi
if [ -f /etc/pip.conf ]; then cp -a /etc/pip.conf "$IMG/etc/pip.conf"; fi
# Picked up by update-ca-certificates when setup.sh installs ca-certificates (python3-pip depends on it).
mkdir -p "$IMG/usr/local/share/ca-certificates"
cp -a /usr/local/share/ca-certificates/. "$IMG/usr/local/share/ca-certificates/" 2>/dev/null || true
mkdir -p "$IMG/autograder/source"
unzip -q "$ZIP" -d "$IMG/autograder/source"            # unzip keeps the zip's Unix modes (run_autograder's x bit)
cp -p "$IMG/autograder/source/run_autograder" "$IMG/autograder/run_autograder"
for d in /opt/wheels /opt/pypi /opt/pypi-more; do if [ -d "$d" ]; then mkdir -p "$IMG$d"; fi; done

# Runs as PID 1 of fresh PID/mount/UTS/IPC namespaces: mounts die with it, and so does anything setup.sh or the
# grader leaves running. Args: ROOT LOWER (overlay lower dir, or "" to use ROOT itself) CWD CMD...
container_main() {
    local root=$1 lower=$2 cwd=$3; shift 3
    mount --make-rprivate /
    if [ -n "$lower" ]; then
        mkdir -p "$root.upper" "$root.work" "$root"
        mount -t overlay overlay -o "lowerdir=$lower,upperdir=$root.upper,workdir=$root.work" "$root"
    fi
    mount -t proc proc "$root/proc"                   # this PID namespace's /proc, as Docker gives
    mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
    mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"   # /dev/pts and /dev/shm come along
    local d; for d in /opt/wheels /opt/pypi /opt/pypi-more; do
        [ -d "$d" ] || continue
        mount --bind "$d" "$root$d" && mount -o remount,bind,ro "$root$d"
    done
    hostname gradescope-sim
    local envs=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root HOSTNAME=gradescope-sim) v
    for v in $(compgen -e); do case $v in PIP_*|PPO_GRADER_*|PPO_TORCH_INDEX) envs+=("$v=${!v}");; esac; done
    if [ -n "${SIM_SUBMISSION:-}" ]; then             # staff step, full root: stage the submission via the chroot
        chroot "$root" /bin/sh -ec 't=$1
            rm -rf /autograder/submission /autograder/results
            mkdir -p /autograder/submission /autograder/results
            mv /.sim-stage/exercises.py /autograder/submission/exercises.py
            if [ -n "$t" ] && [ -e /.sim-stage/target ] && [ ! -e "$t" ] && [ ! -L "$t" ]; then
                mkdir -p "$(dirname "$t")"; mv /.sim-stage/target "$t"; echo "(link target recreated at $t)"; fi
            rm -rf /.sim-stage' sh "${SIM_LINK_TARGET:-}"
    fi
    setpriv --bounding-set="$DOCKER_CAPS" --inh-caps=-all -- \
        chroot "$root" /usr/bin/env -i -C "$cwd" "${envs[@]}" "$@" </dev/null
}
in_container() {   # exec: run_child's pid is then unshare itself
    exec unshare --mount --pid --fork --kill-child --uts --ipc --propagation private \
        bash -c "$(declare -f container_main); container_main \"\$@\"" container_main "$@"
}

# 3. setup.sh, once, as Gradescope does when it builds the image.
echo "== setup.sh (bash /autograder/source/setup.sh, cwd /autograder/source)"
t0=$(now); rc=0
run_child in_container "$IMG" "" /autograder/source /bin/sh -c 'echo "capabilities (CapBnd): $(grep CapBnd /proc/self/status | cut -f2)"; exec bash /autograder/source/setup.sh' || rc=$?
echo "setup.sh: exit $rc, $(secs "$t0")"
[ "$rc" = 0 ] || { echo "setup.sh failed: Gradescope would not build this image; no submission was run"; exit 2; }

# 4. Each submission, in a fresh overlay over the built image.
fail=0 n=0
for sub in "$@"; do
    n=$((n + 1)); dir=$RUNS/$n
    stage=$dir/merged.upper/.sim-stage                 # the upper layer: appears in the container, not in the image
    mkdir -p "$stage"
    echo; echo "== submission $n/$#: $sub"
    [ -e "$sub" ] || [ -L "$sub" ] || { echo "no such file"; fail=1; continue; }
    cp -P "$sub" "$stage/exercises.py"        # a symlink goes in AS a symlink, with its own target
    link_target=
    if [ -L "$sub" ]; then
        link_target=$(readlink "$sub"); echo "symlink -> $link_target"
        # An absolute target is recreated inside the image unless it exists there (e.g. a link into /autograder/source).
        if [[ $link_target == /* ]] && [ -e "$sub" ]; then cp -L "$sub" "$stage/target"; else link_target=; fi
    fi
    t0=$(now); rc=0
    SIM_SUBMISSION=1 SIM_LINK_TARGET=$link_target run_child in_container "$dir/merged" "$IMG" /autograder /autograder/run_autograder \
        >"$dir/log" 2>&1 || rc=$?
    res=$dir/merged.upper/autograder/results/results.json
    echo "run_autograder: exit $rc, wall $(secs "$t0")"
    if [ "$rc" != 0 ] || [ ! -s "$res" ]; then
        fail=1; echo "-- run_autograder's output (last 40 lines):"; tail -n 40 "$dir/log"
    else
        grep -E '^\(link target' "$dir/log" || true
    fi
    [ -s "$res" ] || { echo "no /autograder/results/results.json"; continue; }
    python3 - "$res" <<'EOF' || fail=1
import json, sys
r = json.load(open(sys.argv[1]))
tests = r.get("tests", [])
print(f"score: {r.get('score')} (sum of max_score: {sum(t.get('max_score', 0) for t in tests)})")
for t in tests:
    print(f"  {t.get('score')}/{t.get('max_score')}  {t.get('status', '-'):7}  {t.get('name')}")
    if t.get("status") != "passed" and (t.get("output") or "").strip():   # why: the output's last line
        print(f"      {t['output'].strip().splitlines()[-1][:160]}")
print("-- output:"); print(r.get("output", "(none)"))
print("-- extra_data:"); print(json.dumps(r.get("extra_data"), indent=2, sort_keys=True))
EOF
done
exit "$fail"
