"""The platform: what every other concern stands on, and which knows none of them.

It owns the settings and constants, the error catalogue, the clock, the database (engine,
sessions, the tables and the statuses their rows carry, Alembic migrations, the LISTEN
connection), the embedded PostgreSQL and Redis servers, API keys, outbound HTTP (egress), rate
limits, logs and metrics. It imports nothing else of ``service``.
"""
