"""The profile language: what a pipeline profile says, and whether it may say it.

It owns the profile models and their validation, the expression grammar and conditions (no
arbitrary code), cron expressions, the step graph, ``verify`` rules, safe YAML, the profile a
job was started with, and the compiled plan of a job's steps. It imports ``service.platform``
and nothing else of ``service``.
"""
