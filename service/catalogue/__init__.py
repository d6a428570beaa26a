"""The catalogue: what is kept between jobs.

It owns saved pipelines and their versions, imports from a URL or file, the dependency
trigger edges among saved pipelines, result diffs between runs and the notices sent on new
items, and retention of old runs. It imports ``service.platform``, ``service.language`` and
``service.actions``; never the engine that runs jobs, nor the triggers that start them.
"""
