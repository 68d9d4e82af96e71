#!/bin/sh
# fresh-root.sh - runs the README's two commands (sh tools/quickstart.sh,
# sh tools/test.sh) as a new user would: in a minimal Debian 12 root
# (debootstrap --variant=minbase bookworm) that holds only what
# tools/setup-debian.sh installs, on a clean clone of this repository's HEAD
# commit (not the working tree). A package the build or the tests need but
# setup-debian.sh does not install fails here, where CI machines that have it
# from elsewhere stay green. Run it before resolving an issue that changes
# dependencies.
#
#   sudo sh tools/fresh-root.sh [-r ROOT] [-d] [QUICKSTART-ARGS...]
#
#   -r ROOT  use ROOT (or $WEFT_FRESH_ROOT): debootstrap only if it holds no
#            root yet, else reuse it (saves the debootstrap; packages from
#            earlier runs stay, so prove a dependency change on a new root)
#   -d       delete the root at the end (default: keep it, print its path)
#   QUICKSTART-ARGS go to quickstart.sh, e.g. -e 1M for a short sweep.
#   WEFT_TEST_SANITIZE, WEFT_TEST_TSAN, WEFT_TEST_FUZZ, WEFT_FUZZ_SECONDS and
#   WEFT_NP pass through to the commands when set; nothing else does.
#
# The mirror is the one this machine's apt uses (/etc/apt/sources.list or
# /etc/apt/sources.list.d/*.sources); the root gets the same bookworm
# entries. Needs root, network to that mirror, and about 2 GiB under /var/tmp.
# Prints each command's exit status; exits non-zero if either failed.
set -eu
usage() { sed -n '11,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
root=${WEFT_FRESH_ROOT:-}
delete=0
while [ $# -gt 0 ]; do
  case $1 in
    -r) [ $# -ge 2 ] || usage; root=$2; shift 2 ;;
    -d) delete=1; shift ;;
    -h | --help) usage ;;
    --) shift; break ;;
    *) break ;;
  esac
done
say() { echo "fresh-root: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot, mounts): sudo sh $0"; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$repo" rev-parse HEAD)

# The machine's bookworm apt entries as one-line "deb URI SUITE COMPONENTS",
# from both the deb822 .sources files and the classic list format.
apt_entries() {
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled != "no")
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
            if (s[j] ~ /^bookworm/) print "deb " u[i] " " s[j] " " comps
        types = ""; nu = ns = 0; comps = ""; enabled = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "") }
      key == "types" { types = $0 }
      key == "uris" { nu = split($0, u, " ") }
      key == "suites" { ns = split($0, s, " ") }
      key == "components" { comps = $0 }
      key == "enabled" { enabled = tolower($0) }
      END { flush() }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # drop "[ options ]" (keyrings live outside the root; the root trusts
    # Debian's archive keys from its own debian-archive-keyring)
    sed -n 's/\[[^]]*\]//; s/^[ \t]*deb[ \t]\{1,\}\([^ \t]*\)[ \t]\{1,\}\(bookworm[^ \t]*\)[ \t]\{1,\}/deb \1 \2 /p' "$f"
  done
}
entries=$(apt_entries | awk '!seen[$0]++')
mirror=$(echo "$entries" | awk '$3 == "bookworm" { print $2; exit }')
[ -n "$mirror" ] || { say "no bookworm entry in this machine's apt sources to take the mirror from"; exit 1; }

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on this machine"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

[ -n "$root" ] || root=$(mktemp -d /var/tmp/weft-fresh-root.XXXXXX)
mkdir -p "$root"
chmod 755 "$root"
root=$(cd "$root" && pwd)
case $root in /) say "refusing / as the root"; exit 2 ;; esac
# one run per root at a time (the lock is released when this shell exits)
exec 9>"$root.lock"
flock -n 9 || { say "another run is using $root"; exit 1; }
if grep -q " ${root}[/ ]" /proc/self/mountinfo; then
  say "$root has mounts (a run that was killed): umount -R $root first"
  exit 1
fi

