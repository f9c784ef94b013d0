"""The notebook side of a rank's display() calls (display.display_relay) with a recording
publisher and a manual clock, and the display_ranks argument."""
import numpy as np
import pytest

from notebook_launch import LaunchArgumentError, notebook_launcher
from notebook_launch.display import display_relay
from notebook_launch.display.display_relay import RankDisplays


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def relay(ranks=frozenset({0})):
    published, clock = [], Clock()
    displays = RankDisplays(ranks, "run", publish=lambda data, md, did, update: published.append(
        (did, data.get("text/html", data.get("text/plain")), update)), clock=clock)
    return displays, published, clock


def show(html, display_id=None, update=False):
    return {"op": "display", "data": {"text/html": html}, "metadata": {}, "display_id": display_id,
            "update": update}


def test_new_outputs_appear_at_once_and_updates_are_coalesced_to_the_latest():
    displays, published, clock = relay()
    displays.on_event(0, show("step 0", display_id="bar"))
    assert published == [("nl-run-0", "step 0", False)]
    for step in range(1, 100):
        displays.on_event(0, show(f"step {step}", display_id="bar", update=True))
    displays.pump()
    clock.now += 1
    displays.on_event(0, show("step 100", display_id="bar", update=True))
    displays.pump()
    displays.pump()   # nothing changed since
    assert published == [("nl-run-0", "step 0", False), ("nl-run-0", "step 99", True),
                         ("nl-run-0", "step 100", True)]


def test_the_final_content_is_published_even_within_the_throttle_interval():
    displays, published, _ = relay()
    displays.on_event(0, show("a", display_id="x"))
    displays.pump()
    displays.on_event(0, show("b", display_id="x", update=True))
    displays.pump()   # too soon after the last publish
    assert published[-1] == ("nl-run-0", "a", False)
    displays.close()
    assert published[-1] == ("nl-run-0", "b", True)


def test_clear_output_empties_the_ranks_own_outputs_and_a_redisplay_reuses_them():
    displays, published, _ = relay()
    displays.on_event(0, show("first"))
    displays.on_event(0, show("second", display_id="d"))
    for i in range(50):   # the clear_output(wait=True); display(...) loop
        displays.on_event(0, {"op": "clear", "wait": True})
        displays.on_event(0, show(f"frame {i}"))
    displays.close()
    new_outputs = [p for p in published if not p[2]]
    assert [p[0] for p in new_outputs] == ["nl-run-0", "nl-run-1"]   # the cell never grew
    final = {}
    for did, text, _ in published:
        final[did] = text
    assert final == {"nl-run-0": "frame 49", "nl-run-1": ""}
    displays.on_event(0, show("late", display_id="d", update=True))   # "d" was cleared away
    displays.close()
    assert published[-1][1] != "late"


def test_only_the_chosen_ranks_are_shown():
    displays, published, _ = relay(frozenset({1}))
    displays.on_event(0, show("from rank 0"))
    displays.on_event(1, show("from rank 1"))
    assert [text for _, text, _ in published] == ["from rank 1"]
    everyone, published_all, _ = relay(None)
    everyone.on_event(0, show("a"))
    everyone.on_event(3, show("b"))
    assert [text for _, text, _ in published_all] == ["a", "b"]


def test_a_flood_of_new_outputs_is_bounded_and_counted(capsys):
    displays, published, clock = relay()
    for i in range(1000):
        displays.on_event(0, show(f"plot {i}"))
    assert len(published) == display_relay.NEW_OUTPUTS_BURST
    clock.now += 1
    displays.on_event(0, show("after a second"))
    assert published[-1][1] == "after a second"
    displays.close()
    dropped = 1000 - display_relay.NEW_OUTPUTS_BURST
    assert f"{dropped} display() outputs of rank 0 were not shown" in capsys.readouterr().out


@pytest.mark.parametrize("value, says", [
    ("bogus", "display_ranks='bogus' is not valid"),
    ([0, 1.5], "1.5 is not a rank"),
    ([-1], "-1 is not a rank"),
    ([], "display_ranks=[] would hide"),
    (True, "True is not a rank"),
    ([5], "display_ranks names rank 5, but this run has 2 ranks"),
])
def test_bad_display_ranks_are_refused_before_anything_starts(value, says, log_dir):
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(print, num_processes=2, display_ranks=value, log_dir=log_dir)
    assert says in str(caught.value)


def test_display_ranks_take_any_integral_number_and_all(log_dir):
    assert notebook_launcher(int, num_processes=2, display_ranks=np.int64(1), log_dir=log_dir) == [0, 0]
    assert notebook_launcher(int, num_processes=2, display_ranks="all", log_dir=log_dir) == [0, 0]
