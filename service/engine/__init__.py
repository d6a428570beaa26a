"""The engine: how a job runs, from its submission to its last status.

It owns jobs and their step runs, claims and leases, checkpoints, the runner that calls an
action, settling a job, approval gates, loops and their rounds, fan-out shards, compensations
(the saga), reruns, the sweeper of lapsed leases, worker heartbeats, the job event log and the
process runtime of a worker. It imports ``service.platform``, ``service.language``,
``service.actions`` and ``service.catalogue``; never the triggers that start jobs.

A step's run reads claim, attempt, record, and its modules stand in that order so that a
maintainer follows it down without climbing back: ``steps`` (the shapes they hand each other)
and ``leases`` under everything, then ``checkpoints`` (the only writer of one, and its
reads), ``settle`` and ``completion`` (the other ways a step or job settles), ``inputs`` (what
a held step runs with), ``claims``, and the ``runner`` over them.
"""
