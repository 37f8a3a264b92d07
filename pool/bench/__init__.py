"""``pool bench``: the standard benchmark set, with its peers, as ratios
(:mod:`pool.bench.suite`; the pools in :mod:`pool.bench.pools`, the
figures in :mod:`pool.bench.measures`, the gRPC floor in
:mod:`pool.bench.floor`, which runs as a process of its own and so is not
imported here).
"""
