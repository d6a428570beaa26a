"""The triggers: what starts jobs without a person asking.

It owns cron schedules (saved, fired exactly once per fire time, overlap and catch-up, cancelled
when overdue), webhooks (bound to a pipeline, HMAC-signed deliveries) and dependency triggers
(a pipeline started by another's success or new items). It may import every other concern of
``service`` but the CLI; none of them imports it.
"""
