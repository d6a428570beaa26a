"""flowbeat beside its peers: ``python -m bench.peers`` (see ``__main__``)."""
