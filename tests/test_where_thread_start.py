"""The where-thread starts without ``Thread.start`` waiting for it to run (issue 45): it is still a
named, running thread of ``threading``'s (the stacks shown leave it out by name), and a question
asked before it ran is answered once it does."""
import threading

from notebook_launch.rank.reports.where_thread import start_unwaited


def test_a_thread_started_unwaited_runs_and_is_known_by_its_name():
    ran, go = threading.Event(), threading.Event()

    def answer() -> None:
        go.wait(30)
        ran.set()
    thread = threading.Thread(target=answer, daemon=True, name="notebook_launch-where")
    start_unwaited(thread)
    go.set()   # asked after start returned, whether or not the thread had run yet
    assert ran.wait(30)
    thread.join(30)
    assert not thread.is_alive()
    assert thread.name == "notebook_launch-where"


def test_its_started_flag_waits_as_usual_after_the_start():
    release = threading.Event()
    thread = threading.Thread(target=release.wait, args=(30,), daemon=True)
    start_unwaited(thread)
    assert getattr(thread, "_started").wait(30)   # noqa: B009  (a later wait waits for the thread's own start)
    assert thread.is_alive() and thread in threading.enumerate()
    release.set()
    thread.join(30)
