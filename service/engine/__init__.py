"""The engine: how a job runs, from its submission to its last status.

It owns jobs and their step runs, claims and leases, checkpoints, the runner that calls an
action, settling a job, approval gates, loops and their rounds, fan-out shards, compensations
(the saga), reruns, the sweeper of lapsed leases, worker heartbeats, the job event log and the
process runtime of a worker. It imports ``service.platform``, ``service.language``,
``service.actions`` and ``service.catalogue``; never the triggers that start jobs.
"""
