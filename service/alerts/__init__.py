"""Alerts: an owner's rules, matched against the event log, schedules and queues by the beat
leader into an outbox in PostgreSQL, and sent from it by a worker as signed webhooks."""
