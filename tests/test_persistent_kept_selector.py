"""A pool's calls share one selector over its ranks' fds (``persistent.call.KeptSelector``,
issue 45): registered once, lent to each call's watcher, never lent for other ranks than it
was filled for, and closed with the ranks, so no fd outlives the pool. Real forked ranks."""
import os
import signal

import pytest

from helpers.fd_helpers import fd_links
from helpers.processes import children, running
from helpers.waiting import ended, wait_for
from notebook_launch import start_ranks
from notebook_launch.planning.net import free_port

pytestmark = pytest.mark.timeout(180)
WAIT = 60


def rank():
    return int(os.environ["RANK"])


@pytest.fixture
def fds_before(log_dir):
    """This process's fds once one pool has come and gone (the first pool of a process opens
    a socket it keeps for the process's life)."""
    with start_ranks(1, ui="none", log_dir=log_dir + "-warm", use_port=free_port()) as warm:
        warm.run(rank)
    return sorted(fd_links())


def kept(ranks):
    """The selector the pool keeps between calls (None: none kept now)."""
    return ranks._life.selector._selector


def test_calls_share_one_selector_and_fresh_ranks_get_a_new_one(log_dir, fds_before):
    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        assert ranks.run(rank) == [0, 1]
        first = kept(ranks)
        assert first is not None
        assert ranks.run(rank) == [0, 1] and kept(ranks) is first   # lent and given back whole
        pid = ranks.pids[0]
        os.kill(pid, signal.SIGKILL)   # between calls: the next call runs on fresh ranks
        assert wait_for(lambda: ended(pid), WAIT)
        assert ranks.run(rank, timeout=WAIT) == [0, 1] and ranks.restarts == 1
        second = kept(ranks)
        assert second is not None and second is not first
        with pytest.raises(ValueError, match="closed"):
            first.select(0)   # the old ranks' selector was closed with them
        assert set(second.get_map()) >= {p.sentinel for p in ranks.transport.processes}
    assert kept(ranks) is None
    assert sorted(fd_links()) == fds_before
    assert running(children()) == []


def die():
    os._exit(3)


def test_a_rank_that_ends_during_a_call_leaves_no_selector_kept(log_dir, fds_before):
    """Its exit unregistered its sentinel: that selector is closed, never lent again."""
    with start_ranks(2, ui="none", log_dir=log_dir, use_port=free_port()) as ranks:
        assert ranks.run(rank) == [0, 1]
        with pytest.raises(Exception, match="exit"):
            ranks.run(die, timeout=WAIT)
        assert kept(ranks) is None
        assert ranks.run(rank, timeout=WAIT) == [0, 1] and ranks.restarts == 1
        assert kept(ranks) is not None
    assert sorted(fd_links()) == fds_before
    assert running(children()) == []
