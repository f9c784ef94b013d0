"""Which names a call made the rank's own (``rank.namespace.RankNamespace.own_changes``): the
names it created or rebound, whatever else it did to the namespace; none when it changed no
global (the common case, told without a Python loop over the namespace, issue 45). Plain dicts,
no process: the namespace is a dict the rank's calls run in."""
import pytest

from notebook_launch.rank.namespace import RankNamespace


def namespace(**values):
    ns = RankNamespace({"__name__": "__main__", **values})
    return ns, ns.globals


@pytest.mark.parametrize("change, owned", [
    (lambda g: None, set()),
    (lambda g: g.__setitem__("b", [2]), {"b"}),                     # rebound in place
    (lambda g: g.__setitem__("new", 1), {"new"}),                   # created
    (lambda g: g.__delitem__("a"), set()),                          # deleted: nothing to own
    (lambda g: (g.pop("a"), g.__setitem__("a", g["c"])), {"a"}),   # deleted, then made again last
    (lambda g: g.__setitem__("a", g["a"]), set()),                  # the same object again
    (lambda g: (g.__setitem__("__doc__", "x"), g.__setitem__("n", 3)), {"n"}),   # dunders never owned
])
def test_a_call_owns_what_it_created_or_rebound(change, owned):
    ns, g = namespace(a=object(), b=[1], c="c")
    before = ns.snapshot()
    change(g)
    ns.own_changes(before)
    assert ns.owned == owned


def test_the_snapshot_holds_no_value():
    """A call that deletes a global must free it: the snapshot keeps ids, not the objects."""
    import gc
    import weakref

    class Big:
        pass

    ns, g = namespace(big=Big())
    gone = weakref.ref(g["big"])
    before = ns.snapshot()
    del g["big"]
    gc.collect()
    assert gone() is None
    ns.own_changes(before)
    assert ns.owned == set()
