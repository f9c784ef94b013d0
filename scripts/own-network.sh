#!/usr/bin/env bash
# Run a command in a network namespace of its own, with only loopback, where this shell can make one
# (root, unshare, iproute2); elsewhere run it as it is. Why: the lanes run side by side (and beside the
# cluster tests), and each lane's launches take the default port 29500 or a free port of the same
# network; a port found free by one lane was taken by another before its rank 0 listened, and a rank
# met the other lane's TCPStore ("DistNetworkError: Connection reset by peer", seen once in the Colab lane).
# Only the tests run here: a lane's venv build and install still reach the package registry.
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null 2>&1 && unshare --net -- ip link set lo up 2>/dev/null; then
  exec unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "$@"
fi
exec "$@"
