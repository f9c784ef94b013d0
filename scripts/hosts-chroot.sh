#!/usr/bin/env bash
# A newer Python than this machine's Debian (bookworm: 3.11) has, in a Debian chroot: Python 3.13 from trixie for
# the Colab lane (scripts/test-colab.sh; Colab runs 3.13), Python 3.14 from sid for the Python 3.14 lane
# (scripts/test-py314.sh; 3.14 starts multiprocessing with forkserver by default). HOSTS_SUITE (default trixie)
# and HOSTS_PYTHON_PACKAGES (default python3,python3-venv,python3-dev) choose; set them before sourcing.
# Sourced, not run: it defines the functions below for scripts/test-host.sh.
#
#   hosts_chroot_build   debootstrap the chroot once (about 2 minutes), cached at $HOSTS_ROOT outside the clone
#                        (/var/cache/notebook_launch/trixie; CI runs in a fresh clone on the same machine, so a
#                        re-run finds it); rebuilt only when HOSTS_CHROOT_RECIPE below changes.
#   hosts_chroot_mount   bind-mount /proc, /dev, /dev/pts, /dev/shm, /sys, pip's cache, /opt (read-only: the
#                        machine's local wheels that the pip configuration names), the checkout at /repo and
#                        this machine's port claims folder (its launches and the chroot's see each other's);
#                        registers hosts_chroot_umount on EXIT so no mount outlives the lane.
#   hosts_chroot_run     run a command inside, in /repo, with this environment (PIP_* variables included).
#
# Needs root (debootstrap, mount, chroot). One lane at a time holds the chroot (flock), so two lanes started
# together wait for each other instead of unmounting each other's /proc.
set -euo pipefail

HOSTS_CACHE=${NOTEBOOK_LAUNCH_HOSTS_CACHE:-/var/cache/notebook_launch}
HOSTS_SUITE=${HOSTS_SUITE:-trixie}
HOSTS_PYTHON_PACKAGES=${HOSTS_PYTHON_PACKAGES:-python3,python3-venv,python3-dev}
HOSTS_ROOT=$HOSTS_CACHE/$HOSTS_SUITE
# Bump when the package list or the mirror changes: the chroot is rebuilt.
HOSTS_CHROOT_RECIPE="$HOSTS_SUITE minbase ${HOSTS_PYTHON_PACKAGES//,/ } ca-certificates v1"
HOSTS_MOUNTED=()