pids_in_root() { # processes whose root directory is the chroot (only ours run there)
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && echo "${p#/proc/}"
  done
  return 0
}
cleanup() {
  rc=$?
  trap - EXIT INT TERM
  set +e
  for p in $(pids_in_root); do kill -9 "$p" 2>/dev/null; done
  # everything was mounted under the root's bind mount: one recursive umount
  # (ip netns mounts under /run/netns included), lazily if something holds on
  if grep -q " $root " /proc/self/mountinfo; then
    umount -R "$root" 2>/dev/null || umount -R -l "$root"
  fi
  if grep -q " ${root}[/ ]" /proc/self/mountinfo; then
    say "could not unmount everything under $root; see /proc/self/mountinfo"
  elif [ "$delete" = 1 ]; then
    rm -rf --one-file-system "$root" && say "removed $root"
  else
    say "root kept: $root (reuse: sh tools/fresh-root.sh -r $root; remove, when no run uses it: rm -rf --one-file-system $root)"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -x "$root/usr/bin/apt-get" ]; then
  say "debootstrap --variant=minbase bookworm $root $mirror"
  t0=$(date +%s)
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    { say "debootstrap failed, see $root.debootstrap.log"; exit 1; }
  say "debootstrap took $(($(date +%s) - t0)) s"
else
  say "reusing the root in $root"
fi
echo "$entries" >"$root/etc/apt/sources.list"
rm -f "$root"/etc/apt/sources.list.d/*
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# as Debian's installer writes it: the machine's own name resolves (torchrun
# hands it to the ranks as MASTER_ADDR)
[ -s "$root/etc/hosts" ] ||
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
# no services start from package scripts inside the root
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# A clean clone of HEAD's commit, made anew on every run.
rm -rf "$root/root/weft"
git clone -q --no-checkout --no-hardlinks "$repo" "$root/root/weft"
git -C "$root/root/weft" -c advice.detachedHead=false checkout -q --detach "$commit"
say "clone of $commit in $root/root/weft"

# Mounts. The root is bind-mounted onto itself and made private first, so
# nothing mounted inside propagates out, "mount --make-rprivate /" inside
# works (tests/test_small_shm.sh), and one umount -R undoes it all.
mount --bind "$root" "$root"
mount --make-rprivate "$root"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"           # hwloc reads the topology here
# /dev is the root's own tmpfs, never a bind of the host's /dev: an rm -rf of
# the root while it is mounted (a second user making it fresh) would go
# through such a bind and delete the host's device nodes (it happened). Each
# host node is bound onto a file of its own, where rm fails with EBUSY.
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for node in null zero full random urandom tty; do
  : >"$root/dev/$node"
  mount --bind "/dev/$node" "$root/dev/$node"
done
if [ -d /dev/infiniband ]; then # real HCAs, for the verbs tests on a host that has them
  mkdir "$root/dev/infiniband"
  for node in /dev/infiniband/*; do
    : >"$root/dev/infiniband/${node##*/}"
    mount --bind "$node" "$root/dev/infiniband/${node##*/}"
  done
fi
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm" # the ranks' segments, private to the root
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"      # ip netns add makes /run/netns here
mkdir -p "$root/run/lock" "$root/run/netns"

# Runs one command in the root's clone: root user, clean environment.
run_in_root() { # CMD ARGS...: sh -c CMD inside the root's clone
  cmd=$1
  shift
  # $pass: NAME=VALUE words checked below (no spaces or globs in them)
  # shellcheck disable=SC2086
  env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    $pass chroot "$root" /bin/sh -c 'cd /root/weft && '"$cmd"' "$@"' sh "$@" 9>&-
}
pass=""
for v in WEFT_TEST_SANITIZE WEFT_TEST_TSAN WEFT_TEST_FUZZ WEFT_FUZZ_SECONDS WEFT_NP; do
  val=$(eval "printf %s \"\${$v-}\"")
  case $val in *[!A-Za-z0-9._-]*) say "ignoring $v: unexpected characters"; continue ;; esac
  eval "[ -n \"\${$v+set}\" ]" && pass="$pass $v=$val"
done

t0=$(date +%s)
say "== sh tools/quickstart.sh${*:+ $*}"
set +e
run_in_root "sh tools/quickstart.sh" "$@"
q=$?
say "sh tools/quickstart.sh${*:+ $*}: exit $q ($(($(date +%s) - t0)) s)"
t0=$(date +%s)
say "== sh tools/test.sh${pass:+ (with$pass)}"
run_in_root "sh tools/test.sh"
t=$?
say "sh tools/test.sh: exit $t ($(($(date +%s) - t0)) s)"
set -e
say "quickstart exit $q, test exit $t"
[ "$q" = 0 ] && [ "$t" = 0 ]
