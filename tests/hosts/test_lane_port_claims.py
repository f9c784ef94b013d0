"""The Colab lane runs in a chroot with its own /tmp but this machine's network. Launches claim their
rendezvous port with a lock file in the temp folder (notebook_launch.planning.net.PortReservation), so the chroot
sees this machine's claims folder (scripts/hosts-chroot.sh binds it in): a launch in the lane and one
beside it (the Kaggle lane, the cluster tests) then never both take the same free port."""
from __future__ import annotations

import os

import pytest

from notebook_launch.planning.net import PortReservation

pytestmark = pytest.mark.skipif(os.environ.get("NOTEBOOK_LAUNCH_HOST") != "colab",
                                reason="runs in the Colab lane (scripts/test-colab.sh), the one in a chroot")


def mount_points() -> set[str]:
    """Where something is mounted, as this process's root sees it (a bind mount of a folder of the same
    file system is invisible to ``os.path.ismount``)."""
    with open("/proc/self/mountinfo") as table:
        return {line.split()[4] for line in table}


def test_the_chroot_shares_this_machines_port_claims():
    assert os.path.realpath(PortReservation.FOLDER) in mount_points(), (
        f"{PortReservation.FOLDER} is the chroot's own: its launches' port claims are unseen beside it")
    claim = PortReservation.claim(65000)
    assert claim is not None
    claim.release()
