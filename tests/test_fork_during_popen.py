"""A rank forked while another thread of the notebook starts a process of ours (the orphan keeper,
a spawned rank, py-spy) must not make that start wait for the rank.

A process forked without exec while a Popen waits on its error pipe inherits the pipe's write end,
and the Popen reads until every write end is closed: it returned only when the rank ended. Two
launches in two threads of one notebook (test_concurrent_launches) then waited on each other
forever, the first holding the keeper's lock for every later launch of the process. The race is
made certain here: the keeper's Popen, once its error pipe exists, lets the other thread fork a
rank and waits a while for that fork; the rank lives until the notebook, after the Popen, lets it
end. With the fork and our Popens taking turns (``fork_locks.no_fork_during_exec``) the fork waits
for the Popen instead; without, the two wait on each other."""
import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, os, subprocess, threading
    from notebook_launch.engines.local.fork_thread import fork_from_clean_thread
    from notebook_launch.process import leftovers

    popen_has_its_pipe, rank_forked = threading.Event(), threading.Event()
    release_r, release_w = os.pipe()   # the rank lives until the notebook writes here
    real_fork_exec = subprocess._fork_exec

    def fork_exec_after_a_rank_forks(*args):
        popen_has_its_pipe.set()
        rank_forked.wait(3)   # the rank's fork gets its chance, inside Popen's window
        return real_fork_exec(*args)

    subprocess._fork_exec = fork_exec_after_a_rank_forks
    ranks = []

    def fork_a_rank():
        popen_has_its_pipe.wait()
        def rank():
            os.read(release_r, 1)
            os._exit(0)
        ranks.append(fork_from_clean_thread(rank))
        rank_forked.set()

    forker = threading.Thread(target=fork_a_rank)
    forker.start()
    keeper = leftovers._start_keeper()   # the keeper's Popen, beside the fork: waits for the rank if it holds the pipe
    subprocess._fork_exec = real_fork_exec
    os.write(release_w, b"x")            # only now may the rank end
    forker.join()
    print(json.dumps({"keeper_started": keeper is not None, "rank_status": os.waitpid(ranks[0], 0)[1]}))
""")



def test_a_rank_forked_during_our_popen_does_not_hold_it_up():
    # Without the fix the Popen waits for the rank and the rank for the notebook: the run never ends.
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"keeper_started": True, "rank_status": 0}, (outcome, done.stderr)
