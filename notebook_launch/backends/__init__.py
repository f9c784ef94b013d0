"""Ways of starting ranks, behind one narrow interface (see ``base.Backend``)."""