_hosts_mirror() {
  # The Debian mirror this machine's apt uses (its deb822 or one-line sources), else Debian's own.
  local uri
  uri=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list 2>/dev/null | grep -o -E 'https?://[^ ]*/debian/?' | head -n1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

hosts_chroot_build() {
  if [ "$(id -u)" != 0 ]; then
    echo "hosts-chroot: the $HOSTS_SUITE chroot needs root (debootstrap, mount, chroot)" >&2
    return 1
  fi
  mkdir -p "$HOSTS_CACHE"
  if [ -f "$HOSTS_ROOT/.recipe" ] && [ "$(cat "$HOSTS_ROOT/.recipe")" = "$HOSTS_CHROOT_RECIPE" ]; then
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  local tmp=$HOSTS_ROOT.building mirror
  mirror=$(_hosts_mirror)
  rm -rf "$tmp"
  echo "hosts-chroot: debootstrap $HOSTS_SUITE from $mirror (about 2 minutes, once)" >&2
  local attempt log=$HOSTS_CACHE/debootstrap-$HOSTS_SUITE.log
  for attempt in 1 2 3; do
    if debootstrap --variant=minbase --include="$HOSTS_PYTHON_PACKAGES,ca-certificates" \
         "$HOSTS_SUITE" "$tmp" "$mirror" >"$log" 2>&1; then
      break
    fi
    if [ "$attempt" = 3 ]; then
      echo "hosts-chroot: debootstrap failed 3 times; the end of $log:" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    echo "hosts-chroot: debootstrap try $attempt failed; again in $((attempt * 30)) s" >&2
    rm -rf "$tmp"; sleep $((attempt * 30))
  done
  mkdir -p "$tmp/repo" "$tmp/root/.cache/pip" "$tmp/opt" "$tmp/srv"
  echo "$HOSTS_CHROOT_RECIPE" >"$tmp/.recipe"
  rm -rf "$HOSTS_ROOT"
  mv "$tmp" "$HOSTS_ROOT"
}

_hosts_bind() {  # _hosts_bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  HOSTS_MOUNTED+=("$2")
  if [ "${3:-}" = ro ]; then
    mount -o remount,bind,ro "$2"
  fi
}

hosts_chroot_mount() {
  local repo=$1
  exec 8>"$HOSTS_CACHE/chroot-$HOSTS_SUITE.lock"   # two chroots never share a mount
  flock 8
  trap hosts_chroot_umount EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # What resolves names and which certificates and pip settings apply: the same as on this machine.
  cp -L /etc/resolv.conf /etc/hosts "$HOSTS_ROOT/etc/"
  # pip's configuration folders whole (a pip.conf may name a constraints file beside it).
  local f
  for f in /etc/xdg/pip /root/.config/pip /root/.pip; do
    if [ -d "$f" ]; then
      rm -rf "${HOSTS_ROOT:?}$f"; mkdir -p "$HOSTS_ROOT$(dirname "$f")"; cp -rL "$f" "$HOSTS_ROOT$f"
    fi
  done
  for f in /etc/pip.conf "${PIP_CONFIG_FILE:-}" "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" "${REQUESTS_CA_BUNDLE:-}"; do
    if [ -n "$f" ] && [ -f "$f" ]; then
      mkdir -p "$HOSTS_ROOT$(dirname "$f")"
      cp -L "$f" "$HOSTS_ROOT$f"
    fi
  done
  mount -t proc proc "$HOSTS_ROOT/proc"; HOSTS_MOUNTED+=("$HOSTS_ROOT/proc")
  _hosts_bind /sys "$HOSTS_ROOT/sys"
  _hosts_bind /dev "$HOSTS_ROOT/dev"
  _hosts_bind /dev/pts "$HOSTS_ROOT/dev/pts"
  _hosts_bind /dev/shm "$HOSTS_ROOT/dev/shm"
  # pip's cache: what one lane downloaded (the nvidia-* wheels, torch for 3.13) the next lane and the next
  # run find on disk.
  mkdir -p /root/.cache/pip
  _hosts_bind /root/.cache/pip "$HOSTS_ROOT/root/.cache/pip"
  # /opt holds this machine's local wheels and indexes that pip's configuration names (absent elsewhere).
  _hosts_bind /opt "$HOSTS_ROOT/opt" ro
  _hosts_bind "$repo" "$HOSTS_ROOT/repo"
  # The port claims of this machine's launches (notebook_launch.planning.net.PortReservation: a lock file per port in
  # the temp folder). The chroot has its own /tmp but this machine's network: without this, a launch in the
  # chroot and one beside it (another lane) could both find a port free and one fail with EADDRINUSE.
  local ports="${TMPDIR:-/tmp}/notebook_launch-ports"
  mkdir -p -m 1777 "$ports"
  _hosts_bind "$ports" "$HOSTS_ROOT/tmp/notebook_launch-ports"
}

hosts_chroot_umount() {
  local i target
  for ((i = ${#HOSTS_MOUNTED[@]} - 1; i >= 0; i--)); do
    target=${HOSTS_MOUNTED[$i]}
    umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || \
      echo "hosts-chroot: could not unmount $target" >&2
  done
  HOSTS_MOUNTED=()
}

hosts_chroot_run() {
  # HOME=/root: pip's cache and config; TMPDIR inside the chroot's own /tmp.
  chroot "$HOSTS_ROOT" /usr/bin/env HOME=/root TMPDIR=/tmp PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c 'cd /repo && exec "$@"' bash "$@" 8>&-   # the lock stays with this shell, not a leftover process
}
